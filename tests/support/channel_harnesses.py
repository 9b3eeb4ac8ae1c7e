"""Channel harnesses for the contract suite (tests/contract, decision 0043): one per
registered channel, plus one for the fake publisher of the unit tests.

A harness enqueues through the producer API, builds the channel's publisher the way
runtime does (its spec in `publishers/registry.py`, from `config.load_settings`),
reads what the downstream received, and injects faults through the downstream's own
means where it has them. A message is aimed at a fault by its `target`: the harness
makes that target fail (a stream, a recipient) and leaves every other message alone.
"""

from __future__ import annotations

import enum
import json
import threading
from typing import Any, Protocol

from botocore.exceptions import EndpointConnectionError

from outbox_relay.backoff import Backoff
from outbox_relay.config import load_settings
from outbox_relay.loop import RelayPolicy
from outbox_relay.models import DeliveryResult, ErrorClass
from outbox_relay.producer import (
    enqueue_email,
    enqueue_event,
    enqueue_eventbridge,
    enqueue_kinesis,
    enqueue_sns,
    enqueue_sqs,
)
from outbox_relay.publishers.base import Publisher
from outbox_relay.publishers.registry import Channel, spec_for
from outbox_relay.publishers.ses.payload import OUTBOX_TAG
from outbox_tools.local_ses import answer_get_account, fail_send_email
from support.aws_harness import (
    Faults,
    QueueReader,
    StreamReader,
    aws_client,
    eventbridge_entry_type,
    id_attribute,
    id_in_detail,
    kinesis_record_type,
    sqs_entry_type,
    unique,
)
from support.fakes import FakePublisher
from support.ses import CONFIGURATION_SET, DEFAULT_FROM, SENDER_IDENTITY, sent_messages

#: Deferrals far apart, so the outcome class shows in when a message is due again:
#: throttled 300 s (attempt refunded), transient backoff 900-2000 s.
POLICY = RelayPolicy(batch_size=100, lease_seconds=30, backoff=Backoff(base=1000, cap=2000, floor=900),
                     throttle_delay_seconds=300)


class Fault(str, enum.Enum):
    """The per-message faults every channel must classify."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    THROTTLED = "throttled"


class ChannelHarness(Protocol):
    """What a channel's harness gives the suite (a new channel writes one, decision 0043)."""

    name: str
    channel: Channel
    #: Whether the downstream itself drops a second delivery of a message id.
    dedupes: bool
    #: Whether its runs are left to `-m slow` (the default run must stay quick).
    slow: bool

    @classmethod
    def make(cls, request: Any) -> ChannelHarness:
        """A harness on this test's fixtures (`request.getfixturevalue`)."""

    def enqueue(self, n: int = 1, *, key: str | None = None, target: str | None = None,
                max_attempts: int | None = None) -> list[str]:
        """Write `n` messages through the producer API, aimed at `target` (a fault's) when given; their ids."""

    def fault(self, kind: Fault) -> str:
        """Make a target fail with `kind` from now on; the target to enqueue at."""

    def heal(self) -> None:
        """Every target works again."""

    def cut(self) -> None:
        """The whole downstream is unavailable from now on, to publishers built before as well."""

    def publisher(self) -> Publisher:
        """The channel's publisher, built as runtime builds it."""

    def received(self) -> list[str]:
        """The message ids the downstream holds, as it recorded them, in its order per destination."""


#: The largest stream id there is: a stream holding it refuses every XADD ("exhausted"), an error
#: that is neither the message's fault nor Redis being down.
_LAST_ID = "18446744073709551615-18446744073709551615"
#: OUTBOX_REDIS_MAXLEN while throttling is injected (acknowledged trimming holds a full stream).
REDIS_BOUND = 5


