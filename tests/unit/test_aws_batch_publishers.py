"""The SQS, SNS and EventBridge publishers against stub boto3 clients: what each
entry becomes, per-key rounds, per-entry outcomes, a whole-call refusal split into
single calls, an endpoint not reached, the deadline and the gate. No network."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from outbox_relay.errors import DownstreamUnavailable, StopBatch
from outbox_relay.models import ClaimedMessage, ErrorClass, Status
from outbox_relay.publishers.aws_batch import GATE_INTERVAL_SECONDS
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.eventbridge.publisher import EventBridgePublisher
from outbox_relay.publishers.sns.publisher import SnsPublisher
from outbox_relay.publishers.sqs.publisher import SqsPublisher

QUEUE = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
TOPIC = "arn:aws:sns:eu-west-1:123456789012:orders"


def message(seq: int, *, key: str | None = None, payload: str = '{"n":1}', destination: str = "(relay)",
            headers: str | None = None, type_: str = "order.placed") -> ClaimedMessage:
    return ClaimedMessage(seq, str(uuid.UUID(int=seq)), Status.LEASED, destination, type_, key, payload, headers,
                          1, 10, "2026-12-02T10:00:00.000000Z")


def client_error(code: str, *, status: int = 400, kind: str = "Sender", operation: str = "SendMessageBatch"):
    return ClientError({"Error": {"Code": code, "Message": "refused", "Type": kind},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


class Clock:
    """The Lambda's remaining time, which a stub call may use up."""

    def __init__(self, ms: int = 60_000):
        self.ms = ms

    def deadline(self) -> Deadline:
        return Deadline(lambda: self.ms, 5.0)


class StubBatchClient:
    """A boto3-like SQS and SNS client: `answer(entries)` returns, per entry Id, None (accepted) or
    (code, sender_fault), or raises for the whole call. Records every call's entries."""

    def __init__(self, answer=None, after_call=None):
        self.answer = answer or (lambda entries: {})
        self.after_call = after_call
        self.calls: list[list[dict]] = []
        self.probes = 0
        self._lock = threading.Lock()

    def _reply(self, entries):
        with self._lock:
            self.calls.append(list(entries))
        try:
            failures = self.answer(entries)
        finally:
            if self.after_call:
                self.after_call()
        ok = [{"Id": e["Id"], "MessageId": f"m-{e['Id']}"} for e in entries if failures.get(e["Id"]) is None]
        failed = [{"Id": i, "Code": code, "SenderFault": fault, "Message": "no"}
                  for i, (code, fault) in ((i, f) for i, f in failures.items() if f is not None)]
        return {"Successful": ok, "Failed": failed}

    def send_message_batch(self, QueueUrl, Entries):  # noqa: N803 (boto3's names)
        assert QueueUrl.startswith(QUEUE)
        return self._reply(Entries)

    def publish_batch(self, TopicArn, PublishBatchRequestEntries):  # noqa: N803
        assert TopicArn.startswith(TOPIC)
        return self._reply(PublishBatchRequestEntries)

    def get_queue_attributes(self, QueueUrl, AttributeNames):  # noqa: N803
        self.probes += 1

    def get_topic_attributes(self, TopicArn):  # noqa: N803
        self.probes += 1


class StubEvents:
    """A boto3-like EventBridge client: `answer(entries)` returns per position None or an error code."""

    def __init__(self, answer=None):
        self.answer = answer or (lambda entries: [None] * len(entries))
        self.calls: list[list[dict]] = []

    def put_events(self, Entries):  # noqa: N803
        self.calls.append(list(Entries))
        codes = self.answer(Entries)
        return {"FailedEntryCount": sum(c is not None for c in codes),
                "Entries": [{"EventId": f"e-{i}"} if c is None else {"ErrorCode": c, "ErrorMessage": "no"}
                            for i, c in enumerate(codes)]}

    def describe_event_bus(self, Name):  # noqa: N803
        pass


def deliver(publisher, messages, deadline=None):
    """Run `deliver`; return (results by seq, the record calls, the exception raised or None)."""
    recorded: list[list] = []
    raised = None
    try:
        publisher.deliver(messages, deadline or Clock().deadline(), lambda rs: recorded.append(list(rs)))
    except (StopBatch, DownstreamUnavailable) as exc:
        raised = exc
    finally:
        publisher.close()
    by_seq = {r.seq: r for batch in recorded for r in batch}
    assert sum(len(b) for b in recorded) == len(by_seq), "a message was recorded twice"
    return by_seq, recorded, raised


