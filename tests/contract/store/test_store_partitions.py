"""The store on day partitions (docs/decisions/0066), PostgreSQL's alone: a delivered row moves
into its id's day, ids stay unique across days and day 0, lookups find rows in every partition,
the maintenance run opens days ahead and drops expired ones keeping what must stay, and a row
moved by a concurrent transaction costs a retry, not an error."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from outbox_relay import sql
from outbox_relay.errors import InvalidMessageError
from outbox_relay.feedback.events import FeedbackEvent
from outbox_relay.feedback.hashing import AddressHasher
from outbox_relay.feedback.store import FeedbackStore
from outbox_relay.models import ErrorClass, Outcome, OutcomeKind
from outbox_relay.operations.dead import get_message, history_of, list_dead
from outbox_relay.operations.partitions import manage_days, partitions
from outbox_relay.operations.purge import purge
from outbox_relay.operations.redrive import RedriveSelection, redrive
from outbox_relay.producer import enqueue_event, enqueue_events_bulk
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore

DAY = 86400


@pytest.fixture
def store(relay_engine) -> LeaseStore:
    return LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=3)


@pytest.fixture
def enqueue(app_engine, redis_prefix):
    def _enqueue(n: int = 1) -> list:
        with app_engine.begin() as conn:
            return enqueue_events_bulk(conn, [dict(stream=redis_prefix + "events", type="t", payload={"n": i})
                                              for i in range(n)])
    return _enqueue


def uuid7_at(when: datetime) -> uuid.UUID:
    ms = int(when.timestamp() * 1000)
    rand = uuid.uuid4().int & ((1 << 62) - 1)
    return uuid.UUID(int=ms << 80 | 7 << 76 | 0x123 << 64 | 0b10 << 62 | rand)


def day_of(when: datetime) -> int:
    return int(when.timestamp()) // DAY


def where(app_engine, message_id) -> tuple[str, str, str]:
    """The partitions holding the message's state, body and history lines (the last: sorted, joined)."""
    with app_engine.connect() as conn:
        return conn.execute(text(
            "SELECT o.tableoid::regclass::text, b.tableoid::regclass::text, "
            "       (SELECT string_agg(DISTINCT h.tableoid::regclass::text, ',') FROM outbox_message_history h "
            "         WHERE h.seq = o.seq) "
            "  FROM outbox_message o JOIN outbox_message_body b ON b.seq = o.seq "
            " WHERE o.message_id = :id"), {"id": str(message_id)}).one()


def open_day(app_engine, day: int) -> None:
    with app_engine.begin() as conn:
        conn.execute(text("SELECT outbox_open_day(:d)"), {"d": day})


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def test_a_delivered_row_moves_into_its_days_partition_with_its_body_and_history(enqueue, store, app_engine):
    (mid,) = enqueue(1)
    today = day_of(now_utc())
    assert where(app_engine, mid)[:2] == ("outbox_message_live", f"outbox_message_body_d{today}")
    # Tried once, retried, then delivered
    (m,) = store.claim("poller-a", 10, 30).messages
    store.record("poller-a", [Outcome(m.seq, OutcomeKind.RETRY, ErrorClass.TRANSIENT, "timeout", None, 0)])
    (m,) = store.claim("poller-a", 10, 30).messages
    assert store.record("poller-a", [Outcome(m.seq, OutcomeKind.DELIVERED, None, None, "1-1")]).delivered == 1
    # The state row left the live partition for the day's; body and history are in the day too
    assert where(app_engine, mid) == (f"outbox_message_done_d{today}", f"outbox_message_body_d{today}",
                                      f"outbox_message_history_d{today}")
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message_live")).scalar_one() == 0


