"""What the SQS, SNS and EventBridge contract harnesses share (tests/support/channel_harnesses.py):
moto in server mode, reached over HTTP as AWS is, and faults injected into the publisher's
own client.

moto never fails an entry, so a fault is the service's own per-entry answer for the
entries aimed at it (by their type): a botocore hook takes them out of the request and
adds them to the reply's failures, as the service reports a partial batch failure; when
every entry of a call is aimed at a fault, nothing is sent and the reply is all failures.
A cut downstream refuses the connection before anything is sent.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from typing import Any, Callable, Iterator

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError

REGION = "us-east-1"
_names = itertools.count()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto in server mode for the whole session; its URL. Each test makes its own queue, topic
    or bus, so tests share the server and not its state."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    yield "http://127.0.0.1:%d" % server.get_host_and_port()[1]
    server.stop()


@pytest.fixture
def aws_endpoint(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every AWS client of this test talks to the moto server, with dummy credentials."""
    for key in list(os.environ):
        if key.startswith("AWS_ENDPOINT_URL") or key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(key)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
                       "AWS_ENDPOINT_URL": moto_server}.items():
        monkeypatch.setenv(key, value)
    return moto_server


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def aws_client(service: str, endpoint: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION)


class Faults:
    """The per-entry faults of one harness: which types fail, with which answer."""

    def __init__(self, service: str, operation: str, entries_param: str, positional: bool,
                 type_of: Callable[[dict[str, Any]], str], reply: tuple[str, str] = ("Entries", "FailedEntryCount")
                 ) -> None:
        self.service, self.operation, self.entries_param = service, operation, entries_param
        self.positional, self.type_of = positional, type_of
        #: A positional reply's list of answers and its failure count (EventBridge's; Kinesis's differ).
        self.reply_entries, self.reply_count = reply
        self.answers: dict[str, tuple[str, bool]] = {}  # type -> (code, sender fault)
        self.down = False
        self.calls = 0
        self._lock = threading.Lock()

    def install(self, client: Any) -> None:
        events = client.meta.events
        op = f"{self.service}.{self.operation}"
        events.register(f"provide-client-params.{op}", self._take_out)
        events.register_first(f"before-call.{self.service}", self._network)
        events.register(f"before-call.{op}", self._all_failed)
        events.register(f"after-call.{op}", self._add_failures)

    def _network(self, **_: Any) -> None:
        if self.down:
            raise EndpointConnectionError(endpoint_url=f"https://{self.service}.{REGION}.amazonaws.com")

    def _take_out(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        with self._lock:
            self.calls += 1
        entries = params.get(self.entries_param) or []
        failing = [(i, e) for i, e in enumerate(entries) if self.type_of(e) in self.answers]
        context["outbox_failing"] = failing
        context["outbox_all"] = len(failing) == len(entries) and bool(entries)
        context["outbox_count"] = len(entries)
        if failing and not context["outbox_all"]:
            params[self.entries_param] = [e for e in entries if self.type_of(e) not in self.answers]

    def _all_failed(self, context: dict[str, Any], **_: Any) -> Any:
        if context.get("outbox_all"):
            parsed: dict[str, Any] = ({self.reply_count: 0, self.reply_entries: []} if self.positional
                                      else {"Successful": [], "Failed": []})
            return AWSResponse("http://fault.invalid", 200, {}, None), parsed
        return None

    def _add_failures(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        failing = context.get("outbox_failing") or []
        if not failing:
            return
        if self.positional:  # EventBridge, Kinesis: the reply's entries are in the request's order
            entries = list(parsed.get(self.reply_entries) or [])
            for i, e in failing:
                code, _ = self.answers[self.type_of(e)]
                entries.insert(i, {"ErrorCode": code, "ErrorMessage": f"injected {code}"})
            parsed[self.reply_entries] = entries
            parsed[self.reply_count] = int(parsed.get(self.reply_count) or 0) + len(failing)
            return
        failed = list(parsed.get("Failed") or [])
        for _, e in failing:
            code, sender = self.answers[self.type_of(e)]
            failed.append({"Id": e["Id"], "Code": code, "Message": f"injected {code}", "SenderFault": sender})
        parsed["Failed"] = failed


def sqs_entry_type(entry: dict[str, Any]) -> str:
    return entry["MessageAttributes"]["outbox-type"]["StringValue"]


def eventbridge_entry_type(entry: dict[str, Any]) -> str:
    return entry["DetailType"]


def kinesis_record_type(entry: dict[str, Any]) -> str:
    return json.loads(entry["Data"])["type"]


class QueueReader:
    """Everything a queue received, read (and deleted) through the SQS API, kept in arrival order."""

    def __init__(self, client: Any, queue_url: str, id_of: Callable[[dict[str, Any]], str]) -> None:
        self.client, self.queue_url, self.id_of = client, queue_url, id_of
        self.got: list[str] = []

    def read(self) -> list[str]:
        while True:
            reply = self.client.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                                MessageAttributeNames=["All"], AttributeNames=["All"],
                                                WaitTimeSeconds=0, VisibilityTimeout=60)
            messages = reply.get("Messages") or []
            if not messages:
                return list(self.got)
            for m in messages:
                self.got.append(self.id_of(m))
            self.client.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])


class StreamReader:
    """Every record a Kinesis stream received, read through ``GetRecords`` shard by shard,
    in each shard's order (the harness's streams have one shard, so that is the stream's order)."""

    def __init__(self, client: Any, stream: str) -> None:
        self.client, self.stream = client, stream
        self.iterators: dict[str, str] = {}
        self.got: list[dict[str, Any]] = []

    def read(self) -> list[str]:
        return [r["id"] for r in self.records()]

    def records(self) -> list[dict[str, Any]]:
        """The records' data, decoded, with each one's partition key and shard as `_partition` and `_shard`."""
        for shard in self.client.list_shards(StreamName=self.stream)["Shards"]:
            sid = shard["ShardId"]
            if sid not in self.iterators:
                self.iterators[sid] = self.client.get_shard_iterator(
                    StreamName=self.stream, ShardId=sid, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            while True:
                reply = self.client.get_records(ShardIterator=self.iterators[sid], Limit=1000)
                self.iterators[sid] = reply["NextShardIterator"]
                for r in reply["Records"]:
                    self.got.append({**json.loads(r["Data"]), "_partition": r["PartitionKey"], "_shard": sid})
                if not reply["Records"]:
                    break
        return list(self.got)


def id_attribute(message: dict[str, Any]) -> str:
    return message["MessageAttributes"]["outbox-message-id"]["StringValue"]


def id_in_detail(message: dict[str, Any]) -> str:
    return json.loads(message["Body"])["detail"]["outbox-message-id"]