def seqs_of(call) -> list[int]:
    return [int(e["Id"]) for e in call]


# -- what an entry becomes ---------------------------------------------------------------------------

def test_an_sqs_entry_is_the_payload_as_body_and_the_id_type_key_and_headers_as_attributes():
    client = StubBatchClient()
    m = message(1, key="customer-77", headers='{"tenant":"shop-eu"}')
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE), [m])
    (entry,), = client.calls
    assert entry["MessageBody"] == '{"n":1}' and "MessageGroupId" not in entry
    assert {k: v["StringValue"] for k, v in entry["MessageAttributes"].items()} == {
        "outbox-message-id": m.message_id, "outbox-type": "order.placed", "outbox-key": "customer-77",
        "tenant": "shop-eu"}
    assert all(v["DataType"] == "String" for v in entry["MessageAttributes"].values())
    assert raised is None and results[1].delivery_ref == "sqs:m-1" and results[1].ok


@pytest.mark.parametrize(("key", "group"), [
    ("customer-77", "customer-77"),
    ("a!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~z", "a!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~z"),
    ("k" * 128, "k" * 128),
])
def test_on_a_fifo_queue_a_key_sqs_takes_is_the_group_and_the_message_id_deduplicates(key, group):
    client = StubBatchClient()
    m = message(1, key=key)
    deliver(SqsPublisher(client, queue_url=QUEUE + ".fifo"), [m])
    (entry,), = client.calls
    assert entry["MessageGroupId"] == group and entry["MessageDeduplicationId"] == m.message_id


@pytest.mark.parametrize("key", ["k" * 129, "has space", "주문-1", "tab\tkey", "é"])
def test_a_key_sqs_would_refuse_as_a_group_id_becomes_its_digest(key):
    import hashlib

    client = StubBatchClient()
    deliver(SqsPublisher(client, queue_url=QUEUE + ".fifo"), [message(1, key=key), message(2, key=key)])
    groups = {e["MessageGroupId"] for call in client.calls for e in call}
    # one group per key, the same every time, and the key itself still travels as an attribute
    assert groups == {"sha256-" + hashlib.sha256(key.encode()).hexdigest()}
    assert client.calls[0][0]["MessageAttributes"]["outbox-key"]["StringValue"] == key


def test_on_a_fifo_queue_a_message_without_a_key_is_a_group_of_its_own():
    client = StubBatchClient()
    ms = [message(1), message(2)]
    deliver(SqsPublisher(client, queue_url=QUEUE + ".fifo"), ms)
    assert [e["MessageGroupId"] for e in client.calls[0]] == [m.message_id for m in ms]


def test_an_sns_entry_is_the_payload_as_message_and_a_fifo_topic_gets_group_and_dedupe_ids():
    client = StubBatchClient(answer=lambda entries: {})
    m = message(1, key="k")
    results, _, _ = deliver(SnsPublisher(client, topic_arn=TOPIC + ".fifo"), [m])
    (entry,), = client.calls
    assert entry["Message"] == '{"n":1}' and entry["MessageGroupId"] == "k"
    assert entry["MessageDeduplicationId"] == m.message_id
    assert entry["MessageAttributes"]["outbox-message-id"]["StringValue"] == m.message_id
    assert results[1].delivery_ref == "sns:m-1"


def test_a_message_over_256_kib_with_its_attributes_is_permanent_and_never_sent():
    client = StubBatchClient()
    big = '"' + "x" * (256 * 1024 - 30) + '"'
    results, _, _ = deliver(SqsPublisher(client, queue_url=QUEUE), [message(1, payload=big), message(2)])
    assert results[1].error_class is ErrorClass.PERMANENT and "limit" in results[1].error
    assert results[2].ok and seqs_of(client.calls[0]) == [2]


