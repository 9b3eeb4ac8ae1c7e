"""Every transition of the lifecycle table (docs/design.md, "Message lifecycle"), checked on the rows and the
stream."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from outbox_relay.loop import RelayLoop
from outbox_relay.models import DeliveryResult, ErrorClass, Outcome, OutcomeKind, Status
from outbox_relay.producer import enqueue_event
from outbox_relay.publishers.base import Publisher


def test_enqueue_writes_pending_with_zero_attempts(app_engine, rows, redis_prefix):
    # Given an application transaction
    with app_engine.begin() as conn:
        mid = enqueue_event(conn, stream=redis_prefix + "orders", type="order.placed", payload={"n": 1})
    # Then one pending row, due now, no attempts yet
    (row,) = rows()
    assert (row["message_id"], row["status"], row["attempts"], row["due"]) == (mid, "pending", 0, True)
    assert row["lease_owner"] is None and row["payload"] == {"n": 1}


def test_enqueue_with_a_delivery_time_is_not_due_yet(app_engine, rows, store, redis_prefix):
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={}, deliver_at=later)
    assert rows()[0]["due"] is False
    assert store.claim("owner-a", 10, 30).messages == ()


def test_a_deliver_at_in_the_past_is_due_from_the_enqueue_on(app_engine, rows, relay_engine, redis_prefix):
    from outbox_relay.operations.stats import queue_stats
    from outbox_relay.producer import enqueue_events_bulk

    # Given messages enqueued now for a time that has passed (a backfill, a reminder computed late)
    earlier = datetime.now(timezone.utc) - timedelta(days=300)
    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={}, deliver_at=earlier)
        enqueue_events_bulk(conn, [dict(stream=redis_prefix + "s", type="t", payload={}, deliver_at=earlier)])
    # Then they are due now, by the database clock, and the backlog's age counts from the enqueue,
    # not from 300 days ago (which would fire the backlog alarm for messages that are not late)
    assert [(r["due"], round(r["due_in"])) for r in rows()] == [(True, 0), (True, 0)]
    assert queue_stats(relay_engine)["totals"]["oldest_pending_age_seconds"] < 60


def test_enqueue_is_idempotent_on_message_id(app_engine, rows, redis_prefix):
    mid = uuid.uuid4()
    with app_engine.begin() as conn:
        first = enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={"v": 1}, message_id=mid)
    with app_engine.begin() as conn:
        again = enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={"v": 1}, message_id=mid)
    assert first == again == mid
    assert [(r["message_id"], r["payload"]) for r in rows()] == [(mid, {"v": 1})]
    assert rows()[0]["created_at"] is not None


def test_a_message_id_reused_for_a_different_message_is_refused(app_engine, rows, redis_prefix):
    from outbox_relay.errors import InvalidMessageError

    mid = uuid.uuid4()
    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={"v": 1}, message_id=mid)
    for change in (dict(payload={"v": 2}), dict(type="other"), dict(stream=redis_prefix + "elsewhere")):
        args = dict(stream=redis_prefix + "s", type="t", payload={"v": 1}, message_id=mid) | change
        with pytest.raises(InvalidMessageError) as info:
            with app_engine.begin() as conn:
                enqueue_event(conn, **args)
        assert info.value.field == "message_id"
    assert [(r["message_id"], r["payload"]) for r in rows()] == [(mid, {"v": 1})]


def test_rolled_back_transaction_leaves_no_message(app_engine, rows, redis_prefix):
    with pytest.raises(RuntimeError):
        with app_engine.begin() as conn:
            enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={})
            raise RuntimeError("business rule failed")
    assert rows() == []


def test_claim_leases_due_pending_rows_and_counts_the_attempt(enqueue, store, rows):
    enqueue(3)
    claimed = store.claim("owner-a", 10, 30).messages
    assert [m.status for m in claimed] == [Status.LEASED] * 3
    for row in rows():
        assert row["status"] == "leased" and row["attempts"] == 1 and row["lease_owner"] == "owner-a"
        assert 28 < row["lease_left"] <= 30  # now() + lease, by the database clock


def test_claim_respects_the_limit_and_takes_oldest_first(enqueue, store):
    ids = enqueue(5)
    assert [m.message_id for m in store.claim("a", 2, 30).messages] == [str(i) for i in ids[:2]]
    assert [m.message_id for m in store.claim("b", 10, 30).messages] == [str(i) for i in ids[2:]]
    assert store.claim("c", 10, 30).messages == ()  # leases still hold


def test_claim_stops_at_its_byte_budget(enqueue, store, rows):
    # Given 10 messages of ~100 KB each
    enqueue(10, payload={"blob": "x" * 100_000})
    # When claiming with a budget of 250 KB
    first = store.claim("a", 10, 30, max_bytes=250_000).messages
    # Then only as many as fit are leased, the rest stay pending and unlocked
    assert len(first) == 3
    assert sum(r["status"] == "leased" for r in rows()) == 3
    assert len(store.claim("b", 10, 30, max_bytes=250_000).messages) == 3
    # And one message larger than the whole budget is still claimed alone
    assert len(store.claim("c", 10, 30, max_bytes=64 * 1024).messages) == 1


def test_expired_lease_is_requeued_then_reclaimed_with_another_attempt(enqueue, store, rows, expire_leases):
    enqueue(1)
    store.claim("a", 10, 30).messages
    expire_leases()
    requeue = store.claim("b", 10, 30)
    assert not requeue.messages and requeue.requeued == 1
    row = rows()[0]
    assert (row["status"], row["attempts"], row["last_error_class"], row["lease_owner"]) == \
        ("pending", 1, "lease_expired", None) and row["due"]
    (again,) = store.claim("b", 10, 30).messages
    assert again.status is Status.LEASED and again.attempts == 2
    assert rows()[0]["lease_owner"] == "b"


def test_expired_lease_with_no_attempts_left_goes_dead(enqueue, store, rows, expire_leases):
    enqueue(1, max_attempts=2)
    store.claim("a", 10, 30).messages
    expire_leases()
    assert store.claim("b", 10, 30).requeued == 1
    store.claim("b", 10, 30).messages
    expire_leases()
    (dead,) = store.claim("c", 10, 30).messages
    assert dead.status is Status.DEAD
    row = rows()[0]
    assert (row["status"], row["attempts"], row["last_error_class"]) == ("dead", 2, "lease_expired")
    assert row["lease_owner"] is None and row["dead_at"] is not None


def test_delivered_records_the_stream_entry_id(enqueue, store, publisher, policy, plenty, rows, redis_client,
                                               redis_prefix):
    ids = enqueue(2, stream="orders", type="order.placed", payload={"total": "9.90", "note": "맵게 🌶️"}, key="k-1")
    summary = RelayLoop(store, publisher, policy, plenty, "owner-a").run()
    assert (summary.claimed, summary.delivered) == (2, 2)
    entries = redis_client.xrange(redis_prefix + "orders")
    assert [f["id"] for _, f in entries] == [str(i) for i in ids]
    entry_id, fields = entries[0]
    assert fields["type"] == "order.placed" and fields["key"] == "k-1"
    # exactly the text the producer wrote (stored as `json`: key order and spacing kept)
    assert fields["payload"] == '{"total":"9.90","note":"맵게 🌶️"}'
    assert fields["created_at"].endswith("Z")
    row = rows()[0]
    assert (row["status"], row["delivery_ref"], row["attempts"]) == ("delivered", entry_id, 1)
    assert row["delivered_at"] is not None and row["lease_owner"] is None


def test_transient_failure_retries_after_backoff(enqueue, store, rows):
    enqueue(1)
    (m,) = store.claim("a", 10, 30).messages
    result = store.record("a", [Outcome(m.seq, OutcomeKind.RETRY, ErrorClass.TRANSIENT, "timeout", None, 20.0)])
    assert result.retried == 1
    row = rows()[0]
    assert (row["status"], row["attempts"], row["last_error_class"]) == ("pending", 1, "transient")
    assert 18 < row["due_in"] <= 20 and row["last_error"] == "timeout"
    assert store.claim("b", 10, 30).messages == ()  # not due before its backoff


def test_transient_failure_at_max_attempts_goes_dead(enqueue, store, rows, app_engine):
    enqueue(1, max_attempts=2)
    for owner in ("a", "b"):
        with app_engine.begin() as conn:  # make it due again without waiting for the backoff
            conn.execute(text("UPDATE outbox_message SET available_at = now() WHERE status = 'pending'"))
        (m,) = store.claim(owner, 10, 30).messages
        result = store.record(owner, [Outcome(m.seq, OutcomeKind.RETRY, ErrorClass.TRANSIENT, "boom", None, 0)])
    assert (result.retried, result.dead) == (0, 1)
    row = rows()[0]
    assert (row["status"], row["attempts"], row["last_error_class"]) == ("dead", 2, "transient")


def test_permanent_failure_is_dead_lettered_at_once(enqueue, store, publisher, policy, plenty, rows,
                                                    redis_client, redis_prefix):
    redis_client.set(redis_prefix + "wrong", "a string, not a stream")
    enqueue(1, stream="wrong")
    enqueue(1, stream="fine")
    summary = RelayLoop(store, publisher, policy, plenty, "a").run()
    assert (summary.delivered, summary.dead) == (1, 1)
    bad, good = rows()
    assert (bad["status"], bad["attempts"], bad["last_error_class"]) == ("dead", 1, "permanent")
    assert bad["last_error"].startswith("redis: WRONGTYPE")
    assert good["status"] == "delivered"
    assert redis_client.xlen(redis_prefix + "fine") == 1


@pytest.mark.parametrize("error_class", [ErrorClass.THROTTLED, ErrorClass.DOWNSTREAM_UNAVAILABLE,
                                         ErrorClass.NOT_ATTEMPTED])
def test_not_the_messages_fault_refunds_the_attempt(enqueue, store, rows, error_class):
    enqueue(1)
    (m,) = store.claim("a", 10, 30).messages
    result = store.record("a", [Outcome(m.seq, OutcomeKind.RELEASE, error_class, "later", None, 0)])
    assert result.released == 1
    row = rows()[0]
    assert (row["status"], row["attempts"], row["last_error_class"]) == ("pending", 0, error_class.value)


def test_errors_are_truncated(enqueue, store, rows):
    enqueue(1)
    (m,) = store.claim("a", 10, 30).messages
    store.record("a", [Outcome(m.seq, OutcomeKind.DEAD, ErrorClass.PERMANENT, "x" * 5000)])
    error = rows()[0]["last_error"]
    assert len(error) <= 300 and "truncated, 5000 chars" in error


def test_claim_and_record_use_the_database_clock(enqueue, store, rows, app_engine):
    enqueue(1)
    with app_engine.connect() as conn:
        before = conn.execute(text("SELECT now()")).scalar_one()
    (m,) = store.claim("a", 10, 30).messages
    row = rows()[0]
    assert timedelta(seconds=29) < row["lease_expires_at"] - before < timedelta(seconds=31)
    store.record("a", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1-1")])
    assert rows()[0]["delivered_at"] >= before


def test_delivery_results_for_unknown_messages_are_ignored(enqueue, store, rows, policy, plenty):
    """A publisher reporting a seq it was not given cannot touch other rows."""
    enqueue(2)

    class Confused(Publisher):
        channel = store.channel

        def gate(self):
            return None

        def claim_limit(self, batch_size, seconds):
            return 1

        def deliver(self, messages, deadline, record):
            record([DeliveryResult(messages[0].seq + 1, delivery_ref="9-9"),
                    DeliveryResult(messages[0].seq, delivery_ref="1-1")])

    summary = RelayLoop(store, Confused(), policy, plenty, "a").run()
    assert summary.delivered == 1
    assert [r["status"] for r in rows()] == ["delivered", "pending"]


def test_an_email_cannot_reuse_an_events_message_id(app_engine, rows, redis_prefix):
    from outbox_relay import enqueue_email
    from outbox_relay.errors import InvalidMessageError

    mid = uuid.uuid4()
    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "s", type="t", payload={}, message_id=mid)
    with pytest.raises(InvalidMessageError) as info:
        with app_engine.begin() as conn:
            enqueue_email(conn, to=["a@example.com"], subject="s", text="t", message_id=mid)
    assert info.value.field == "message_id"
    assert [r["channel"] for r in rows()] == ["redis"]
