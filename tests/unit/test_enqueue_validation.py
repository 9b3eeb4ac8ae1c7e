"""Bad input is refused at enqueue with the field named, and nothing is written."""

import json
import math
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from outbox_relay.errors import InvalidMessageError
from outbox_relay.producer import enqueue_event, enqueue_events_bulk
from outbox_relay.publishers.redis.message import MAX_EVENT_PAYLOAD_BYTES


class RecordingConnection:
    """Stands in for a SQLAlchemy Connection: records statements, opens no socket."""

    def __init__(self):
        self.calls = []

    def execute(self, statement, params=None):
        self.calls.append((statement, params))
        return self

    def one(self):
        return (1, None)  # inserted, nothing to compare

    def scalars(self):
        return self

    def all(self):
        return []  # bulk: no message id taken by another message


def good(**overrides):
    args = dict(stream="orders", type="order.placed", payload={"id": 1})
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        (dict(stream=""), "stream", "at least 1 character"),
        (dict(stream="  "), "stream", "blank"),
        (dict(stream="a{b"), "stream", "hash tag"),
        (dict(stream="a}b"), "stream", "hash tag"),
        (dict(stream="{}x"), "stream", "hash tag"),
        (dict(stream="{a}}"), "stream", "hash tag"),
        (dict(stream="{a}{b}"), "stream", "hash tag"),
        (dict(stream="x_{a}b{c}"), "stream", "hash tag"),
        (dict(stream=7), "stream", "valid string"),
        (dict(type=""), "type", "at least 1 character"),
        (dict(type=" "), "type", "blank"),
        (dict(key=""), "key", "empty"),
        (dict(payload={"when": datetime.now()}), "payload", "JSON-serialisable"),
        (dict(payload={"x": math.nan}), "payload", "JSON-serialisable"),
        (dict(payload={"x": "a\x00b"}), "payload", "NUL"),
        (dict(payload="x" * MAX_EVENT_PAYLOAD_BYTES), "payload", "limit"),
        # Decision 0057: a payload left unset; keys json.dumps would have turned into text
        (dict(payload=None), "payload", "is required"),
        (dict(payload={1: "a"}), "payload", "key of type int"),
        (dict(payload={"a": [{"b": {None: 1}}]}), "payload.a[0].b", "key of type NoneType"),
        (dict(message_id="not-a-uuid"), "message_id", "UUID"),
        (dict(deliver_at=datetime(2030, 1, 1)), "deliver_at", "timezone-aware"),
        (dict(deliver_at=datetime(9999, 12, 31, tzinfo=timezone.utc)), "deliver_at", "366 days ahead"),
        (dict(deliver_at=datetime.now(timezone.utc) + timedelta(days=367)), "deliver_at", "366 days ahead"),
        (dict(deliver_at=datetime(1, 1, 1, tzinfo=timezone.utc)), "deliver_at", "366 days in the past"),
        (dict(deliver_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=9)))), "deliver_at", "in the past"),
        (dict(deliver_at=datetime(1970, 1, 1, tzinfo=timezone.utc)), "deliver_at", "366 days in the past"),
        (dict(max_attempts=0), "max_attempts", "greater than or equal to 1"),
        # Documented as a datetime and an int: text and other numbers are refused, not converted
        (dict(deliver_at=(datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()), "deliver_at",
         "valid datetime"),
        (dict(deliver_at=1_900_000_000), "deliver_at", "valid datetime"),
        (dict(max_attempts="3"), "max_attempts", "valid integer"),
        (dict(max_attempts=3.0), "max_attempts", "valid integer"),
        (dict(max_attempts=True), "max_attempts", "valid integer"),
        (dict(key="k" * 600), "key", "at most 512"),
        (dict(headers={"trace": 5}), "headers.trace", "valid string"),
    ],
)
def test_invalid_event_names_the_field_and_writes_nothing(overrides, field, fragment):
    conn = RecordingConnection()
    with pytest.raises(InvalidMessageError) as info:
        enqueue_event(conn, **good(**overrides))
    assert info.value.field == field
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"{field}: ")
    assert conn.calls == []


def test_valid_event_is_written_once_with_its_id():
    conn = RecordingConnection()
    mid = uuid.uuid4()
    when = datetime.now(timezone.utc) + timedelta(minutes=5)
    assert enqueue_event(conn, **good(message_id=str(mid), deliver_at=when, key="k1")) == mid
    (_, params), = conn.calls
    assert params["message_id"] == mid and params["destination"] == "orders" and params["deliver_at"] == when
    assert params["payload"] == '{"id":1}'