def test_an_eventbridge_entry_is_the_payload_object_with_the_message_id_and_its_bus_and_source():
    client = StubEvents()
    own = message(1, payload='{"order_id":"1042"}')
    chosen = message(2, payload="{}", destination="shop", headers='{"source":"shop.orders"}')
    results, _, _ = deliver(EventBridgePublisher(client, bus="relay-bus", source="outbox.relay"), [own, chosen])
    entries = {e["EventBusName"]: e for call in client.calls for e in call}
    assert len(client.calls) == 2  # one bus per call
    assert entries["relay-bus"]["Detail"] == f'{{"outbox-message-id":"{own.message_id}","order_id":"1042"}}'
    assert entries["relay-bus"]["Source"] == "outbox.relay" and entries["relay-bus"]["DetailType"] == "order.placed"
    assert json.loads(entries["shop"]["Detail"]) == {"outbox-message-id": chosen.message_id}
    assert entries["shop"]["Source"] == "shop.orders" and "Id" not in entries["shop"]
    assert results[1].delivery_ref.startswith("eventbridge:e-") and results[2].ok


# -- calls and rounds --------------------------------------------------------------------------------

def test_calls_carry_at_most_ten_entries():
    client = StubBatchClient()
    results, _, _ = deliver(SqsPublisher(client, queue_url=QUEUE, max_concurrency=2), [message(i) for i in range(1, 26)])
    assert sorted(len(c) for c in client.calls) == [5, 10, 10] and len(results) == 25
    assert all(r.ok for r in results.values())


def test_calls_carry_at_most_256_kib():
    client = StubBatchClient()
    payload = '"' + "x" * (100 * 1024) + '"'  # three do not fit in one call
    deliver(SqsPublisher(client, queue_url=QUEUE), [message(i, payload=payload) for i in range(1, 4)])
    assert sorted(len(c) for c in client.calls) == [1, 2]


def test_a_key_sends_one_message_per_round_in_order_and_other_messages_go_in_the_first():
    client = StubBatchClient()
    ms = [message(1, key="a"), message(2, key="a"), message(3, key="b"), message(4), message(5, key="a")]
    results, _, _ = deliver(SqsPublisher(client, queue_url=QUEUE, max_concurrency=1), ms)
    assert [seqs_of(c) for c in client.calls] == [[1, 3, 4], [2], [5]]
    assert all(r.ok for r in results.values()) and len(results) == 5


def test_a_keys_later_messages_are_not_sent_after_its_earlier_one_failed():
    # Key a's first message is refused; its later ones are released unsent, key b goes on
    client = StubBatchClient(answer=lambda entries: {"1": ("InvalidMessageContents", True)}
                             if any(e["Id"] == "1" for e in entries) else {})
    ms = [message(1, key="a"), message(2, key="b"), message(3, key="a"), message(4, key="b"), message(5, key="a")]
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE), ms)
    assert raised is None
    assert results[1].error_class is ErrorClass.PERMANENT
    assert results[3].error_class is ErrorClass.NOT_ATTEMPTED and results[5].error_class is ErrorClass.NOT_ATTEMPTED
    assert "earlier message of its key" in results[3].error
    assert results[2].ok and results[4].ok
    assert 3 not in {s for c in client.calls for s in seqs_of(c)} and 5 not in {s for c in client.calls
                                                                                 for s in seqs_of(c)}


def test_a_key_whose_message_was_refused_before_sending_holds_its_later_messages_back():
    client = StubBatchClient()
    big = '"' + "x" * (256 * 1024) + '"'
    results, _, _ = deliver(SqsPublisher(client, queue_url=QUEUE), [message(1, key="a", payload=big),
                                                                      message(2, key="a")])
    assert results[1].error_class is ErrorClass.PERMANENT and results[2].error_class is ErrorClass.NOT_ATTEMPTED
    assert client.calls == []


# -- per-entry outcomes ------------------------------------------------------------------------------

def test_a_partial_failure_is_classified_per_entry():
    failures = {"2": ("RequestThrottled", False), "3": ("InvalidMessageContents", True),
                "4": ("InternalError", False), "5": ("SomethingNew", True), "6": ("SomethingNew", False)}
    client = StubBatchClient(answer=lambda entries: failures)
    results, recorded, raised = deliver(SqsPublisher(client, queue_url=QUEUE), [message(i) for i in range(1, 7)])
    assert raised is None and len(client.calls) == 1 and len(recorded) == 1  # one call, one outcome write
    assert results[1].ok
    assert {s: results[s].error_class for s in range(2, 7)} == {
        2: ErrorClass.THROTTLED, 3: ErrorClass.PERMANENT, 4: ErrorClass.TRANSIENT,
        5: ErrorClass.PERMANENT,  # an unknown code the service calls the sender's fault
        6: ErrorClass.TRANSIENT}  # an unknown code that is not
    assert results[3].error == "sqs: InvalidMessageContents"