class RedisHarness:
    """Redis Streams on the real Redis, under the test's key prefix, reached through a TCP
    forwarder whose cut is the downstream becoming unavailable."""

    name = "redis"
    channel = Channel.REDIS
    #: Republishing a message id adds nothing (the publish script's dedupe key).
    dedupes = True
    slow = False

    def __init__(self, app_engine: Any, database_url: str, redis_client: Any, prefix: str, forwarder: Any) -> None:
        self.engine, self.database_url, self.client = app_engine, database_url, redis_client
        self.prefix, self.forwarder = prefix, forwarder
        self.streams: list[str] = []
        self.faulted: list[str] = []
        self.overrides: dict[str, Any] = {}

    @classmethod
    def make(cls, request: Any) -> RedisHarness:
        fixture = request.getfixturevalue
        return cls(fixture("app_engine"), fixture("database_url"), fixture("redis_client"), fixture("redis_prefix"),
                   fixture("tcp_redis"))

    def _stream(self, target: str | None) -> str:
        stream = self.prefix + (target or "events")
        if stream not in self.streams:
            self.streams.append(stream)
        return stream

    def enqueue(self, n: int = 1, *, key: str | None = None, target: str | None = None,
                max_attempts: int | None = None) -> list[str]:
        stream = self._stream(target)
        with self.engine.begin() as conn:
            return [str(enqueue_event(conn, stream=stream, type="contract.checked", payload={"n": i}, key=key,
                                      max_attempts=max_attempts)) for i in range(n)]

    def fault(self, kind: Fault) -> str:
        stream = self._stream(kind.value)
        self.faulted.append(stream)
        if kind is Fault.PERMANENT:
            self.client.set(stream, "not a stream")  # WRONGTYPE: the message's fault (decision 0006)
        elif kind is Fault.TRANSIENT:
            self.client.xadd(stream, {"filler": "1"}, id=_LAST_ID)
        else:
            # A stream at its bound whose group has read nothing: acknowledged trimming holds it.
            self.client.xgroup_create(stream, "lagging", id="0", mkstream=True)
            for _ in range(REDIS_BOUND):
                self.client.xadd(stream, {"filler": "1"})
            self.overrides.update(redis_trim="acknowledged", redis_maxlen=REDIS_BOUND)
        return kind.value

    def heal(self) -> None:
        if self.faulted:
            self.client.delete(*self.faulted)
        self.faulted.clear()

    def cut(self) -> None:
        self.forwarder.cut()

    def publisher(self) -> Publisher:
        settings = load_settings(channel="redis", database_url=self.database_url,
                                 redis_url=f"redis://127.0.0.1:{self.forwarder.port}/0", **self.overrides)
        return spec_for(self.channel).build_publisher(settings)

    def received(self) -> list[str]:
        ids = []
        for stream in self.streams:
            if self.client.type(stream) == "stream":
                ids += [fields["id"] for _, fields in self.client.xrange(stream) if "id" in fields]
        return ids


#: What SES answers for each fault (codes as docs/channels.md classifies them).
_SES_FAULTS = {Fault.TRANSIENT: ("ServiceUnavailable", "Service unavailable", 503),
               Fault.PERMANENT: ("MessageRejected", "Email address is not verified.", 400),
               Fault.THROTTLED: ("TooManyRequestsException", "Too many requests", 429)}