@pytest.mark.parametrize("days", [-365, -1, 0, 1, 365])
def test_a_deliver_at_within_a_year_either_way_is_accepted(days):
    conn = RecordingConnection()
    when = datetime.now(timezone.utc) + timedelta(days=days)
    enqueue_event(conn, **good(deliver_at=when))
    assert conn.calls[0][1]["deliver_at"] == when


def test_unicode_payload_is_kept_as_utf8_json():
    conn = RecordingConnection()
    enqueue_event(conn, **good(payload={"note": "맵게 🌶️ crème"}))
    assert conn.calls[0][1]["payload"] == '{"note":"맵게 🌶️ crème"}'


def test_bulk_validates_everything_before_writing():
    conn = RecordingConnection()
    messages = [good(payload={"n": i}) for i in range(5)] + [good(type="")]
    with pytest.raises(InvalidMessageError) as info:
        enqueue_events_bulk(conn, messages)
    assert info.value.field == "messages[5].type"
    assert conn.calls == []


def test_bulk_refuses_an_empty_key_by_position():
    # An empty key would be stored but published without a `key` field: it reads as no key
    conn = RecordingConnection()
    with pytest.raises(InvalidMessageError) as info:
        enqueue_events_bulk(conn, [good(key="a"), good(key="b"), good(key="c"), good(key="")])
    assert info.value.field == "messages[3].key" and "leave it out" in info.value.problem
    assert conn.calls == []


def test_bulk_uses_one_statement_per_chunk():
    conn = RecordingConnection()
    ids = enqueue_events_bulk(conn, [good(payload={"n": i}) for i in range(2500)])
    assert len(ids) == 2500 and len(set(ids)) == 2500
    assert [len(json.loads(p["messages"])) for _, p in conn.calls] == [1000, 1000, 500]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(stream="a\x00b"), "stream"),
        (dict(type="t\x00"), "type"),
        (dict(key="k\x00"), "key"),
        (dict(stream="s\ud800"), "stream"),
        (dict(payload="\ud800"), "payload"),
        (dict(payload={"k": "\udfff"}), "payload"),
    ],
)
def test_text_postgresql_or_utf8_cannot_hold_is_refused(overrides, field):
    conn = RecordingConnection()
    with pytest.raises(InvalidMessageError) as info:
        enqueue_event(conn, **good(**overrides))
    assert info.value.field == field
    assert conn.calls == []


def test_deeply_nested_payload_is_refused_not_crashing():
    payload: list = []
    for _ in range(100_000):
        payload = [payload]
    with pytest.raises(InvalidMessageError) as info:
        enqueue_event(RecordingConnection(), **good(payload=payload))
    assert info.value.field == "payload"


def test_bulk_refuses_a_deliver_at_as_text_by_position():
    conn = RecordingConnection()
    with pytest.raises(InvalidMessageError) as info:
        enqueue_events_bulk(conn, [good(), good(deliver_at="2026-12-02T00:00:00+00:00")])
    assert info.value.field == "messages[1].deliver_at" and conn.calls == []


def _not_a_transaction():
    """What callers pass by mistake instead of their transaction's Connection or Session."""
    import sqlite3

    from sqlalchemy import create_engine

    return [("None", None),
            ("an Engine", create_engine("postgresql+pg8000://app@db.invalid/shop")),  # connects to nothing
            ("a DB-API connection", sqlite3.connect(":memory:"))]


@pytest.mark.parametrize("call", ["event", "bulk", "email"])
@pytest.mark.parametrize(("kind", "conn"), _not_a_transaction(), ids=lambda v: v if isinstance(v, str) else "")
def test_anything_but_a_connection_or_session_is_refused_naming_conn(call, kind, conn):
    from outbox_relay.producer import enqueue_email

    write = {"event": lambda: enqueue_event(conn, **good()),
             "bulk": lambda: enqueue_events_bulk(conn, [good()]),
             "email": lambda: enqueue_email(conn, to="a@example.com", subject="s", text="t")}[call]
    with pytest.raises(InvalidMessageError) as info:
        write()
    assert info.value.field == "conn"
    assert "SQLAlchemy Connection or Session" in str(info.value) and "\n" not in str(info.value)