def test_a_message_id_is_unique_across_days_and_day_zero(app_engine, redis_prefix):
    v4, v7 = uuid.uuid4(), uuid7_at(now_utc())
    with app_engine.begin() as conn:
        for mid in (v4, v7, v4, v7):  # each twice: the second writes nothing
            enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={"a": 1}, message_id=mid)
    assert where(app_engine, v4)[:2] == ("outbox_message_live", "outbox_message_body_d0")
    assert where(app_engine, v7)[1] == f"outbox_message_body_d{day_of(now_utc())}"
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message_body")).scalar_one() == 2
    # Another message under either id is refused, in Python and in SQL
    for mid in (v4, v7):
        with pytest.raises(InvalidMessageError) as err, app_engine.begin() as conn:
            enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={"a": 2}, message_id=mid)
        assert err.value.field == "message_id"
        with pytest.raises(DBAPIError, match="message_id: already used"), app_engine.begin() as conn:
            conn.execute(text("SELECT outbox_enqueue_event_v1(:s, 't', '{\"a\": 3}'::json, message_id => :id)"),
                         {"s": redis_prefix + "s", "id": str(mid)})


def test_an_id_up_to_a_day_ahead_is_taken_and_one_further_is_refused_naming_message_id(app_engine, redis_prefix):
    edge = uuid7_at(now_utc() + timedelta(days=1) - timedelta(minutes=5))
    beyond = uuid7_at(now_utc() + timedelta(days=1, minutes=5))
    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={}, message_id=edge)
        conn.execute(text("SELECT outbox_enqueue_event_v1(:s, 't', '{}'::json, message_id => :id)"),
                     {"s": redis_prefix + "s", "id": str(uuid7_at(now_utc() + timedelta(hours=23)))})
    assert where(app_engine, edge)[1] == f"outbox_message_body_d{day_of(now_utc() + timedelta(days=1) - timedelta(minutes=5))}"
    with pytest.raises(InvalidMessageError, match="more than a day ahead") as err, app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={}, message_id=beyond)
    assert err.value.field == "message_id"
    with pytest.raises(DBAPIError, match="message_id: is a UUIDv7 more than a day ahead"), app_engine.begin() as conn:
        conn.execute(text("SELECT outbox_enqueue_event_v1(:s, 't', '{}'::json, message_id => :id)"),
                     {"s": redis_prefix + "s", "id": str(beyond)})
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one() == 2


def test_lookups_find_rows_in_day_zero_and_in_a_day(app_engine, store, redis_prefix):
    ids = [uuid.uuid4(), uuid7_at(now_utc())]
    with app_engine.begin() as conn:
        for mid in ids:
            enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={"id": str(mid)}, message_id=mid)
    claimed = store.claim("poller-a", 10, 30).messages
    store.record("poller-a", [Outcome(m.seq, OutcomeKind.DEAD, ErrorClass.PERMANENT, "refused", None)
                              for m in claimed])
    # Dead letters, `outbox show` and the history, wherever they are
    assert {d.message_id for d in list_dead(app_engine)} == set(ids)
    for mid in ids:
        shown = get_message(app_engine, mid)
        assert shown.payload == {"id": str(mid)} and shown.status.value == "dead"
        assert [h.event for h in history_of(app_engine, shown)] == ["dead"]
    # Redriven and delivered: each in its partition, still found, then purged from day 0 only
    assert redrive(app_engine, RedriveSelection(everything=True)).moved == 2
    claimed = store.claim("poller-a", 10, 30).messages
    store.record("poller-a", [Outcome(m.seq, OutcomeKind.DELIVERED, None, None, "r") for m in claimed])
    assert [where(app_engine, mid)[0] for mid in ids] == [
        "outbox_message_done_d0", f"outbox_message_done_d{day_of(now_utc())}"]
    assert [[h.event for h in history_of(app_engine, get_message(app_engine, mid))] for mid in ids] == [
        ["dead", "redriven", "delivered"]] * 2
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET delivered_at = now() - interval '30 days'"))
    assert purge(app_engine, delivered_older_than_seconds=DAY, day_zero=True).delivered == 1
    assert get_message(app_engine, ids[0]) is None and get_message(app_engine, ids[1]) is not None
    assert purge(app_engine, delivered_older_than_seconds=DAY).delivered == 1
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message_body")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM outbox_message_history")).scalar_one() == 0


