"""Message ids are UUIDv7 (RFC 9562) whether the SQL functions or the Python API
make them (docs/decisions/0060): the layout, the database's clock, time order
across both, and UUIDv4 ids (rows written before, idempotency keys) working as before."""

from __future__ import annotations

import uuid
from importlib import import_module

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool
from test_migrations import downgrade

from outbox_migrations import upgrade
from outbox_relay.ids import uuid7
from outbox_relay.models import ErrorClass, Outcome, OutcomeKind
from outbox_relay.operations.dead import get_message
from outbox_relay.operations.redrive import RedriveSelection, redrive
from outbox_relay.producer import enqueue_event
from support.sql_functions import call
from support.uuid_fields import fields

_0013 = import_module("outbox_migrations.versions.0013_uuidv7_message_ids")
#: Every function that makes a message id: the four that make one and the two that call one of them.
SQL_CALLS = {
    "event": dict(stream="s", type="t", payload={}),
    "sqs": dict(type="t", payload={}),
    "sns": dict(type="t", payload={}),
    "eventbridge": dict(type="t", payload={}),
    "email": {"to": ["a@example.com"], "subject": "s", "text": "t"},
}


def test_sql_ids_have_the_rfc_layout_and_the_database_clock(app_engine):
    with app_engine.connect() as c:
        made, now = c.execute(text("SELECT outbox_uuidv7(), extract(epoch FROM clock_timestamp())")).one()
        ms, ver, _, var, _ = fields(made)
        assert (ver, var) == (7, 0b10) and (made.version, made.variant) == (7, uuid.RFC_4122)
        assert abs(ms / 1000 - float(now)) < 1
        # PostgreSQL reads the same timestamp from the first six bytes (big-endian milliseconds)
        assert c.execute(text("SELECT ('x' || left(replace(CAST(:u AS text), '-', ''), 12))::bit(48)::bigint"),
                         {"u": str(made)}).scalar_one() == ms


def test_sql_ids_made_in_sequence_sort_in_that_order_as_uuids_and_as_text(app_engine):
    order = text("""
        SELECT array_agg(id ORDER BY n) = array_agg(id ORDER BY id),
               array_agg(id ORDER BY n) = array_agg(id ORDER BY id::text),
               count(DISTINCT id), array_agg(id ORDER BY n)
          FROM (SELECT n, outbox_uuidv7() AS id FROM generate_series(1, 5000) AS n) s""")
    with app_engine.connect() as c:
        as_uuid, as_text, distinct, made = c.execute(order).one()  # one statement, 5,000 ids
        assert as_uuid and as_text and distinct == 5000
        one_by_one = [c.execute(text("SELECT outbox_uuidv7()")).scalar_one() for _ in range(200)]
    assert sorted(made) == made and sorted(str(u) for u in made) == [str(u) for u in made]
    assert sorted(one_by_one) == one_by_one and made[-1] < one_by_one[0]


def test_every_sql_function_makes_a_v7_id_and_keeps_a_given_one_as_given(app_engine):
    given = {name: uuid.uuid4() for name in SQL_CALLS}
    with app_engine.begin() as c:
        made = {name: call(c, name, **args) for name, args in SQL_CALLS.items()}
        for name, args in SQL_CALLS.items():
            assert call(c, name, **args, message_id=given[name]) == given[name]
            assert call(c, name, **args, message_id=given[name]) == given[name]  # the idempotency key again
    assert all(u.version == 7 for u in made.values()), made
    with app_engine.connect() as c:
        stored = c.execute(text("SELECT message_id FROM outbox_message ORDER BY seq")).scalars().all()
    assert stored == [made[n] for n in SQL_CALLS] + [given[n] for n in SQL_CALLS]


def test_python_and_sql_ids_interleave_in_the_order_they_were_made(app_engine, redis_prefix):
    with app_engine.begin() as c:
        for i in range(100):
            enqueue_event(c, stream=redis_prefix + "s", type="t", payload={"i": i})
            call(c, "event", stream=redis_prefix + "s", type="t", payload={"i": i})
    with app_engine.connect() as c:
        by_seq = c.execute(text("SELECT message_id FROM outbox_message ORDER BY seq")).scalars().all()
        by_id = c.execute(text("SELECT message_id FROM outbox_message ORDER BY message_id")).scalars().all()
        # and the bare generators, one after the other on one connection
        both = []
        for _ in range(100):
            both += [uuid7(), c.execute(text("SELECT outbox_uuidv7()")).scalar_one()]
    assert len(by_seq) == 200 and by_seq == by_id
    assert sorted(both) == both


def test_uuidv4_ids_are_enqueued_claimed_shown_and_redriven_by_id(app_engine, store, redis_prefix):
    v4_py, v4_sql = uuid.uuid4(), uuid.uuid4()
    with app_engine.begin() as c:
        assert enqueue_event(c, stream=redis_prefix + "s", type="t", payload={"v": 4}, message_id=v4_py) == v4_py
        assert call(c, "event", stream=redis_prefix + "s", type="t", payload={"v": 4}, message_id=v4_sql) == v4_sql
        v7 = enqueue_event(c, stream=redis_prefix + "s", type="t", payload={"v": 7})
    claimed = store.claim("owner-a", 10, 30).messages
    assert [m.message_id for m in claimed] == [str(v4_py), str(v4_sql), str(v7)]
    store.record("owner-a", [Outcome(m.seq, OutcomeKind.DEAD, ErrorClass.PERMANENT, "no") for m in claimed])
    assert get_message(app_engine, v4_py).status.value == "dead"
    assert redrive(app_engine, RedriveSelection(message_ids=(v4_py, v4_sql))).moved == 2
    assert [get_message(app_engine, m).status.value for m in (v4_py, v4_sql, v7)] == ["pending", "pending", "dead"]
    assert [m.message_id for m in store.claim("owner-b", 10, 30).messages] == [str(v4_py), str(v4_sql)]


def _definitions(c) -> dict[str, str]:
    return dict(c.execute(text("SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
                               "WHERE p.proname LIKE 'outbox%' ORDER BY 1")).all())


def test_the_migration_leaves_old_ids_alone_and_its_downgrade_puts_back_every_function(empty_database_url):
    engine = create_engine(empty_database_url, poolclass=NullPool)
    before = _0013.down_revision
    try:
        upgrade(engine, before)
        with engine.begin() as c:
            old = call(c, "event", stream="s", type="t", payload={})
            functions = _definitions(c)
        assert old.version == 4 and "outbox_uuidv7" not in functions
        upgrade(engine, _0013.revision)  # this migration alone: later ones change other functions
        with engine.begin() as c:
            new = call(c, "event", stream="s", type="t", payload={})
            changed = {n: d for n, d in _definitions(c).items() if functions.get(n) != d}
            kept = c.execute(text("SELECT message_id FROM outbox_message ORDER BY seq")).scalars().all()
        assert new.version == 7 and kept == [old, new]
        # the functions that made ids, and no other, each with that one call changed
        assert set(changed) == set(_0013.MAKERS) | {"outbox_uuidv7"}
        for name in _0013.MAKERS:
            assert changed[name] == functions[name].replace("gen_random_uuid()", "outbox_uuidv7()")
        downgrade(engine, before)
        with engine.begin() as c:
            assert _definitions(c) == functions
            assert call(c, "event", stream="s", type="t", payload={}).version == 4
        upgrade(engine)  # and up again
    finally:
        engine.dispose()
