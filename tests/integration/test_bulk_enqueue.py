"""`enqueue_events_bulk` on the real PostgreSQL: one round trip per chunk of
1,000, every field stored, validation before anything is written, idempotent
on message ids, and inside the caller's transaction."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import event, text
from sqlalchemy.orm import Session

from outbox_relay.errors import InvalidMessageError
from outbox_relay.producer import BULK_CHUNK, enqueue_events_bulk


@pytest.fixture
def statements(app_engine):
    """Every statement the engine sends to PostgreSQL, as SQL text."""
    seen: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        seen.append(statement)

    event.listen(app_engine, "before_cursor_execute", count)
    yield seen
    event.remove(app_engine, "before_cursor_execute", count)


def inserts(statements: list[str]) -> list[str]:
    """The statements that write outbox rows (bodies and states, one statement)."""
    return [s for s in statements
            if re.search(r"INSERT INTO outbox_message\s", s) and "INSERT INTO outbox_message_body" in s]


def stored(app_engine) -> list[dict]:
    with app_engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(
            "SELECT o.*, b.payload, b.headers, o.available_at <= now() AS due, "
            "octet_length(b.payload::text) AS body_bytes "
            "FROM outbox_message o JOIN outbox_message_body b ON b.seq = o.seq AND b.message_id = o.message_id "
            "ORDER BY o.seq"))]


def events(n: int, prefix: str, **extra) -> list[dict]:
    return [dict(stream=f"{prefix}orders", type="order.placed", payload={"n": i}, **extra) for i in range(n)]


def test_one_round_trip_per_chunk(app_engine, statements, redis_prefix):
    for n, round_trips in [(1, 1), (BULK_CHUNK, 1), (BULK_CHUNK + 1, 2), (2500, 3)]:
        # Given n messages written in one application transaction
        with app_engine.begin() as conn:
            conn.execute(text("TRUNCATE outbox_message, outbox_message_body"))
            statements.clear()
            ids = enqueue_events_bulk(conn, events(n, redis_prefix))
            sent = list(statements)
        # Then exactly one INSERT went to the server per chunk of 1,000, and nothing else
        assert len(inserts(sent)) == round_trips and len(sent) == round_trips, n
        # And every message is a pending row, due now, in the order given
        rows = stored(app_engine)
        assert [r["message_id"] for r in rows] == ids and len(set(ids)) == n
        assert [r["payload"] for r in rows] == [{"n": i} for i in range(n)]
        assert {(r["status"], r["attempts"], r["channel"], r["due"]) for r in rows} == {("pending", 0, "redis", True)}


def test_every_field_is_stored(app_engine, redis_prefix):
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    mid = uuid.uuid4()
    messages = [
        dict(stream=f"{redis_prefix}orders", type="order.placed", payload={"total": 12.5, "note": "größe ✓"},
             key="customer-7", message_id=mid, max_attempts=4, headers={"trace": "abc"}),
        dict(stream=f"{{{redis_prefix}tag}}:invoices", type="invoice.sent", payload=[1, 2, 3], deliver_at=later),
        dict(stream=f"{redis_prefix}orders", type="order.paid", payload=False),
        # Texts an array literal would read as SQL NULL if unquoted
        dict(stream=f"{redis_prefix}null", type="Null", payload="NULL", key="null", headers={"h": "null"}),
    ]
    with app_engine.begin() as conn:
        ids = enqueue_events_bulk(conn, iter(messages))  # any iterable
    first, second, third, fourth = stored(app_engine)
    assert ids[0] == mid and first["message_id"] == mid
    assert (first["destination"], first["type"], first["key"], first["max_attempts"]) == \
        (f"{redis_prefix}orders", "order.placed", "customer-7", 4)
    assert first["payload"] == {"total": 12.5, "note": "größe ✓"} and first["headers"] == {"trace": "abc"}
    assert first["due"] is True
    # the claim's byte budget reads payload_bytes: the UTF-8 size of the stored JSON text
    assert [r["payload_bytes"] for r in (first, second, third, fourth)] == \
        [r["body_bytes"] for r in (first, second, third, fourth)]
    assert first["payload_bytes"] == len('{"total":12.5,"note":"größe ✓"}'.encode())
    assert second["destination"] == f"{{{redis_prefix}tag}}:invoices" and second["payload"] == [1, 2, 3]
    assert second["due"] is False and abs((second["available_at"] - later).total_seconds()) < 0.001
    assert (second["key"], second["headers"], second["max_attempts"]) == (None, None, None)
    assert third["payload"] is False and third["type"] == "order.paid"  # a JSON scalar, stored as it is
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT json_typeof(payload) FROM outbox_message_body WHERE seq = :s"),
                            {"s": third["seq"]}).scalar_one() == "boolean"
    assert (fourth["destination"], fourth["type"], fourth["key"], fourth["payload"], fourth["headers"]) == \
        (f"{redis_prefix}null", "Null", "null", "NULL", {"h": "null"})


def test_an_invalid_message_names_its_position_and_nothing_is_written(app_engine, statements, redis_prefix):
    for bad, field in [
        ({"payload": float("nan")}, "messages[1502].payload"),
        ({"stream": ""}, "messages[1502].stream"),
        ({"type": "  "}, "messages[1502].type"),
        ({"max_attempts": 0}, "messages[1502].max_attempts"),
        ({"deliver_at": datetime(2030, 1, 1)}, "messages[1502].deliver_at"),
        ({"message_id": "not-a-uuid"}, "messages[1502].message_id"),
        ({"colour": "red"}, "messages[1502].colour"),
        # Decision 0057: a payload left unset, and keys json.dumps would have turned into text
        ({"payload": None}, "messages[1502].payload"),
        ({"payload": {"lines": [{"sku": "a", 1: "b"}]}}, "messages[1502].payload.lines[0]"),
    ]:
        # Given 2,000 messages of which #1502 is invalid (after a whole valid chunk)
        messages = events(2000, redis_prefix)
        messages[1502] = {**messages[1502], **bad}
        with app_engine.begin() as conn:
            statements.clear()
            with pytest.raises(InvalidMessageError) as info:
                enqueue_events_bulk(conn, messages)
            sent = list(statements)
        # Then the error names the message and its field, and no INSERT was sent
        assert info.value.field == field
        assert str(info.value).startswith(f"{field}: ")
        assert inserts(sent) == [] and stored(app_engine) == []


@pytest.mark.parametrize(("messages", "field", "problem"), [
    ({"stream": "orders", "type": "t", "payload": {}}, "messages", "must be a list of mappings"),
    ("orders", "messages", "must be a list of mappings"),
    (None, "messages", "must be a list of mappings"),
    ([{"stream": "orders", "type": "t", "payload": {}}, ("stream", "orders")], "messages[1]", "must be a mapping"),
])
def test_messages_that_are_not_a_list_of_mappings_are_named_and_nothing_is_written(app_engine, messages, field,
                                                                                      problem):
    with app_engine.begin() as conn:
        with pytest.raises(InvalidMessageError) as info:
            enqueue_events_bulk(conn, messages)
    assert (info.value.field, info.value.problem.split(" (")[0]) == (field, problem)
    assert stored(app_engine) == []


def test_idempotent_on_message_ids(app_engine, redis_prefix):
    ids = [uuid.uuid4() for _ in range(1200)]
    with app_engine.begin() as conn:
        first = enqueue_events_bulk(conn, [dict(stream=f"{redis_prefix}s", type="t", payload={"v": 1},
                                                message_id=i) for i in ids])
    # The same messages again (a retried request), ids as text, plus one new message
    new = uuid.uuid4()
    with app_engine.begin() as conn:
        again = enqueue_events_bulk(conn, [dict(stream=f"{redis_prefix}s", type="t", payload={"v": 1},
                                                message_id=str(i)) for i in ids + [new]])
    assert first == ids and again == ids + [new]
    rows = stored(app_engine)
    assert len(rows) == 1201 and [r["payload"] for r in rows[:1200]] == [{"v": 1}] * 1200
    assert rows[-1]["message_id"] == new


def test_an_id_taken_by_a_different_message_is_refused_by_position(app_engine, redis_prefix):
    ids = [uuid.uuid4() for _ in range(1200)]
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=f"{redis_prefix}s", type="t", payload={"v": 1}, message_id=i)
                                   for i in ids])
    # A call reusing one of them (in its second chunk) for another payload, among new messages
    batch = [dict(stream=f"{redis_prefix}s", type="t", payload={"v": 1}) for _ in range(1500)]
    batch[1100] = dict(stream=f"{redis_prefix}s", type="t", payload={"v": 2}, message_id=ids[1150])
    with pytest.raises(InvalidMessageError) as caught:
        with app_engine.begin() as conn:
            enqueue_events_bulk(conn, batch)
    assert caught.value.field == "messages[1100].message_id" and "different message" in str(caught.value)
    # Then nothing of that call was kept (the exception left the transaction), the first write stands
    rows = stored(app_engine)
    assert len(rows) == 1200 and {r["payload"]["v"] for r in rows} == {1}
    # And a different stream or key under a used id is refused too
    for change in (dict(stream=f"{redis_prefix}other"), dict(key="k")):
        with pytest.raises(InvalidMessageError, match="different message"):
            with app_engine.begin() as conn:
                enqueue_events_bulk(conn, [{**dict(stream=f"{redis_prefix}s", type="t", payload={"v": 1},
                                                   message_id=ids[0]), **change}])


def test_a_repeated_id_within_one_call_is_written_once(app_engine, redis_prefix, statements):
    mid = uuid.uuid4()
    with app_engine.begin() as conn:
        ids = enqueue_events_bulk(conn, [dict(stream=f"{redis_prefix}s", type="t", payload={"v": 1}, message_id=mid)
                                         for _ in range(2)])
    assert ids == [mid, mid]
    assert [(r["message_id"], r["payload"]) for r in stored(app_engine)] == [(mid, {"v": 1})]
    # Two different messages under one id in one call: refused before anything is sent
    statements.clear()
    with pytest.raises(InvalidMessageError) as caught:
        with app_engine.begin() as conn:
            enqueue_events_bulk(conn, [dict(stream=f"{redis_prefix}s", type="t", payload={"v": v}, message_id=m)
                                       for v, m in ((1, uuid.uuid4()), (2, mid), (3, mid))])
    assert caught.value.field == "messages[2].message_id" and not inserts(statements)


def test_a_repeated_id_within_one_call_is_compared_as_a_json_value(app_engine, redis_prefix, statements):
    # Given one id twice in one call, for the same payload with its keys in another order
    mid = uuid.uuid4()
    same = [dict(stream=f"{redis_prefix}s", type="t", payload=p, message_id=mid)
            for p in ({"a": 1, "b": [1.5, {"x": None}]}, {"b": [1.5, {"x": None}], "a": 1.0})]
    with app_engine.begin() as conn:
        ids = enqueue_events_bulk(conn, same)
    # Then it is the same message, as it would be against a stored one (jsonb): written once, as first given
    assert ids == [mid, mid]
    assert [(r["message_id"], r["payload"]) for r in stored(app_engine)] == [(mid, {"a": 1, "b": [1.5, {"x": None}]})]
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT payload::text FROM outbox_message_body")).scalar_one() == \
            '{"a":1,"b":[1.5,{"x":null}]}'
    # And a payload that is another JSON value (true is not 1) is refused before anything is sent
    other = uuid.uuid4()
    statements.clear()
    with pytest.raises(InvalidMessageError) as caught:
        with app_engine.begin() as conn:
            enqueue_events_bulk(conn, [dict(stream=f"{redis_prefix}s", type="t", payload={"v": v}, message_id=other)
                                       for v in (1, True)])
    assert caught.value.field == "messages[1].message_id" and not inserts(statements)


@pytest.mark.parametrize(("a", "b"), [
    ('{"a":1,"b":2}', '{"b":2,"a":1}'), ('{"v":1}', '{"v":1.0}'), ('{"v":1}', '{"v":true}'), ('100', '1e2'),
    ('-0', '0'), ('{"a":1,"a":2}', '{"a":2}'), ('[1,2]', '[2,1]'), ('"é"', '"\\u00e9"'), ('null', '{}'),
    ('{"v":false}', '{"v":0}'), ('"1"', '1'), ('[[]]', '[{}]'), ('0.1', '0.10'),
])
def test_the_comparison_within_a_call_is_the_one_against_a_stored_message(app_engine, a, b):
    from outbox_relay.producer import _same_json

    with app_engine.connect() as conn:
        jsonb = conn.execute(text("SELECT CAST(:a AS jsonb) = CAST(:b AS jsonb)"), {"a": a, "b": b}).scalar_one()
    assert _same_json(a, b) is jsonb


def test_rolled_back_with_the_business_change(app_engine, redis_prefix):
    with pytest.raises(RuntimeError):
        with app_engine.begin() as conn:
            enqueue_events_bulk(conn, events(1500, redis_prefix))
            raise RuntimeError("the business change failed")
    assert stored(app_engine) == []


def test_works_with_an_orm_session_and_an_empty_list(app_engine, statements, redis_prefix):
    with Session(app_engine) as session, session.begin():
        statements.clear()
        assert enqueue_events_bulk(session, []) == []
        assert statements == []
        ids = enqueue_events_bulk(session, events(3, redis_prefix))
    assert [r["message_id"] for r in stored(app_engine)] == ids


def test_a_pg8000_connection_is_refused_in_one_line_and_nothing_is_written(app_engine, redis_prefix):
    from outbox_relay.producer import enqueue_email, enqueue_event

    # Given a plain DB-API connection of pg8000 in an open transaction, not SQLAlchemy's
    fairy = app_engine.raw_connection()
    dbapi = fairy.dbapi_connection
    try:
        # When each producer call is given it, each refuses it, naming `conn`
        for write in (lambda: enqueue_event(dbapi, stream=redis_prefix + "o", type="t", payload={}),
                      lambda: enqueue_events_bulk(dbapi, events(2, redis_prefix)),
                      lambda: enqueue_email(dbapi, to="a@example.com", subject="s", text="t")):
            with pytest.raises(InvalidMessageError, match="^conn: .*SQLAlchemy Connection or Session"):
                write()
        dbapi.commit()
    finally:
        fairy.close()
    # Then nothing was written
    assert stored(app_engine) == []



MEASURE_BULK = r"""
import json, sys, tracemalloc
from sqlalchemy import create_engine, event
from sqlalchemy.pool import NullPool
from outbox_relay.producer import enqueue_events_bulk