def test_an_entry_missing_from_the_reply_is_transient():
    class Forgetful(StubBatchClient):
        def send_message_batch(self, QueueUrl, Entries):  # noqa: N803
            reply = super().send_message_batch(QueueUrl, Entries)
            reply["Successful"] = reply["Successful"][:1]
            return reply

    results, _, _ = deliver(SqsPublisher(Forgetful(), queue_url=QUEUE), [message(1), message(2)])
    assert results[1].ok and results[2].error_class is ErrorClass.TRANSIENT and "MissingResult" in results[2].error


def test_an_entry_refusing_the_relays_queue_stops_the_batch_and_is_not_reported():
    client = StubBatchClient(answer=lambda entries: {"2": ("KmsAccessDenied", True)}
                             if any(e["Id"] == "2" for e in entries) else {})
    ms = [message(1), message(2), message(3, key="a"), message(4, key="a")]
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE, max_concurrency=1), ms)
    assert isinstance(raised, StopBatch) and "KmsAccessDenied" in str(raised)
    # the call's other entries are recorded; the refused one and the next round are left to be released
    assert results[1].ok and results[3].ok and 2 not in results and 4 not in results
    assert len(client.calls) == 1


def test_eventbridge_entries_are_classified_by_position_and_a_chosen_bus_refusal_is_the_messages_fault():
    answers = {"relay-bus": ["ThrottlingException", None], "shop": ["ResourceNotFoundException", "MalformedDetail"]}
    client = StubEvents(answer=lambda entries: answers[entries[0]["EventBusName"]])
    ms = [message(1), message(2), message(3, destination="shop"), message(4, destination="shop")]
    results, _, raised = deliver(EventBridgePublisher(client, bus="relay-bus"), ms)
    assert raised is None
    assert results[1].error_class is ErrorClass.THROTTLED and results[2].ok
    assert results[3].error_class is ErrorClass.PERMANENT and results[3].error == "eventbridge: ResourceNotFoundException"
    assert results[4].error_class is ErrorClass.PERMANENT


def test_eventbridge_the_relays_own_bus_missing_stops_the_batch():
    client = StubEvents(answer=lambda entries: ["ResourceNotFoundException"] * len(entries))
    results, _, raised = deliver(EventBridgePublisher(client, bus="relay-bus"), [message(1), message(2)])
    assert isinstance(raised, StopBatch) and results == {}


# -- whole-call refusals -----------------------------------------------------------------------------

def test_a_whole_call_invalid_parameter_value_is_split_into_single_calls():
    def answer(entries):
        # SQS refuses the whole call for one bad entry; alone, the others go through
        if any(e["MessageBody"] == '"bad"' for e in entries):
            raise client_error("InvalidParameterValue")
        return {}

    client = StubBatchClient(answer=answer)
    ms = [message(1), message(2, payload='"bad"'), message(3)]
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE), ms)
    assert raised is None
    assert [seqs_of(c) for c in client.calls] == [[1, 2, 3], [1], [2], [3]]
    assert results[1].ok and results[3].ok
    assert results[2].error_class is ErrorClass.PERMANENT and results[2].error == "sqs: InvalidParameterValue"


def test_a_whole_call_throttle_is_not_split():
    client = StubBatchClient(answer=lambda entries: (_ for _ in ()).throw(client_error("RequestThrottled")))
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE), [message(1), message(2)])
    assert raised is None and len(client.calls) == 1
    assert {r.error_class for r in results.values()} == {ErrorClass.THROTTLED}


def test_a_whole_call_server_error_is_transient_and_not_split():
    client = StubBatchClient(answer=lambda entries: (_ for _ in ()).throw(
        client_error("InternalError", status=500, kind="Receiver")))
    results, _, _ = deliver(SqsPublisher(client, queue_url=QUEUE), [message(1), message(2)])
    assert len(client.calls) == 1 and {r.error_class for r in results.values()} == {ErrorClass.TRANSIENT}


def test_a_whole_call_access_denied_stops_the_batch():
    client = StubBatchClient(answer=lambda entries: (_ for _ in ()).throw(client_error("AccessDenied", status=403)))
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE), [message(1), message(2)])
    assert isinstance(raised, StopBatch) and results == {}


