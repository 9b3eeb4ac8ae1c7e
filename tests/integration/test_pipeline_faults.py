"""The pipelined modes under faults, on the real PostgreSQL and Redis: Redis cut
mid-pipeline, the database connection killed between claim and record, the
deadline reached with a batch in flight. Nothing is lost, nothing is published
twice (the publish dedupe absorbs a re-send), attempts are refunded where the
message was not at fault."""

from __future__ import annotations

import collections
import dataclasses
from urllib.parse import urlparse

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from outbox_relay.loop import RelayLoop
from outbox_relay.models import Mode
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.redis.client import create_redis_client
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from support.deadline import countdown, until_idle

PIPELINED = [Mode.DRAIN, pytest.param(Mode.LATENCY, marks=pytest.mark.slow)]  # latency: 1.5 s each


def run(store, publisher, policy, mode, owner, deadline=None):
    """One invocation: by default latency until 1.5 s after its last claim that found
    messages, drain with plenty of time."""
    progress = None
    if deadline is None:
        deadline, progress = until_idle() if mode is Mode.LATENCY else (Deadline(lambda: 600_000, 1), None)
    return RelayLoop(store, publisher, dataclasses.replace(policy, mode=mode, batch_size=100,
                                                           poll_interval_seconds=0.02,
                                                           poll_max_interval_seconds=0.02),
                     deadline, owner, on_progress=progress).run()


def stream_ids(redis_client, stream) -> collections.Counter:
    return collections.Counter(f["id"] for _, f in redis_client.xrange(stream))


def finish(store, publisher, policy, rows, expire_leases, redis_client, stream, ids, countdown) -> None:
    """Expire what a failed invocation left leased, run a healthy one, and check that
    every message is delivered and once in the stream."""
    expire_leases()
    for _ in range(3):
        if all(r["status"] == "delivered" for r in rows()):
            break
        run(store, publisher, policy, Mode.DRAIN, "healthy", Deadline(lambda: 600_000, 1))
    assert {r["status"] for r in rows()} == {"delivered"}
    published = stream_ids(redis_client, stream)
    assert set(published) == {str(i) for i in ids} and max(published.values()) == 1


@pytest.mark.parametrize("mode", PIPELINED, ids=lambda m: m.value)
def test_redis_cut_mid_pipeline_refunds_the_batch_and_the_one_claimed_ahead(
        mode, enqueue, store, publisher, policy, rows, tcp_redis, redis_client, redis_prefix, expire_leases, servers):
    # Given 600 messages, and a relay whose Redis connection is cut during its third publish
    ids = enqueue(600, stream="cut")
    client = create_redis_client(f"redis://127.0.0.1:{tcp_redis.port}/0", socket_timeout_seconds=1)
    flaky = RedisStreamsPublisher(client, dedupe_ttl_seconds=3600)
    real_execute, calls = flaky._execute, []

    def execute(batch_calls):
        calls.append(1)
        if len(calls) == 3:
            tcp_redis.cut()
        return real_execute(batch_calls)

    flaky._execute = execute

    # When a pipelined invocation runs

    summary = run(store, flaky, policy, mode, "a")

    # Then two batches were delivered; the third, and the one claimed ahead of it (unless the
    # claim's own gate already found Redis gone), are pending again with their attempts
    # refunded; nothing is left leased
    assert summary.delivered == 200 and summary.stopped == "downstream_unavailable"
    states = collections.Counter((r["status"], r["attempts"]) for r in rows())
    assert states == {("delivered", 1): 200, ("pending", 0): 400}
    classes = collections.Counter(r["last_error_class"] for r in rows() if r["status"] == "pending")
    assert classes["downstream_unavailable"] == 100 and classes["not_attempted"] in (0, 100)
    assert sum(stream_ids(redis_client, redis_prefix + "cut").values()) == 200
    # And once Redis is back everything is delivered, each message once in the stream
    finish(store, publisher, policy, rows, expire_leases, redis_client, redis_prefix + "cut", ids, countdown)