url, stream, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
blob = "x" * (size - len('{"blob":""}'))   # one string shared by every message: the caller holds it once
messages = [dict(stream=stream, type="big", payload={"blob": blob}) for _ in range(n)]
engine = create_engine(url, poolclass=NullPool)
sent = []
event.listen(engine, "before_cursor_execute", lambda conn, cursor, statement, parameters, context, many:
             sent.append(sum(len(p) for p in (parameters.values() if isinstance(parameters, dict) else parameters)
                             if isinstance(p, str))))
with engine.connect() as conn:
    conn.exec_driver_sql("SELECT 1")
    conn.commit()
    sent.clear()
    tracemalloc.start()
    with conn.begin():
        ids = enqueue_events_bulk(conn, messages)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
print(json.dumps({"peak": peak, "ids": len(ids), "statements": sent}))
"""


@pytest.mark.slow
def test_a_bulk_of_large_payloads_is_written_in_bounded_memory(database_url, app_engine, redis_prefix):
    import json
    import subprocess
    import sys

    from outbox_relay.producer import BULK_CHUNK_BYTES
    from outbox_relay.publishers.redis.message import MAX_EVENT_PAYLOAD_BYTES

    # Given 400 payloads of 256 KiB each (100 MiB of JSON text), enqueued in one call by a process of its own
    n = 400
    proc = subprocess.run([sys.executable, "-c", MEASURE_BULK, database_url, f"{redis_prefix}big", str(n),
                           str(MAX_EVENT_PAYLOAD_BYTES)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout)
    # Then every message is stored
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one() == measured["ids"] == n
    # And the call's peak memory is a few statements' worth, far below the 100 MiB it wrote
    assert measured["peak"] < 6 * BULK_CHUNK_BYTES, measured["peak"]
    # Because it went in statements of at most BULK_CHUNK_BYTES of JSON text each
    per_statement = BULK_CHUNK_BYTES // MAX_EVENT_PAYLOAD_BYTES
    assert len(measured["statements"]) == -(-n // per_statement)
    assert max(measured["statements"]) < 1.1 * BULK_CHUNK_BYTES
