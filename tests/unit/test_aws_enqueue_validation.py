"""SQS, SNS and EventBridge messages: bad input is refused at enqueue with the field
named and nothing written; good input becomes the row the relay sends."""

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from test_enqueue_validation import RecordingConnection

from outbox_relay.errors import InvalidMessageError
from outbox_relay.producer import enqueue_eventbridge, enqueue_sns, enqueue_sqs
from outbox_relay.publishers.aws_message import DEFAULT_DESTINATION, MAX_AWS_MESSAGE_BYTES

PRODUCERS = {"sqs": enqueue_sqs, "sns": enqueue_sns, "eventbridge": enqueue_eventbridge}


def good(**overrides):
    args = dict(type="order.placed", payload={"order_id": "1042"})
    args.update(overrides)
    return args


# Bad values every one of the three refuses, each naming its field
COMMON = [
    (dict(type=""), "type", "at least 1 character"),
    (dict(type="  "), "type", "blank"),
    (dict(type=7), "type", "valid string"),
    (dict(type="t\x00"), "type", "NUL"),
    (dict(type="t" * 513), "type", "at most 512"),
    (dict(key=""), "key", "empty"),
    (dict(key="k" * 600), "key", "at most 512"),
    (dict(payload={"when": datetime.now()}), "payload", "JSON-serialisable"),
    (dict(payload={"x": float("nan")}), "payload", "JSON-serialisable"),
    (dict(payload={"x": "a\x00b"}), "payload", "NUL"),
    (dict(payload={"x": "x" * MAX_AWS_MESSAGE_BYTES}), "payload", "limit"),
    (dict(payload=None), "payload", "is required"),
    (dict(payload={"a": {True: 1}}), "payload.a", "key of type bool"),
    (dict(message_id="not-a-uuid"), "message_id", "UUID"),
    (dict(deliver_at=datetime(2030, 1, 1)), "deliver_at", "timezone-aware"),
    (dict(deliver_at=datetime.now(timezone.utc) + timedelta(days=367)), "deliver_at", "366 days ahead"),
    (dict(deliver_at=datetime(1970, 1, 1, tzinfo=timezone.utc)), "deliver_at", "366 days in the past"),
    (dict(deliver_at="2030-01-01T00:00:00+00:00"), "deliver_at", "valid datetime"),
    (dict(max_attempts=0), "max_attempts", "greater than or equal to 1"),
    (dict(max_attempts=1001), "max_attempts", "less than or equal to 1000"),
    (dict(max_attempts="3"), "max_attempts", "valid integer"),
    (dict(max_attempts=True), "max_attempts", "valid integer"),
]

# SQS and SNS carry headers as message attributes
ATTRIBUTES = [
    (dict(headers={"tenant": ""}), "headers.tenant", "must not be empty"),
    (dict(headers={"tenant": 5}), "headers.tenant", "valid string"),
    (dict(headers=["tenant"]), "headers", "valid dictionary"),
    (dict(headers={"outbox-message-id": "x"}), "headers.outbox-message-id", "relay's own"),
    (dict(headers={"outbox-type": "x"}), "headers.outbox-type", "relay's own"),
    (dict(headers={"outbox-key": "x"}), "headers.outbox-key", "relay's own"),
    (dict(headers={"AWS.trace": "x"}), "headers.AWS.trace", "not starting with 'AWS.'"),
    (dict(headers={"amazon.x": "x"}), "headers.amazon.x", "'Amazon.'"),
    (dict(headers={"a..b": "x"}), "headers.a..b", "doubled"),
    (dict(headers={".a": "x"}), "headers..a", "leading"),
    (dict(headers={"a b": "x"}), "headers.a b", "letters, digits"),
    (dict(headers={"h" * 257: "x"}), f"headers.{'h' * 257}", "1-256"),
    (dict(headers={f"h{i}": "v" for i in range(8)}), "headers", "at most 7"),
    # the attributes count in the 256 KiB: a payload that fits alone does not with them
    (dict(payload="x" * (MAX_AWS_MESSAGE_BYTES - 40)), "payload", "with its attributes"),
]

# SQS takes only XML characters in bodies and attributes
SQS_ONLY = [
    (dict(payload="\ufffe"), "payload", "U+FFFE"),
    (dict(type="t\x01"), "type", "U+0001"),
    (dict(key="k\x1b"), "key", "U+001B"),
    (dict(headers={"tenant": "a\x0bb"}), "headers.tenant", "U+000B"),
]