def test_maintenance_opens_days_ahead_and_drops_an_expired_day_keeping_what_must_stay(app_engine, store,
                                                                                     redis_prefix):
    old = now_utc() - timedelta(days=20)
    day = day_of(old)
    open_day(app_engine, day)
    ids = {name: uuid7_at(old + timedelta(seconds=i)) for i, name in enumerate(("gone", "late", "dead", "waiting"))}
    with app_engine.begin() as conn:
        for name, mid in ids.items():
            enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={"n": name}, message_id=mid)
    assert {where(app_engine, mid)[1] for mid in ids.values()} == {f"outbox_message_body_d{day}"}
    seqs = {m.message_id: m.seq for m in store.claim("poller-a", 10, 30).messages}
    s = {name: seqs[str(mid)] for name, mid in ids.items()}
    store.record("poller-a", [
        Outcome(s["gone"], OutcomeKind.DELIVERED, None, None, "1"),
        Outcome(s["late"], OutcomeKind.RETRY, ErrorClass.TRANSIENT, "busy", None, 0),
        Outcome(s["dead"], OutcomeKind.DEAD, ErrorClass.PERMANENT, "refused", None),
        Outcome(s["waiting"], OutcomeKind.RELEASE, None, None, None, 3600)])
    (late,) = store.claim("poller-a", 10, 30).messages
    store.record("poller-a", [Outcome(late.seq, OutcomeKind.DELIVERED, None, None, "2")])
    with app_engine.begin() as conn:  # delivered long ago, but the late one within the window
        conn.execute(text("UPDATE outbox_message SET delivered_at = now() - interval '19 days' WHERE seq = :s"),
                     {"s": s["gone"]})
    result = manage_days(app_engine, delivered_older_than_seconds=7 * DAY, margin_days=10)
    today = day_of(now_utc())
    assert result.dropped == [day] and result.kept == 3 and result.opened >= 1
    parts = partitions(app_engine)
    assert parts.newest_day == today + 10 and parts.margin_days == 10 and parts.oldest_day > day
    with app_engine.connect() as conn:
        tables = set(conn.execute(text("SELECT relname FROM pg_class WHERE relname LIKE 'outbox_message_%_d%'"))
                     .scalars())
    assert not {f"outbox_message_{t}_d{day}" for t in ("done", "body", "history")} & tables
    assert {f"outbox_message_{t}_d{today + 10}" for t in ("done", "body", "history")} <= tables
    # Gone with its day; the others in day 0 with their bodies and history
    assert get_message(app_engine, ids["gone"]) is None
    assert where(app_engine, ids["late"]) == ("outbox_message_done_d0", "outbox_message_body_d0",
                                              "outbox_message_history_d0")
    assert where(app_engine, ids["dead"]) == ("outbox_message_live", "outbox_message_body_d0",
                                              "outbox_message_history_d0")
    assert [h.event for h in history_of(app_engine, get_message(app_engine, ids["late"]))] == ["retry", "delivered"]
    # The id of the closed day now maps to day 0, where its message is: a repeat writes nothing
    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={"n": "waiting"},
                      message_id=ids["waiting"])
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one() == 3
    # The dead letter, redriven and delivered, lands in day 0
    redrive(app_engine, RedriveSelection(message_ids=(ids["dead"],)))
    (m,) = store.claim("poller-a", 10, 30).messages
    store.record("poller-a", [Outcome(m.seq, OutcomeKind.DELIVERED, None, None, "3")])
    assert where(app_engine, ids["dead"])[0] == "outbox_message_done_d0"
    # A second run opens and drops nothing
    again = manage_days(app_engine, delivered_older_than_seconds=7 * DAY, margin_days=10)
    assert (again.opened, again.dropped) == (0, [])


