"""Durability on failover (OUTBOX_REDIS_WAIT_REPLICAS): a batch is recorded delivered
only once the replicas acknowledged its writes (docs/channels.md, "Durability of the
entries").

Each test starts a primary and a replica of its own on free loopback ports (never
the shared Redis) and stops them by pid.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter

import pytest
from sqlalchemy import text

from outbox_relay.loop import RelayLoop
from outbox_relay.models import Mode
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.redis import NOT_REPLICATED
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from support.redis_nodes import replicated_pair


@pytest.fixture
def pair(tmp_path):
    primary, replica = replicated_pair(tmp_path)
    yield primary, replica
    primary.stop()
    replica.stop()


def _publisher(node, **kwargs) -> RedisStreamsPublisher:
    return RedisStreamsPublisher(node.client(socket_timeout=5), dedupe_ttl_seconds=3600, **kwargs)


def _stream_ids(client, streams) -> Counter:
    """How many entries carry each message id, over `streams`."""
    seen: Counter = Counter()
    for stream in streams:
        for _, fields in client.xrange(stream):
            seen[fields[b"id"].decode()] += 1
    return seen


def test_a_batch_the_replica_did_not_acknowledge_is_released_and_published_once_later(
        pair, enqueue, store, policy, rows, redis_prefix):
    primary, replica = pair
    # A replica acknowledges in well under a millisecond here, but this machine is shared
    publisher = _publisher(primary, wait_replicas=1, wait_timeout_ms=3000)
    plenty = Deadline(lambda: 60_000, 5)
    # Given a batch delivered with WAIT 1: the replica has every entry the rows point at
    enqueue(20, stream="orders")
    assert RelayLoop(store, publisher, policy, plenty, "a").run().delivered == 20
    on_replica = {e for e, _ in replica.client(decode_responses=True).xrange(redis_prefix + "orders")}
    assert {r["delivery_ref"] for r in rows()} == on_replica
    # When the replica stops answering while the next batch is published
    enqueue(10, stream="orders")
    replica.pause()
    publisher.wait_timeout_ms = 200
    try:
        summary = RelayLoop(store, publisher, policy, plenty, "b").run()
    finally:
        replica.resume()
        publisher.wait_timeout_ms = 3000
    # Then nothing of that batch is recorded delivered: released with attempts refunded, and counted
    assert summary.delivered == 0 and summary.released == 10 and summary.stopped == "downstream_unavailable"
    later = [r for r in rows() if r["delivery_ref"] is None]
    assert len(later) == 10 and {(r["status"], r["attempts"]) for r in later} == {("pending", 0)}
    assert publisher.counters[NOT_REPLICATED] == 10
    # And once the replica answers again the batch is delivered, each message once in the stream
    assert RelayLoop(store, publisher, policy, plenty, "c").run().delivered == 10
    client = primary.client()
    assert client.xlen(redis_prefix + "orders") == 30
    assert set(_stream_ids(client, [redis_prefix + "orders"]).values()) == {1}
    assert {r["delivery_ref"] for r in rows()} == {e.decode() for e, _ in client.xrange(redis_prefix + "orders")}


def test_the_gate_claims_nothing_while_the_primary_has_fewer_replicas_than_wait_needs(
        pair, enqueue, store, policy, rows):
    primary, replica = pair
    enqueue(5, stream="orders")
    replica.kill()
    give_up = time.monotonic() + 10
    while primary.client().info("replication")["connected_slaves"]:
        assert time.monotonic() < give_up
        time.sleep(0.02)
    summary = RelayLoop(store, _publisher(primary, wait_replicas=1), policy, Deadline(lambda: 60_000, 5), "a").run()
    assert summary.claimed == 0 and summary.gate_closed and "replicas" in summary.skipped
    assert {r["status"] for r in rows()} == {"pending"}


@pytest.mark.slow
def test_a_primary_killed_mid_drain_loses_nothing_recorded_delivered_with_wait(
        pair, enqueue, store, policy, rows, redis_prefix, app_engine):
    primary, replica = pair
    streams = [redis_prefix + f"s{i}" for i in range(10)]
    for i in range(10):
        enqueue(400, stream=f"s{i}")
    drain = dataclasses.replace(policy, batch_size=100, mode=Mode.DRAIN)
    far = Deadline(lambda: 600_000, 1)
    # Given a drain with WAIT 1 under way on the primary
    publisher = _publisher(primary, wait_replicas=1, wait_timeout_ms=500)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (RelayLoop(store, publisher, drain, far, "a").run(), done.set()))
    worker.start()
    give_up = time.monotonic() + 60
    # A count, not rows(): reading every row and body each time let a fast drain finish first.
    while _delivered(app_engine) < 800:
        assert time.monotonic() < give_up and not done.is_set(), "the drain ended before the failover"
        time.sleep(0.01)
    # When the primary is killed in the middle of it, and the replica promoted
    primary.kill()
    worker.join(timeout=60)
    promoted = replica.client()
    promoted.replicaof("NO", "ONE")
    delivered_before = {r["message_id"] for r in rows() if r["status"] == "delivered"}
    assert 800 <= len(delivered_before) < 4000
    # And the drain goes on against the new primary until the outbox is empty
    survivor = _publisher(replica, wait_replicas=0)
    for _ in range(20):
        RelayLoop(store, survivor, drain, far, "b").run()
        if all(r["status"] == "delivered" for r in rows()):
            break
    # Then every message recorded delivered is in the stream, each message id exactly once
    final = rows()
    assert {r["status"] for r in final} == {"delivered"} and len(final) == 4000
    ids = _stream_ids(promoted, streams)
    assert ids == Counter({str(r["message_id"]): 1 for r in final})
    entries = {(s, e.decode()) for s in streams for e, _ in promoted.xrange(s)}
    assert {(r["destination"], r["delivery_ref"]) for r in final} == entries
    promoted.close()


def _delivered(app_engine) -> int:
    with app_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM outbox_message WHERE status = 'delivered'")).scalar_one()
