"""The SQS, SNS, EventBridge and Kinesis relays' downstreams on a moto server, made as
infra/sam-env.json names them, and read back through boto3: the queue itself;
a queue subscribed to the topic; a queue that a rule on the bus targets; the stream. Shared
by the in-process tests of events/ (tests/e2e) and the Lambda container tests
(tests/sam_local), which point the relay at the same moto server."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from support.template import ROOT

#: The account moto creates everything in, and the region of infra/sam-env.json's names.
ACCOUNT = "123456789012"
REGION = "us-east-1"
#: What infra/sam-env.json names: the queue (by URL), the topic (by ARN), the bus.
SAM_ENV = json.loads((ROOT / "infra" / "sam-env.json").read_text(encoding="utf-8"))
QUEUE_NAME = SAM_ENV["RelaySqsFunction"]["OUTBOX_SQS_QUEUE_URL"].rsplit("/", 1)[1]
TOPIC_ARN = SAM_ENV["RelaySnsFunction"]["OUTBOX_SNS_TOPIC_ARN"]
BUS = SAM_ENV["RelayEventBridgeFunction"]["OUTBOX_EVENTBRIDGE_BUS"]
STREAM_ARN = SAM_ENV["RelayKinesisFunction"]["OUTBOX_KINESIS_STREAM"]
SOURCE = "outbox.relay"
AWS_CHANNELS = ("sqs", "sns", "eventbridge", "kinesis")


def client(service: str, endpoint_url: str) -> Any:
    import boto3

    return boto3.client(service, endpoint_url=endpoint_url, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@dataclass
class Received:
    """One message as its reader got it: the payload, and the message id the relay sent with it."""

    payload: Any
    message_id: str
    type: str


class Downstream:
    """`channel`'s downstream on the moto server at `endpoint_url` (moto reset before, by the caller)."""

    def __init__(self, channel: str, endpoint_url: str) -> None:
        self.channel = channel
        if channel == "kinesis":  # read with GetRecords, straight from the stream
            from support.aws_harness import StreamReader

            kinesis = client("kinesis", endpoint_url)
            name = STREAM_ARN.rsplit("/", 1)[1]
            if name not in kinesis.list_streams()["StreamNames"]:
                kinesis.create_stream(StreamName=name, ShardCount=1)
            self.stream = StreamReader(kinesis, name)
            return
        self.sqs = client("sqs", endpoint_url)
        if channel == "sqs":
            self.queue_url = self.sqs.create_queue(QueueName=QUEUE_NAME)["QueueUrl"]
            return
        # SNS and EventBridge are read through a queue of their own: subscribed, or a rule's target.
        self.queue_url = self.sqs.create_queue(QueueName=f"{channel}-reader")["QueueUrl"]
        queue_arn = self.sqs.get_queue_attributes(QueueUrl=self.queue_url,
                                                  AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        if channel == "sns":
            sns = client("sns", endpoint_url)
            topic = sns.create_topic(Name=TOPIC_ARN.rsplit(":", 1)[1])["TopicArn"]
            assert topic == TOPIC_ARN, (topic, TOPIC_ARN)
            sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
        else:
            events = client("events", endpoint_url)
            if BUS != "default" and not events.list_event_buses(NamePrefix=BUS)["EventBuses"]:
                events.create_event_bus(Name=BUS)
            # The relay's source when a message names none (the template's EventBridgeSource default).
            events.put_rule(Name="outbox-reader", EventBusName=BUS, EventPattern=json.dumps({"source": [SOURCE]}))
            events.put_targets(Rule="outbox-reader", EventBusName=BUS, Targets=[{"Id": "reader", "Arn": queue_arn}])

    def receive(self, expected: int, attempts: int = 10) -> list[Received]:
        """Every message the reader's queue holds, up to `expected` (long polls, each up to a second)."""
        out: list[Received] = []
        if self.channel == "kinesis":
            return [Received(r["payload"], r["id"], r["type"]) for r in self.stream.records()][:expected]
        for _ in range(attempts):
            if len(out) >= expected:
                break
            reply = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                             MessageAttributeNames=["All"])
            for m in reply.get("Messages", []):
                out.append(self._read(m))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=m["ReceiptHandle"])
        return out

    def _read(self, m: dict[str, Any]) -> Received:
        if self.channel == "sqs":
            attributes = {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()}
            return Received(json.loads(m["Body"]), attributes["outbox-message-id"], attributes["outbox-type"])
        envelope = json.loads(m["Body"])
        if self.channel == "sns":
            attributes = {k: v["Value"] for k, v in envelope.get("MessageAttributes", {}).items()}
            return Received(json.loads(envelope["Message"]), attributes["outbox-message-id"],
                            attributes["outbox-type"])
        detail = dict(envelope["detail"])
        return Received(detail, detail.pop("outbox-message-id"), envelope["detail-type"])
