"""Trimming that respects consumer groups (OUTBOX_REDIS_TRIM=acknowledged; docs/channels.md,
"Trimming"): a bounded stream loses only entries every group has acknowledged; a group
that lags holds the stream's messages back (hold) or is counted when trimmed past (trim)."""

from __future__ import annotations

import dataclasses

import pytest

from outbox_relay.loop import RelayLoop
from outbox_relay.publishers.redis import STREAM_FULL, TRIMMED_UNACKNOWLEDGED
from outbox_relay.publishers.redis.settings import RedisOnFull, RedisTrim
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher

BOUND = 10


@pytest.fixture
def bounded(servers):
    import redis as redis_lib

    clients = []

    def _make(on_full: RedisOnFull = RedisOnFull.HOLD) -> RedisStreamsPublisher:
        client = redis_lib.Redis.from_url(servers.redis_url)
        clients.append(client)
        return RedisStreamsPublisher(client, dedupe_ttl_seconds=3600, maxlen=BOUND, trim=RedisTrim.ACKNOWLEDGED,
                                     on_full=on_full)

    yield _make
    for c in clients:
        c.close()


@pytest.fixture
def now_policy(policy):
    """Held messages are due again at once (no throttle delay), so the test needs no sleep."""
    return dataclasses.replace(policy, throttle_delay_seconds=0)


def _read(client, stream: str, count: int, *, ack: bool) -> list[str]:
    """Group `g`'s consumer reads `count` new entries, and acknowledges them when `ack`."""
    got = client.xreadgroup("g", "c", {stream: ">"}, count=count)
    ids = [entry_id for entry_id, _ in got[0][1]] if got else []
    if ack and ids:
        client.xack(stream, "g", *ids)
    return ids


def _ids(client, stream: str) -> list[str]:
    return [entry_id for entry_id, _ in client.xrange(stream)]


def test_a_lagging_group_holds_the_stream_at_its_bound_and_loses_nothing(
        enqueue, store, bounded, now_policy, plenty, redis_client, redis_prefix, rows):
    stream = redis_prefix + "orders"
    redis_client.xgroup_create(stream, "g", id="0", mkstream=True)
    publisher = bounded()
    enqueue(BOUND, stream="orders")
    assert RelayLoop(store, publisher, now_policy, plenty, "a").run().delivered == BOUND
    # Given a group that acknowledged 4 of the 10 entries, and 10 more messages
    acked = _read(redis_client, stream, 4, ack=True)
    unread = _ids(redis_client, stream)[4:]
    enqueue(10, stream="orders")
    summary = RelayLoop(store, publisher, now_policy, plenty, "b").run()
    # Then only what the group acknowledged made room; the rest is held: released with
    # attempts refunded, and counted
    assert summary.delivered == 4 and summary.throttled == 6 and publisher.counters[STREAM_FULL] == 6
    entries = _ids(redis_client, stream)
    assert len(entries) == BOUND and entries[:6] == unread and not set(acked) & set(entries)
    held = [r for r in rows() if r["status"] != "delivered"]
    assert len(held) == 6 and {(r["status"], r["attempts"]) for r in held} == {("pending", 0)}
    # When the group catches up, the held messages go out, in order, and the bound holds
    _read(redis_client, stream, 100, ack=True)
    assert RelayLoop(store, publisher, now_policy, plenty, "c").run().delivered == 6
    entries = _ids(redis_client, stream)
    assert len(entries) == BOUND
    assert [r["delivery_ref"] for r in rows()][-BOUND:] == entries  # rows() is in seq order


def test_pending_entries_are_never_trimmed(enqueue, store, bounded, now_policy, plenty, redis_client, redis_prefix):
    stream = redis_prefix + "orders"
    redis_client.xgroup_create(stream, "g", id="0", mkstream=True)
    publisher = bounded()
    enqueue(BOUND, stream="orders")
    RelayLoop(store, publisher, now_policy, plenty, "a").run()
    before = _ids(redis_client, stream)
    # Given a group that read every entry and acknowledged none (all pending)
    _read(redis_client, stream, 100, ack=False)
    enqueue(3, stream="orders")
    summary = RelayLoop(store, publisher, now_policy, plenty, "b").run()
    # Then nothing is trimmed and nothing added
    assert summary.delivered == 0 and summary.throttled == 3
    assert _ids(redis_client, stream) == before


def test_on_full_trim_trims_to_the_bound_and_counts_what_a_group_had_not_acknowledged(
        enqueue, store, bounded, now_policy, plenty, redis_client, redis_prefix):
    stream = redis_prefix + "orders"
    redis_client.xgroup_create(stream, "g", id="0", mkstream=True)
    publisher = bounded(RedisOnFull.TRIM)
    enqueue(BOUND, stream="orders")
    RelayLoop(store, publisher, now_policy, plenty, "a").run()
    _read(redis_client, stream, 2, ack=True)
    # Given a group that acknowledged 2 of 10, and 5 more messages
    enqueue(5, stream="orders")
    summary = RelayLoop(store, publisher, now_policy, plenty, "b").run()
    # Then all 5 are published, the stream is cut to the bound, and the 3 unacknowledged ones lost are counted
    assert summary.delivered == 5 and len(_ids(redis_client, stream)) == BOUND
    assert publisher.counters[TRIMMED_UNACKNOWLEDGED] == 3


def test_a_stream_without_groups_is_trimmed_to_the_bound_exactly(enqueue, store, bounded, now_policy, plenty,
                                                                  redis_client, redis_prefix):
    publisher = bounded()
    enqueue(25, stream="plain")
    assert RelayLoop(store, publisher, now_policy, plenty, "a").run().delivered == 25
    assert redis_client.xlen(redis_prefix + "plain") == BOUND