@pytest.mark.parametrize("mode", PIPELINED, ids=lambda m: m.value)
def test_a_connection_killed_between_claim_and_record_is_replaced(mode, enqueue, store, publisher, policy, rows,
                                                                 relay_engine, app_engine, redis_client,
                                                                 redis_prefix, database_url):
    # Given 300 messages, and the relay's database connections killed just before its first outcome write
    ids = enqueue(300, stream="kill")
    real_record, killed = store.record, []
    name = urlparse(database_url.replace("postgresql+pg8000", "postgresql")).path.lstrip("/")

    def record(owner, outcomes):
        if not killed:
            with app_engine.connect() as conn:
                killed.extend(conn.execute(text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": name}).scalars())
                conn.commit()
        return real_record(owner, outcomes)

    store.record = record

    # When a pipelined invocation runs
    summary = run(store, publisher, policy, mode, "a")

    # Then the write was retried on a new connection: every message delivered once, one attempt each
    assert killed and any(killed)
    assert summary.delivered == 300 and summary.lease_lost == 0
    assert collections.Counter((r["status"], r["attempts"]) for r in rows()) == {("delivered", 1): 300}
    published = stream_ids(redis_client, redis_prefix + "kill")
    assert set(published) == {str(i) for i in ids} and max(published.values()) == 1


@pytest.mark.parametrize("mode", PIPELINED, ids=lambda m: m.value)
def test_a_database_lost_for_the_outcome_write_fails_the_invocation_and_nothing_is_lost(
        mode, enqueue, store, publisher, policy, rows, redis_client, redis_prefix, expire_leases):
    # Given 300 messages, and outcome writes that keep failing (the database is gone)
    ids = enqueue(300, stream="gone")
    real_record = store.record

    def record(owner, outcomes):
        raise OperationalError("UPDATE", {}, ConnectionError("the database went away"))

    store.record = record

    # When a pipelined invocation runs, it fails
    with pytest.raises(OperationalError):
        run(store, publisher, policy, mode, "a")

    # Then what it claimed stays leased (it could not be recorded, nor released), what reached
    # the stream is there once, and after the leases expire a healthy relay delivers everything
    # without a second entry for what was already published
    assert {r["status"] for r in rows()} <= {"leased", "pending"}
    before = stream_ids(redis_client, redis_prefix + "gone")
    assert before and max(before.values()) == 1
    store.record = real_record
    finish(store, publisher, policy, rows, expire_leases, redis_client, redis_prefix + "gone", ids, countdown)


@pytest.mark.parametrize("mode", PIPELINED, ids=lambda m: m.value)
def test_the_deadline_reached_with_a_batch_in_flight(mode, enqueue, store, publisher, policy, rows,
                                                     redis_client, redis_prefix):
    # Given 500 messages, and a deadline that passes while the second batch is published
    # (the third is claimed ahead meanwhile)
    ids = enqueue(500, stream="late")
    real_deliver, delivered_batches, clock = publisher.deliver, [], {"left": 600_000}

    def deliver(messages, deadline, record):
        delivered_batches.append(len(messages))
        real_deliver(messages, deadline, record)
        if len(delivered_batches) == 2:
            clock["left"] = 0

    publisher.deliver = deliver

    # When the invocation runs
    summary = run(store, publisher, policy, mode, "a", Deadline(lambda: clock["left"], margin_seconds=1))

    # Then the two batches started before the deadline were delivered and recorded; a batch
    # claimed ahead (if the claim ran before the deadline) was never started and is pending again
    # with its attempt refunded; the rest is untouched
    assert delivered_batches == [100, 100] and summary.delivered == 200
    states = collections.Counter((r["status"], r["attempts"], r["last_error_class"]) for r in rows())
    ahead = states.get(("pending", 0, "not_attempted"), 0)
    assert ahead in (0, 100)
    assert states == {("delivered", 1, None): 200, ("pending", 0, None): 300 - ahead} | \
        ({("pending", 0, "not_attempted"): ahead} if ahead else {})
    published = stream_ids(redis_client, redis_prefix + "late")
    assert sum(published.values()) == 200 and max(published.values()) == 1
    assert set(published) <= {str(i) for i in ids}