def test_eventbridge_a_whole_call_access_denied_on_a_chosen_bus_dead_letters_its_messages_only():
    def put_events(Entries):  # noqa: N803
        client.calls.append(list(Entries))
        if Entries[0]["EventBusName"] == "other-account-bus":
            raise client_error("AccessDeniedException", operation="PutEvents")
        return {"FailedEntryCount": 0, "Entries": [{"EventId": "e"} for _ in Entries]}

    client = StubEvents()
    client.put_events = put_events
    ms = [message(1, destination="other-account-bus"), message(2, destination="other-account-bus"), message(3)]
    results, _, raised = deliver(EventBridgePublisher(client, bus="relay-bus"), ms)
    assert raised is None and results[3].ok
    assert results[1].error_class is ErrorClass.PERMANENT and results[2].error_class is ErrorClass.PERMANENT


def test_eventbridge_expired_credentials_stop_the_batch_even_on_a_chosen_bus():
    def put_events(Entries):  # noqa: N803
        raise client_error("ExpiredTokenException", operation="PutEvents")

    client = StubEvents()
    client.put_events = put_events
    results, _, raised = deliver(EventBridgePublisher(client), [message(1, destination="shop"), message(2,
                                                                                                destination="shop")])
    assert isinstance(raised, StopBatch) and results == {}


# -- not reached, no answer, deadline ----------------------------------------------------------------

def test_an_endpoint_not_reached_raises_downstream_unavailable_after_recording_what_completed():
    calls = []

    def answer(entries):
        calls.append(entries)
        if len(calls) == 2:
            raise EndpointConnectionError(endpoint_url=QUEUE)
        return {}

    client = StubBatchClient(answer=answer)
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE, max_concurrency=1),
                                 [message(i) for i in range(1, 26)])
    assert isinstance(raised, DownstreamUnavailable) and "EndpointConnectionError" in str(raised)
    # the first call's ten are recorded delivered; the failed call's and the third call's are not reported
    assert sorted(results) == list(range(1, 11)) and all(r.ok for r in results.values())
    assert len(client.calls) == 2


def test_a_read_timeout_is_transient_for_its_calls_entries():
    client = StubBatchClient(answer=lambda entries: (_ for _ in ()).throw(
        ReadTimeoutError(endpoint_url=QUEUE)))
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE), [message(1), message(2)])
    assert raised is None
    assert {r.error_class for r in results.values()} == {ErrorClass.TRANSIENT}
    assert results[1].error == "sqs: ReadTimeoutError"


def test_no_call_starts_once_the_deadline_passed():
    client = StubBatchClient()
    results, recorded, raised = deliver(SqsPublisher(client, queue_url=QUEUE), [message(1), message(2)],
                                        deadline=Clock(ms=4_000).deadline())  # within the 5 s margin
    assert client.calls == [] and recorded == [] and raised is None


def test_calls_after_the_deadline_are_not_started_and_their_messages_not_reported():
    clock = Clock()

    def use_up_the_time():
        clock.ms = 1_000

    client = StubBatchClient(after_call=use_up_the_time)
    ms = [message(i) for i in range(1, 26)] + [message(26, key="a"), message(27, key="a")]
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE, max_concurrency=1), ms, clock.deadline())
    assert raised is None and len(client.calls) == 1
    assert sorted(results) == seqs_of(client.calls[0]) and all(r.ok for r in results.values())


def test_a_split_stops_starting_single_calls_once_the_deadline_passed():
    clock = Clock()

    def answer(entries):
        if len(entries) > 1:
            raise client_error("InvalidParameterValue")
        clock.ms = 1_000
        return {}

    client = StubBatchClient(answer=answer)
    results, _, _ = deliver(SqsPublisher(client, queue_url=QUEUE), [message(1), message(2), message(3)],
                            clock.deadline())
    assert [seqs_of(c) for c in client.calls] == [[1, 2, 3], [1]] and list(results) == [1]


# -- the gate ----------------------------------------------------------------------------------------