def test_a_feedback_event_waiting_on_a_delivery_that_moves_the_row_retries_and_settles_it(app_engine, store):
    """The outcome write moves the row while the event's UPDATE waits on it: SQLSTATE 40001
    (tuple moved to another partition), retried, and the event then finds it delivered."""
    with app_engine.begin() as conn:
        mid = conn.execute(text("SELECT outbox_enqueue_email_v1(\"to\" => ARRAY['a@example.com'], subject => 's', "
                                "text => 'hello', sender => 'b@example.com')")).scalar_one()
    ses = LeaseStore(store.engine, Channel("ses"), default_max_attempts=5)
    (m,) = ses.claim("poller-a", 10, 30).messages
    outcome = app_engine.connect()
    tx = outcome.begin()
    outcome.execute(text("UPDATE outbox_message SET status = 'delivered', delivered_at = now(), lease_owner = NULL, "
                         "lease_expires_at = NULL, delivery_ref = 'ses-1' WHERE seq = :s AND status = 'leased'"),
                    {"s": m.seq})
    event = FeedbackEvent(event_type="delivery", ses_message_id="ses-1", outbox_message_id=str(mid),
                          configuration_set=None, event_at=datetime.now(timezone.utc), event_key="k",
                          subtype=None, recipients=("a@example.com",))
    feedback = FeedbackStore(app_engine, AddressHasher("k" * 64))
    done: list = []
    worker = threading.Thread(target=lambda: done.append(feedback.record(event)))
    worker.start()
    # Given the event's statement waiting on the row lock, the delivery commits (moving the row)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with app_engine.connect() as conn:
            if conn.execute(text("SELECT count(*) FROM pg_stat_activity "
                                 "WHERE datname = current_database() AND wait_event_type = 'Lock'")).scalar_one():
                break
        time.sleep(0.02)
    tx.commit()
    outcome.close()
    worker.join(60)
    assert done and done[0].found and done[0].new and not done[0].in_flight
    assert where(app_engine, mid)[0].startswith("outbox_message_done_d")
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_email_event")).scalar_one() == 1


def test_a_takeover_waiting_on_the_owners_delivery_that_moves_the_row_retries(app_engine, store, enqueue):
    """A dead poller's leases are taken over while its outcome write (delivered: the row moves)
    holds the row: the takeover's UPDATE meets SQLSTATE 40001, is run again, finds nothing to free."""
    from outbox_relay.db import run_with_retry

    enqueue(1)
    (m,) = store.claim("gone-owner", 10, 30).messages
    with app_engine.begin() as conn:
        conn.execute(text("INSERT INTO outbox_poller (owner, channel, started_at, seen_at, expires_at, deadline_at) "
                          "VALUES ('gone-owner', 'redis', now(), now(), now() - interval '1 second', now())"))
    outcome = app_engine.connect()
    tx = outcome.begin()
    outcome.execute(text("UPDATE outbox_message SET status = 'delivered', delivered_at = now(), lease_owner = NULL, "
                         "lease_expires_at = NULL WHERE seq = :s AND status = 'leased'"), {"s": m.seq})
    done: list = []
    worker = threading.Thread(target=lambda: done.append(run_with_retry(store.engine, lambda c: tuple(c.execute(
        sql.relay.take_over_pollers, {"channel": "redis"}).one()))))
    worker.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with app_engine.connect() as conn:
            if conn.execute(text("SELECT count(*) FROM pg_stat_activity "
                                 "WHERE datname = current_database() AND wait_event_type = 'Lock'")).scalar_one():
                break
        time.sleep(0.02)
    tx.commit()
    outcome.close()
    worker.join(60)
    # Taken over once, no lease left to free: the row was delivered meanwhile
    assert done == [(1, 0)]
    assert where(app_engine, m.message_id)[0] == f"outbox_message_done_d{day_of(now_utc())}"