class SesHarness:
    """Amazon SES on moto's server (`support.aws_harness`), as the other AWS channels; moto never
    fails a send, so faults are SES's own error codes for the target's recipient, answered by a
    botocore hook."""

    name = "ses"
    channel = Channel.SES
    #: SES does not deduplicate: the consumer dedupes on the outbox-message-id tag.
    dedupes = False
    #: moto costs most per test; the default run covers SES in tests/integration/test_ses_*.py.
    slow = True

    def __init__(self, app_engine: Any, database_url: str) -> None:
        self.engine, self.database_url = app_engine, database_url
        self.faults: dict[str, tuple[str, str, int]] = {}
        self.down = False
        self.accepted: list[str] = []
        self._lock = threading.Lock()
        # The server lives for the session: what it recorded before this test is not this test's.
        self._sent_before = len(sent_messages())

    @classmethod
    def make(cls, request: Any) -> SesHarness:
        # moto's server, as for the other AWS channels: the sender verified, the configuration set made
        endpoint = request.getfixturevalue("aws_endpoint")
        ses = aws_client("sesv2", endpoint)
        ses.create_email_identity(EmailIdentity=SENDER_IDENTITY)
        if CONFIGURATION_SET not in ses.list_configuration_sets().get("ConfigurationSets", []):
            ses.create_configuration_set(ConfigurationSetName=CONFIGURATION_SET)
        return cls(request.getfixturevalue("app_engine"), request.getfixturevalue("database_url"))

    @staticmethod
    def _address(target: str | None, i: int) -> str:
        return f"{target}@example.com" if target else f"user{i}@example.com"

    def enqueue(self, n: int = 1, *, key: str | None = None, target: str | None = None,
                max_attempts: int | None = None) -> list[str]:
        with self.engine.begin() as conn:
            return [str(enqueue_email(conn, to=[self._address(target, i)], subject=f"contract {i}", text=f"body {i}",
                                      key=key, max_attempts=max_attempts)) for i in range(n)]

    def fault(self, kind: Fault) -> str:
        self.faults[self._address(kind.value, 0)] = _SES_FAULTS[kind]
        return kind.value

    def heal(self) -> None:
        self.faults.clear()

    def cut(self) -> None:
        self.down = True

    def publisher(self) -> Publisher:
        settings = load_settings(channel="ses", database_url=self.database_url, ses_from=DEFAULT_FROM,
                                 ses_configuration_set=CONFIGURATION_SET, ses_max_send_rate=200.0)
        publisher = spec_for(self.channel).build_publisher(settings)
        client = publisher.client  # type: ignore[attr-defined]
        # Registered first, so they run before the fault hook answers in the request's place.
        client.meta.events.register("before-call.sesv2.GetAccount", self._network)
        client.meta.events.register("before-call.sesv2.SendEmail", self._note_id)
        client.meta.events.register("after-call.sesv2.SendEmail", self._accepted)
        answer_get_account(client, max_send_rate=200.0)
        fail_send_email(client, lambda r: self.faults.get(r["Destination"]["ToAddresses"][0]))
        return publisher

    def _network(self, **_: Any) -> None:
        if self.down:
            raise EndpointConnectionError(endpoint_url="https://email.us-east-1.amazonaws.com")

    @staticmethod
    def _note_id(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        tags = json.loads(params["body"]).get("EmailTags", [])
        context["outbox_id"] = next((t["Value"] for t in tags if t["Name"] == OUTBOX_TAG), None)

    def _accepted(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if parsed.get("MessageId"):
            with self._lock:
                self.accepted.append(context.get("outbox_id"))

    def received(self) -> list[str]:
        # What SES accepted, in acceptance order, with the tag it carried; moto recorded as many.
        assert len(sent_messages()) - self._sent_before == len(self.accepted)
        return list(self.accepted)


class _AwsHarness:
    """SQS, SNS and EventBridge on moto's server (`support.aws_harness`): the downstream is a
    queue, topic or bus of this test's own, read back through the service's own API (a topic
    and a bus through an SQS queue subscribed to it); faults are the service's per-entry
    answers, for the entries whose type is the fault's target."""

    channel: Channel
    fifo = False
    dedupes = False
    slow = True
    #: The fault answers: (error code, sender fault), as the service words them.
    answers: dict[Fault, tuple[str, bool]]

    def __init__(self, app_engine: Any, database_url: str, endpoint: str) -> None:
        self.engine, self.database_url, self.endpoint = app_engine, database_url, endpoint
        self.sqs = aws_client("sqs", endpoint)
        self.faults = self.make_faults()
        self.reader = self.make_downstream()

    @classmethod
    def make(cls, request: Any) -> _AwsHarness:
        fixture = request.getfixturevalue
        return cls(fixture("app_engine"), fixture("database_url"), fixture("aws_endpoint"))

    def make_faults(self) -> Faults:
        raise NotImplementedError

    def make_downstream(self) -> QueueReader:
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def queue(self, prefix: str) -> tuple[str, str]:
        """A queue of this test's own (FIFO when the harness is): its URL and ARN."""
        name = unique(prefix) + (".fifo" if self.fifo else "")
        attributes = {"FifoQueue": "true"} if self.fifo else {}
        url = self.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return url, arn

    def write(self, conn: Any, i: int, type_: str, key: str | None, max_attempts: int | None) -> Any:
        raise NotImplementedError

    def enqueue(self, n: int = 1, *, key: str | None = None, target: str | None = None,
                max_attempts: int | None = None) -> list[str]:
        with self.engine.begin() as conn:
            return [str(self.write(conn, i, target or "contract.checked", key, max_attempts)) for i in range(n)]

    def fault(self, kind: Fault) -> str:
        self.faults.answers[kind.value] = self.answers[kind]
        return kind.value

    def heal(self) -> None:
        self.faults.answers.clear()

    def cut(self) -> None:
        self.faults.down = True

    def publisher(self) -> Publisher:
        settings = load_settings(channel=self.channel.value, database_url=self.database_url, **self.settings())
        publisher = spec_for(self.channel).build_publisher(settings)
        self.faults.install(publisher.client)  # type: ignore[attr-defined]
        return publisher

    def received(self) -> list[str]:
        return self.reader.read()


class SqsHarness(_AwsHarness):
    name = "sqs"
    channel = Channel.SQS
    answers = {Fault.TRANSIENT: ("InternalError", False), Fault.PERMANENT: ("InvalidParameterValue", True),
               Fault.THROTTLED: ("RequestThrottled", False)}

    def make_faults(self) -> Faults:
        return Faults("sqs", "SendMessageBatch", "Entries", False, sqs_entry_type)

    def make_downstream(self) -> QueueReader:
        self.queue_url, _ = self.queue("contract")
        return QueueReader(self.sqs, self.queue_url, id_attribute)

    def settings(self) -> dict[str, Any]:
        return {"sqs_queue_url": self.queue_url}

    def write(self, conn: Any, i: int, type_: str, key: str | None, max_attempts: int | None) -> Any:
        return enqueue_sqs(conn, type=type_, payload={"n": i}, key=key, max_attempts=max_attempts)


class SqsFifoHarness(SqsHarness):
    """A FIFO queue: the key is the message group, the message id the deduplication id."""

    name = "sqs-fifo"
    fifo = True
    #: SQS drops a second send of a deduplication id within five minutes.
    dedupes = True
    slow = True


class SnsHarness(_AwsHarness):
    name = "sns"
    channel = Channel.SNS
    answers = {Fault.TRANSIENT: ("InternalError", False), Fault.PERMANENT: ("InvalidParameterValue", True),
               Fault.THROTTLED: ("Throttled", True)}

    def make_faults(self) -> Faults:
        return Faults("sns", "PublishBatch", "PublishBatchRequestEntries", False, sqs_entry_type)

    def make_downstream(self) -> QueueReader:
        sns = aws_client("sns", self.endpoint)
        name = unique("contract") + (".fifo" if self.fifo else "")
        self.topic_arn = sns.create_topic(Name=name, Attributes={"FifoTopic": "true"} if self.fifo else {}
                                          )["TopicArn"]
        url, arn = self.queue("subscriber")
        # Raw delivery: the queue gets the message and its attributes as published.
        sns.subscribe(TopicArn=self.topic_arn, Protocol="sqs", Endpoint=arn,
                      Attributes={"RawMessageDelivery": "true"})
        return QueueReader(self.sqs, url, id_attribute)

    def settings(self) -> dict[str, Any]:
        return {"sns_topic_arn": self.topic_arn}

    def write(self, conn: Any, i: int, type_: str, key: str | None, max_attempts: int | None) -> Any:
        return enqueue_sns(conn, type=type_, payload={"n": i}, key=key, max_attempts=max_attempts)


class SnsFifoHarness(SnsHarness):
    """A FIFO topic with a FIFO queue subscribed: SNS deduplicates as a FIFO queue does."""

    name = "sns-fifo"
    fifo = True
    dedupes = True


class EventBridgeHarness(_AwsHarness):
    name = "eventbridge"
    channel = Channel.EVENTBRIDGE
    answers = {Fault.TRANSIENT: ("InternalFailure", False), Fault.PERMANENT: ("MalformedDetail", False),
               Fault.THROTTLED: ("ThrottlingException", False)}
    SOURCE = "outbox.contract"

    def make_faults(self) -> Faults:
        return Faults("events", "PutEvents", "Entries", True, eventbridge_entry_type)

    def make_downstream(self) -> QueueReader:
        events = aws_client("events", self.endpoint)
        self.bus = unique("contract")
        events.create_event_bus(Name=self.bus)
        url, arn = self.queue("target")
        events.put_rule(Name="all", EventBusName=self.bus, EventPattern=json.dumps({"source": [self.SOURCE]}))
        events.put_targets(Rule="all", EventBusName=self.bus, Targets=[{"Id": "queue", "Arn": arn}])
        return QueueReader(self.sqs, url, id_in_detail)

    def settings(self) -> dict[str, Any]:
        return {"eventbridge_bus": self.bus, "eventbridge_source": self.SOURCE}

    def write(self, conn: Any, i: int, type_: str, key: str | None, max_attempts: int | None) -> Any:
        return enqueue_eventbridge(conn, type=type_, payload={"n": i}, key=key, max_attempts=max_attempts)


class KinesisHarness(_AwsHarness):
    """A stream of one shard of this test's own, read back with ``GetRecords``."""

    name = "kinesis"
    channel = Channel.KINESIS
    # A record's ErrorCode is ProvisionedThroughputExceededException or InternalFailure
    # ("PutRecordsResultEntry"); the permanent answer is the code Kinesis refuses a bad record with.
    answers = {Fault.TRANSIENT: ("InternalFailure", False), Fault.PERMANENT: ("InvalidArgumentException", True),
               Fault.THROTTLED: ("ProvisionedThroughputExceededException", False)}

    def make_faults(self) -> Faults:
        return Faults("kinesis", "PutRecords", "Records", True, kinesis_record_type,
                      reply=("Records", "FailedRecordCount"))

    def make_downstream(self) -> StreamReader:  # type: ignore[override]
        kinesis = aws_client("kinesis", self.endpoint)
        self.stream = unique("contract")
        kinesis.create_stream(StreamName=self.stream, ShardCount=1)
        kinesis.get_waiter("stream_exists").wait(StreamName=self.stream, WaiterConfig={"Delay": 1})
        return StreamReader(kinesis, self.stream)

    def settings(self) -> dict[str, Any]:
        # One call at a time: moto numbers a shard's records unlocked, so concurrent puts can overwrite.
        return {"kinesis_stream": self.stream, "kinesis_max_concurrency": 1}

    def write(self, conn: Any, i: int, type_: str, key: str | None, max_attempts: int | None) -> Any:
        return enqueue_kinesis(conn, type=type_, payload={"n": i}, key=key, max_attempts=max_attempts)


class FakeHarness:
    """The unit tests' `FakePublisher` over the real store: what its script answers is the
    downstream. It must pass the same suite, or unit tests built on it prove nothing."""

    name = "fake"
    channel = FakePublisher.channel
    dedupes = False
    slow = False

    def __init__(self, app_engine: Any) -> None:
        self.engine = app_engine
        self.faults: dict[str, ErrorClass] = {}
        self.got: list[str] = []
        self.built: list[FakePublisher] = []

    @classmethod
    def make(cls, request: Any) -> FakeHarness:
        return cls(request.getfixturevalue("app_engine"))

    def enqueue(self, n: int = 1, *, key: str | None = None, target: str | None = None,
                max_attempts: int | None = None) -> list[str]:
        with self.engine.begin() as conn:
            return [str(enqueue_event(conn, stream=target or "events", type="contract.checked", payload={"n": i},
                                      key=key, max_attempts=max_attempts)) for i in range(n)]

    def fault(self, kind: Fault) -> str:
        self.faults[kind.value] = ErrorClass(kind.value)
        return kind.value

    def heal(self) -> None:
        self.faults.clear()

    def cut(self) -> None:
        for p in self.built:
            p.gate_reason = "fake downstream unavailable"

    def publisher(self) -> Publisher:
        self.built.append(FakePublisher(self._answer))
        return self.built[-1]

    def _answer(self, m: Any) -> DeliveryResult:
        error_class = self.faults.get(m.destination)
        if error_class is not None:
            return DeliveryResult(m.seq, error_class=error_class, error=f"fake: {error_class.value}")
        self.got.append(m.message_id)
        return DeliveryResult.delivered(m.seq, f"fake-{m.seq}")

    def received(self) -> list[str]:
        return list(self.got)


#: Every harness, by name; `make(request)` builds one from the test's fixtures.
#: A registered channel without one fails the suite.
HARNESSES: dict[str, type[ChannelHarness]] = {h.name: h for h in (
    RedisHarness, SesHarness, SqsHarness, SqsFifoHarness, SnsHarness, SnsFifoHarness, EventBridgeHarness,
    KinesisHarness, FakeHarness)}