class FakeTime:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(("make", "probe"), [
    (lambda c: SqsPublisher(c, queue_url=QUEUE), "get_queue_attributes"),
    (lambda c: SnsPublisher(c, topic_arn=TOPIC), "get_topic_attributes"),
    (lambda c: EventBridgePublisher(c), "describe_event_bus"),
])
def test_the_gate_probes_at_most_every_interval_and_names_what_failed(make, probe):
    outcome: list = [None]
    count = [0]

    class Client:
        def __getattr__(self, name):
            assert name == probe, name

            def call(**kwargs):
                count[0] += 1
                if outcome[0] is not None:
                    raise outcome[0]
            return call

    publisher = make(Client())
    publisher._clock = clock = FakeTime()
    deadline = Clock().deadline()
    publisher.begin(deadline)
    assert publisher.gate() is None and count[0] == 1
    outcome[0] = client_error("AccessDenied", status=403)
    clock.now += GATE_INTERVAL_SECONDS - 1
    assert publisher.gate() is None and count[0] == 1  # the last answer holds within the interval
    clock.now += 1
    assert "refused the gate's call (AccessDenied)" in publisher.gate() and count[0] == 2
    outcome[0] = EndpointConnectionError(endpoint_url="https://example.invalid")
    publisher.begin(deadline)  # a new invocation probes at once
    assert "unavailable (EndpointConnectionError)" in publisher.gate() and count[0] == 3


def test_a_message_refused_before_sending_does_not_hold_back_the_earlier_messages_of_its_key():
    # Only what follows a refused message waits; the key's earlier messages are sent
    client = StubBatchClient()
    big = '"' + "x" * (256 * 1024) + '"'
    ms = [message(1, key="a"), message(2, key="a", payload=big), message(3, key="a")]
    results, _, _ = deliver(SqsPublisher(client, queue_url=QUEUE), ms)
    assert results[1].ok and [seqs_of(c) for c in client.calls] == [[1]]
    assert results[2].error_class is ErrorClass.PERMANENT and results[3].error_class is ErrorClass.NOT_ATTEMPTED


def test_a_connect_timeout_is_the_endpoint_not_reached_too():
    from botocore.exceptions import ConnectTimeoutError

    client = StubBatchClient(answer=lambda entries: (_ for _ in ()).throw(ConnectTimeoutError(endpoint_url=QUEUE)))
    results, _, raised = deliver(SqsPublisher(client, queue_url=QUEUE), [message(1), message(2)])
    assert isinstance(raised, DownstreamUnavailable) and "ConnectTimeoutError" in str(raised) and results == {}


def test_eventbridge_a_source_the_message_chose_and_iam_refuses_dead_letters_that_message_only():
    # Given one event with a source of its own and one with the relay's, on the relay's bus
    def answer(entries):
        return ["NotAuthorizedForSourceException" if e["Source"] == "shop.orders" else None for e in entries]

    chosen = message(1, headers='{"source": "shop.orders"}')
    results, _, raised = deliver(EventBridgePublisher(StubEvents(answer=answer), bus="relay-bus"),
                                 [chosen, message(2)])
    # Then the chosen source's refusal is that message's fault; the batch goes on
    assert raised is None
    assert results[1].error_class is ErrorClass.PERMANENT and results[2].ok


def test_eventbridge_the_relays_own_source_refused_stops_the_batch():
    client = StubEvents(answer=lambda entries: ["NotAuthorizedForSourceException"] * len(entries))
    results, _, raised = deliver(EventBridgePublisher(client, bus="relay-bus"), [message(1)])
    assert isinstance(raised, StopBatch) and results == {}


def test_an_unexpected_error_in_a_call_is_transient_for_its_entries_and_the_other_calls_are_recorded():
    # Given a reply the publisher cannot read, for the second round's call only
    def answer(entries):
        if any(e["Id"] == "2" for e in entries):
            raise KeyError("Successful")
        return {}

    publisher = SqsPublisher(StubBatchClient(answer=answer), queue_url=QUEUE)
    results, recorded, raised = deliver(publisher, [message(1, key="a"), message(2, key="a"), message(3, key="b")])
    # Then its message is retried later (it may have arrived), and the first round's were recorded delivered
    assert raised is None
    assert results[2].error_class is ErrorClass.TRANSIENT and results[2].error == "sqs: KeyError"
    assert results[1].ok and results[3].ok and len(recorded) == 2


def test_eventbridge_an_event_naming_the_relays_own_bus_stops_the_batch_when_it_is_missing():
    # Naming the relay's own bus is no choice of the message's: its refusal is the relay's
    client = StubEvents(answer=lambda entries: ["ResourceNotFoundException"] * len(entries))
    results, _, raised = deliver(EventBridgePublisher(client, bus="relay-bus"), [message(1, destination="relay-bus")])
    assert isinstance(raised, StopBatch) and results == {}
