"""Migrations carry existing messages across schema changes, both ways.

A database at revision 0001 (payload as jsonb in the state row) with messages
in every state is upgraded to head (0002: json; 0003: bodies in
outbox_message_body), checked, used, and downgraded back to 0001.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Iterator

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from outbox_migrations import current_revision, head_revision, script_location, upgrade
from outbox_relay.operations.partitions import manage_days, partitions
from outbox_relay.producer import enqueue_event
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore
from outbox_tools.servers import create_database, drop_database, with_database


def downgrade(engine: Engine, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


@pytest.fixture
def old_engine(servers) -> Iterator[Engine]:
    name = f"outbox_test_{uuid.uuid4().hex[:8]}_migrations"
    drop_database(servers.database_url, name)
    create_database(servers.database_url, name)
    engine = create_engine(with_database(servers.database_url, name), poolclass=NullPool)
    yield engine
    engine.dispose()
    drop_database(servers.database_url, name)


OLD_ROW = text(
    """
    INSERT INTO outbox_message (message_id, channel, destination, type, key, payload, headers, status,
                                attempts, delivered_at, delivery_ref)
    VALUES (:id, 'redis', 'orders', 'order.placed', :key, CAST(:payload AS jsonb), CAST(:headers AS jsonb),
            :status, :attempts, CASE WHEN :status = 'delivered' THEN now() END,
            CASE WHEN :status = 'delivered' THEN '1-0' END)
    RETURNING seq
    """
)


def test_upgrade_keeps_every_message_and_downgrade_restores_them(old_engine, redis_prefix):
    # Given a database at 0001 with messages in two states, one with headers and non-ASCII text
    upgrade(old_engine, "0001")
    old = [
        dict(id=uuid.uuid4(), key="k-1", payload={"total": "9.90", "note": "größe ✓"}, headers={"trace": "t"},
             status="pending", attempts=0),
        dict(id=uuid.uuid4(), key=None, payload=[1, 2], headers=None, status="delivered", attempts=1),
    ]
    with old_engine.begin() as conn:
        seqs = [conn.execute(OLD_ROW, {**m, "payload": json.dumps(m["payload"]),
                                       "headers": json.dumps(m["headers"]) if m["headers"] else None}).scalar_one()
                for m in old]

    # When it is upgraded to head
    upgrade(old_engine)

    # Then each message is a state row and a body with the same seq, id, payload and headers
    with old_engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT o.seq, o.message_id, o.status, o.payload_bytes, b.payload, b.headers, "
            "octet_length(b.payload::text) AS body_bytes "
            "FROM outbox_message o JOIN outbox_message_body b ON b.seq = o.seq AND b.message_id = o.message_id "
            "ORDER BY o.seq")).mappings().all()
    assert [r["seq"] for r in rows] == seqs
    assert [(r["message_id"], r["status"], r["payload"], r["headers"]) for r in rows] == \
        [(m["id"], m["status"], m["payload"], m["headers"]) for m in old]
    assert all(r["payload_bytes"] == r["body_bytes"] for r in rows)

    # And the old message ids are still idempotency keys; new messages get later seqs
    with old_engine.begin() as conn:
        assert enqueue_event(conn, stream="orders", type="order.placed",
                             payload={"total": "9.90", "note": "größe ✓"}, key="k-1", message_id=old[0]["id"]) \
            == old[0]["id"]
        new_id = enqueue_event(conn, stream=redis_prefix + "orders", type="order.placed", payload={"n": 3})
    with old_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one() == 3
        new_seq = conn.execute(text("SELECT seq FROM outbox_message_body WHERE message_id = :i"),
                               {"i": new_id}).scalar_one()
    assert new_seq > max(seqs)

    # And the relay claims the pending ones with their payloads
    store = LeaseStore(create_engine(old_engine.url, isolation_level="AUTOCOMMIT", poolclass=NullPool),
                       Channel.REDIS, default_max_attempts=5)
    claimed = store.claim("owner", 10, 30).messages
    assert [(m.message_id, json.loads(m.payload_json)) for m in claimed] == \
        [(str(old[0]["id"]), old[0]["payload"]), (str(new_id), {"n": 3})]
    store.engine.dispose()

    # When it is downgraded to 0001 again, every message keeps its payload
    downgrade(old_engine, "0001")
    with old_engine.connect() as conn:
        back = conn.execute(text("SELECT seq, message_id, payload, headers FROM outbox_message ORDER BY seq")).all()
        assert conn.execute(text("SELECT to_regclass('outbox_message_body')")).scalar_one() is None
    assert [(r.message_id, r.payload, r.headers) for r in back] == \
        [(m["id"], m["payload"], m["headers"]) for m in old] + [(new_id, {"n": 3}, None)]
    with old_engine.begin() as conn:  # and the identity goes on after the highest seq
        seq = conn.execute(OLD_ROW, {"id": uuid.uuid4(), "key": None, "payload": "{}", "headers": None,
                                     "status": "pending", "attempts": 0}).scalar_one()
    assert seq > new_seq


def test_roles_granted_on_the_outbox_keep_working_after_the_upgrade(old_engine, servers, redis_prefix):
    # Given a least-privilege role granted what the README asked before 0003: rights on outbox_message only
    upgrade(old_engine, "0002")
    role = f"outbox_test_role_{uuid.uuid4().hex[:8]}"
    with old_engine.begin() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(text(f'GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_message TO "{role}"'))
    try:
        # When the owner upgrades to head
        upgrade(old_engine)
        # Then the role can enqueue, claim, record and read a message with its body, as before
        as_role = create_engine(old_engine.url.set(username=role), poolclass=NullPool)
        with as_role.begin() as conn:
            mid = enqueue_event(conn, stream=redis_prefix + "orders", type="t", payload={"n": 1})
        store = LeaseStore(create_engine(old_engine.url.set(username=role), isolation_level="AUTOCOMMIT",
                                         poolclass=NullPool), Channel.REDIS, default_max_attempts=5)
        (m,) = store.claim("owner", 10, 30).messages
        assert m.message_id == str(mid) and json.loads(m.payload_json) == {"n": 1}
        with as_role.begin() as conn:
            assert conn.execute(text("SELECT count(*) FROM outbox_message_body")).scalar_one() == 1
        store.engine.dispose()
        as_role.dispose()
    finally:
        # privileges first (in this database), then the role (cluster-wide)
        with old_engine.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))


def test_a_relay_role_that_does_not_own_the_tables_opens_and_drops_days_and_a_producer_role_cannot(
        old_engine, servers):
    # Given a relay's role and a producer's, granted as docs/deploying.md says, before 0016
    upgrade(old_engine, "0015")
    relay, producer = (f"outbox_test_{what}_{uuid.uuid4().hex[:8]}" for what in ("relay", "producer"))
    with old_engine.begin() as conn:
        for role, rights in ((relay, "SELECT, INSERT, UPDATE, DELETE"), (producer, "SELECT, INSERT")):
            conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
            conn.execute(text(f'GRANT {rights} ON outbox_message, outbox_message_body TO "{role}"'))
    try:
        upgrade(old_engine)
        with old_engine.begin() as conn:  # a day long expired, as if opened weeks ago
            old_day = conn.execute(text("SELECT (current_date - DATE '1970-01-01') - 30")).scalar_one()
            conn.execute(text("SELECT outbox_open_day(:d)"), {"d": old_day})
        # When the relay's role runs the maintenance's days
        as_relay = create_engine(old_engine.url.set(username=relay), poolclass=NullPool)
        result = manage_days(as_relay, delivered_older_than_seconds=7 * 86400, margin_days=12)
        # Then it opened days through the margin and dropped the expired one, as the tables' owner would
        assert result.opened >= 1 and result.dropped == [old_day]
        assert partitions(as_relay).margin_days == 12
        as_relay.dispose()
        # And a producer's role may not drop a day
        as_producer = create_engine(old_engine.url.set(username=producer), poolclass=NullPool)
        with pytest.raises(DBAPIError, match="permission denied"), as_producer.begin() as conn:
            conn.execute(text("SELECT outbox_drop_day(:d, now())"), {"d": old_day + 31})
        as_producer.dispose()
    finally:
        with old_engine.begin() as conn:
            for role in (relay, producer):
                conn.execute(text(f'DROP OWNED BY "{role}"'))
                conn.execute(text(f'DROP ROLE "{role}"'))


def test_a_message_deleted_by_hand_takes_its_body_and_its_id_can_be_used_again(app_engine, redis_prefix):
    with app_engine.begin() as conn:
        first = enqueue_event(conn, stream=redis_prefix + "o", type="t", payload=1)
        enqueue_event(conn, stream=redis_prefix + "o", type="t", payload=2)
    # When a state row is deleted by hand (not through outbox purge)
    with app_engine.begin() as conn:
        conn.execute(text("DELETE FROM outbox_message WHERE message_id = :m"), {"m": first})
        assert conn.execute(text("SELECT count(*) FROM outbox_message_body")).scalar_one() == 1
    # Then its id is free again: a new message under it is written, not silently dropped
    with app_engine.begin() as conn:
        assert enqueue_event(conn, stream=redis_prefix + "o", type="t", payload=3, message_id=first) == first
        assert conn.execute(text("SELECT b.payload FROM outbox_message o JOIN outbox_message_body b "
                                 "ON b.seq = o.seq WHERE o.message_id = :m"), {"m": first}).scalar_one() == 3
    # And a TRUNCATE of the messages empties the bodies too
    with app_engine.begin() as conn:
        conn.execute(text("TRUNCATE outbox_message"))
        assert conn.execute(text("SELECT count(*) FROM outbox_message_body")).scalar_one() == 0
    # And a body cannot be deleted from under its message
    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "o", type="t", payload=4)
    with pytest.raises(Exception, match="foreign key"):
        with app_engine.begin() as conn:
            conn.execute(text("DELETE FROM outbox_message_body"))


def test_two_upgrades_at_once_both_succeed(empty_database_url):
    # Given two upgrades of one empty database started together (a deploy and `outbox migrate`)
    engine = create_engine(empty_database_url, poolclass=NullPool)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            upgrade(engine)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    workers = [threading.Thread(target=run) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    # Then the second waited for the first and found nothing to do
    assert errors == [] and current_revision(engine) == head_revision()
    engine.dispose()


def test_the_schema_takes_any_channel_name_from_0007_and_the_downgrade_pins_them_again(old_engine):
    # Given a database at head with one message
    upgrade(old_engine)
    with old_engine.begin() as conn:
        message_id = enqueue_event(conn, stream="orders", type="order.placed", payload={})
    rename = text("UPDATE outbox_message SET channel = :channel WHERE message_id = :id")
    # Then a channel 0001 did not know is accepted by the schema (the registry checks it at enqueue)
    with old_engine.begin() as conn:
        conn.execute(rename, {"channel": "carrier-pigeon", "id": message_id})
    # And the downgrade to 0006 refuses while such a message exists, then pins the old names again
    with pytest.raises(Exception, match="outbox_message_channel_check"):
        downgrade(old_engine, "0006")
    with old_engine.begin() as conn:
        conn.execute(rename, {"channel": "redis", "id": message_id})
    downgrade(old_engine, "0006")
    with pytest.raises(Exception, match="outbox_message_channel_check"), old_engine.begin() as conn:
        conn.execute(rename, {"channel": "carrier-pigeon", "id": message_id})


def test_0018_takes_the_due_index_an_operator_built_beforehand_and_rebuilds_a_failed_one(old_engine):
    # Given a database at 0017, and the new due index built beforehand without holding writes
    # (operating.md), and the same for a second database whose build failed (left invalid)
    upgrade(old_engine, "0017")
    index = ("outbox_message_pending_due_new ON outbox_message_live (channel, available_at, seq, "
             "(CAST(('x' || left(md5(coalesce(key, CAST(seq AS text))), 8)) AS bit(32))::bigint)) "
             "WHERE status = 'pending'")
    with old_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"CREATE INDEX CONCURRENTLY {index}"))
        built = conn.execute(text("SELECT 'outbox_message_pending_due_new'::regclass::oid")).scalar_one()
    # When 0018 runs
    upgrade(old_engine)
    # Then that index is the due index, taken as it was; the old one is gone
    with old_engine.connect() as conn:
        assert conn.execute(text("SELECT 'outbox_message_pending_due_idx'::regclass::oid")).scalar_one() == built
        assert conn.execute(text("SELECT to_regclass('outbox_message_pending_due_new')")).scalar_one() is None
    # And an invalid one (a build that failed) is dropped and built again
    downgrade(old_engine, "0017")
    with old_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"CREATE INDEX {index}"))
        conn.execute(text("UPDATE pg_index SET indisvalid = false "
                          "WHERE indexrelid = 'outbox_message_pending_due_new'::regclass"))
    upgrade(old_engine)
    with old_engine.connect() as conn:
        valid, definition = conn.execute(text(
            "SELECT indisvalid, pg_get_indexdef(indexrelid) FROM pg_index "
            "WHERE indexrelid = 'outbox_message_pending_due_idx'::regclass")).one()
        assert valid and "md5" in definition