EVENTBRIDGE_ONLY = [
    (dict(payload=[1, 2]), "payload", "JSON object"),
    (dict(payload="text"), "payload", "JSON object"),
    (dict(payload={"outbox-message-id": "x"}), "payload.outbox-message-id", "relay's own"),
    (dict(source=""), "source", "at least 1 character"),
    (dict(source="aws.ec2"), "source", "aws."),
    (dict(source="AWS.Shop"), "source", "aws."),
    (dict(source=" shop"), "source", "blanks"),
    (dict(source="s" * 257), "source", "at most 256"),
    (dict(bus=""), "bus", "at least 1 character"),
    (dict(bus="my bus"), "bus", "event bus name"),
    (dict(bus="b" * 257), "bus", "event bus name"),
    (dict(bus="arn:aws:sqs:eu-west-1:123456789012:queue"), "bus", "event bus ARN"),
    (dict(headers={"a": "b"}), "headers", "unexpected keyword"),
    (dict(payload={"x": "x" * (MAX_AWS_MESSAGE_BYTES - 60)}), "payload", "limit is 262144"),
]

ROWS = ([(c, *row) for c in PRODUCERS for row in COMMON]
        + [(c, *row) for c in ("sqs", "sns") for row in ATTRIBUTES]
        + [("sqs", *row) for row in SQS_ONLY]
        + [("eventbridge", *row) for row in EVENTBRIDGE_ONLY])


@pytest.mark.parametrize(("channel", "overrides", "field", "fragment"), ROWS,
                         ids=[f"{c}-{f}-{i}" for i, (c, _, f, _) in enumerate(ROWS)])
def test_invalid_message_names_the_field_and_writes_nothing(channel, overrides, field, fragment):
    conn = RecordingConnection()
    with pytest.raises((InvalidMessageError, TypeError)) as info:
        PRODUCERS[channel](conn, **good(**overrides))
    if info.type is TypeError:
        # a keyword the function does not take (EventBridge has no headers): Python refuses it
        assert fragment in str(info.value) and field in str(info.value)
    else:
        assert info.value.field == field
        assert fragment in str(info.value), str(info.value)
        assert str(info.value).startswith(f"{field}: ") and "\n" not in str(info.value)
    assert conn.calls == []


@pytest.mark.parametrize("text", ["a\x0bb", "\ufffe"])
def test_what_sqs_refuses_sns_takes(text):
    # The XML-characters rule is SQS's own
    conn = RecordingConnection()
    enqueue_sns(conn, **good(payload=text, headers={"note": text}))
    assert len(conn.calls) == 1


def test_a_control_character_inside_the_json_payload_is_escaped_so_sqs_takes_it():
    conn = RecordingConnection()
    enqueue_sqs(conn, **good(payload={"x": "a\x01b"}))
    assert conn.calls[0][1]["payload"] == '{"x":"a\\u0001b"}'


@pytest.mark.parametrize("channel", ["sqs", "sns"])
def test_a_good_sqs_or_sns_message_is_one_row_for_the_relays_own_destination(channel):
    conn = RecordingConnection()
    mid = uuid.uuid4()
    when = datetime.now(timezone.utc) + timedelta(minutes=5)
    headers = {f"h{i}": "v" for i in range(7)}  # the most a message may carry
    assert PRODUCERS[channel](conn, **good(key="customer-77", headers=headers, message_id=str(mid),
                                           deliver_at=when, max_attempts=3)) == mid
    (_, row), = conn.calls
    assert row["channel"] == channel and row["destination"] == DEFAULT_DESTINATION
    assert row["payload"] == '{"order_id":"1042"}' and json.loads(row["headers"]) == headers
    assert (row["type"], row["key"], row["deliver_at"], row["max_attempts"]) == ("order.placed", "customer-77",
                                                                                 when, 3)


def test_an_eventbridge_event_stores_its_bus_as_destination_and_its_source_beside_it():
    conn = RecordingConnection()
    enqueue_eventbridge(conn, **good(source="shop.orders", bus="shop", key="k"))
    (_, row), = conn.calls
    assert row["channel"] == "eventbridge" and row["destination"] == "shop"
    assert json.loads(row["headers"]) == {"source": "shop.orders"}


def test_an_eventbridge_event_without_bus_or_source_goes_to_the_relays():
    conn = RecordingConnection()
    enqueue_eventbridge(conn, **good(bus=None, source=None))
    (_, row), = conn.calls
    assert row["destination"] == DEFAULT_DESTINATION and row["headers"] is None


def test_an_eventbridge_bus_may_be_an_arn():
    conn = RecordingConnection()
    arn = "arn:aws:events:eu-west-1:123456789012:event-bus/shop"
    enqueue_eventbridge(conn, **good(bus=arn))
    assert conn.calls[0][1]["destination"] == arn


@pytest.mark.parametrize("channel", sorted(PRODUCERS))
def test_anything_but_a_connection_or_session_is_refused_naming_conn(channel):
    with pytest.raises(InvalidMessageError) as info:
        PRODUCERS[channel](None, **good())
    assert info.value.field == "conn"