def test_days_opened_and_dropped_while_producers_and_a_relay_run_fail_none_of_their_statements(
        app_engine, store, redis_prefix):
    """Opening and dropping days lock the parent tables: they take them before any partition,
    as every statement does, and give way after a short wait, so no producer or relay statement
    meets a deadlock or a missing partition."""
    old = now_utc() - timedelta(days=30)
    days = [day_of(old) + i for i in range(4)]
    for d in days:
        open_day(app_engine, d)
    with app_engine.begin() as conn:  # each expired day holds a delivered message and a waiting one
        for d in days:
            for i in range(2):
                enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={"d": d, "i": i},
                              message_id=uuid7_at(old + timedelta(days=d - days[0], seconds=i)))
    first = store.claim("poller-a", 100, 30).messages
    store.record("poller-a", [Outcome(m.seq, OutcomeKind.DELIVERED, None, None, "1") for m in first
                              if json.loads(m.payload_json)["i"] == 0])
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET delivered_at = now() - interval '29 days' "
                          "WHERE status = 'delivered'"))
    errors: list[BaseException] = []
    produced: list[uuid.UUID] = []
    stop = threading.Event()

    def produce() -> None:
        try:
            while not stop.is_set():
                with app_engine.begin() as conn:
                    produced.extend(enqueue_events_bulk(conn, [dict(stream=redis_prefix + "s", type="t",
                                                                    payload={"n": i}) for i in range(5)]))
        except BaseException as exc:  # noqa: BLE001 - the assertion below names it
            errors.append(exc)

    def relay() -> None:
        try:
            while not stop.is_set():
                batch = store.claim("poller-b", 50, 30).messages
                store.record("poller-b", [Outcome(m.seq, OutcomeKind.DELIVERED, None, None, "2") for m in batch])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    workers = [threading.Thread(target=produce), threading.Thread(target=produce), threading.Thread(target=relay)]
    for w in workers:
        w.start()
    try:
        result = manage_days(app_engine, delivered_older_than_seconds=7 * DAY, margin_days=12)
    finally:
        stop.set()
        for w in workers:
            w.join(120)
    assert errors == []
    assert sorted(result.dropped) == days and result.skipped == [] and result.kept == len(days)
    with app_engine.connect() as conn:
        found = set(conn.execute(text("SELECT message_id FROM outbox_message WHERE message_id = ANY(:ids)"),
                                 {"ids": [str(m) for m in produced]}).scalars())
    assert produced and len(found) == len(produced)


def test_a_day_is_dropped_while_a_vacuum_holds_the_live_partition_and_todays(app_engine, store, redis_prefix,
                                                                            monkeypatch):
    # A vacuum (autovacuum's lock, held here) of other partitions is no reason to skip a day:
    # the drop locks the parents alone, and its own day's partitions.
    from outbox_relay.operations import partitions as partitions_module

    monkeypatch.setattr(partitions_module, "LOCK_TRIES", 2)
    old = now_utc() - timedelta(days=20)
    day, today = day_of(old), day_of(now_utc())
    open_day(app_engine, day)
    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={}, message_id=uuid7_at(old))
    (m,) = store.claim("poller-a", 10, 30).messages
    store.record("poller-a", [Outcome(m.seq, OutcomeKind.DELIVERED, None, None, "1")])
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET delivered_at = now() - interval '19 days' WHERE seq = :s"),
                     {"s": m.seq})
    vacuum = app_engine.connect()
    try:
        vacuum.execute(text(f"LOCK TABLE outbox_message_live, outbox_message_body_d{today}, "
                            f"outbox_message_done_d{today} IN SHARE UPDATE EXCLUSIVE MODE"))
        result = manage_days(app_engine, delivered_older_than_seconds=7 * DAY)
    finally:
        vacuum.rollback()
        vacuum.close()
    assert result.dropped == [day] and result.skipped == []
    assert get_message(app_engine, m.message_id) is None
