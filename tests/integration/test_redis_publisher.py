"""Idempotent publish, trimming, per-message errors and script-cache loss, on a real Redis."""

from __future__ import annotations

import redis as redis_lib

from outbox_relay.publishers.redis.script import dedupe_prefix
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher


def collect(publisher, messages, deadline):
    got = []
    publisher.deliver(messages, deadline, got.extend)
    return {r.seq: r for r in got}


def test_republishing_returns_the_first_entry_id_and_adds_nothing(enqueue, store, publisher, plenty,
                                                                  redis_client, redis_prefix, expire_leases):
    # Given a batch published once whose ack was lost (nothing recorded)
    enqueue(3, stream="orders")
    first_claim = store.claim("a", 10, 30).messages
    first = collect(publisher, first_claim, plenty)
    # When the leases expire (requeued by the next claim: a first expiry) and another
    # invocation publishes the same messages
    expire_leases()
    assert store.claim("b", 10, 30).requeued == 3
    again = store.claim("b", 10, 30)
    assert not again.suspect and len(again.messages) == 3
    second = collect(publisher, again.messages, plenty)
    # Then the same entry ids come back and the stream holds each message once
    assert {s: r.delivery_ref for s, r in first.items()} == {s: r.delivery_ref for s, r in second.items()}
    assert redis_client.xlen(redis_prefix + "orders") == 3


def test_dedupe_key_expires_after_the_configured_ttl(enqueue, store, servers, plenty, redis_client, redis_prefix):
    client = redis_lib.Redis.from_url(servers.redis_url)
    publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=90)
    enqueue(1, stream="ttl")
    (m,) = store.claim("a", 10, 30).messages
    collect(publisher, [m], plenty)
    key = dedupe_prefix(redis_prefix + "ttl") + str(m.message_id)
    assert 85_000 < redis_client.pttl(key) <= 90_000
    client.close()


def test_maxlen_trims_the_stream_approximately(enqueue, store, servers, plenty, redis_client, redis_prefix):
    client = redis_lib.Redis.from_url(servers.redis_url)
    publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=3600, maxlen=100)
    enqueue(1000, stream="trim")
    collect(publisher, store.claim("a", 1000, 30).messages, plenty)
    length = redis_client.xlen(redis_prefix + "trim")
    assert 100 <= length < 1000  # MAXLEN ~ trims whole macro nodes: at least 100 kept
    client.close()


def test_the_largest_maxlen_the_settings_accept_is_one_redis_accepts(enqueue, store, servers, plenty, redis_client,
                                                                      redis_prefix):
    from outbox_relay.publishers.redis.settings import RedisSettings

    # Given the upper bound of OUTBOX_REDIS_MAXLEN, and one more
    largest = next(m.le for m in RedisSettings.model_fields["redis_maxlen"].metadata if hasattr(m, "le"))
    client = redis_lib.Redis.from_url(servers.redis_url)
    enqueue(2, stream="bound")
    first, second = store.claim("a", 10, 30).messages
    # Then a publish with the bound adds the entry, and one above it is what Redis refuses
    (ok,) = collect(RedisStreamsPublisher(client, dedupe_ttl_seconds=3600, maxlen=largest), [first], plenty).values()
    (refused,) = collect(RedisStreamsPublisher(client, dedupe_ttl_seconds=3600, maxlen=largest + 1), [second],
                         plenty).values()
    assert ok.ok and redis_client.xlen(redis_prefix + "bound") == 1
    assert not refused.ok and "out of range" in refused.error
    client.close()


def test_a_wrong_type_key_fails_only_its_own_messages(enqueue, store, publisher, plenty, redis_client, redis_prefix):
    redis_client.hset(redis_prefix + "taken", "f", "v")
    enqueue(2, stream="taken")
    enqueue(2, stream="ok")
    results = collect(publisher, store.claim("a", 10, 30).messages, plenty)
    errors = sorted(r.error_class.value for r in results.values() if not r.ok)
    assert errors == ["permanent", "permanent"]
    assert sum(r.ok for r in results.values()) == 2
    assert redis_client.xlen(redis_prefix + "ok") == 2


def test_publish_survives_a_flushed_script_cache(enqueue, store, publisher, plenty, redis_client, redis_prefix):
    enqueue(1, stream="a")
    collect(publisher, store.claim("a", 10, 30).messages, plenty)
    redis_client.script_flush()  # as after a restart or failover
    enqueue(1, stream="a")
    results = collect(publisher, store.claim("b", 10, 30).messages, plenty)
    assert all(r.ok for r in results.values())
    assert redis_client.xlen(redis_prefix + "a") == 2


def test_one_pipelined_round_trip_per_batch(enqueue, store, servers, policy, plenty, redis_prefix):
    """Whatever the batch size and number of streams, publishing is one round trip."""

    base = redis_lib.ConnectionPool.from_url(servers.redis_url).connection_class  # TCP or Unix socket

    class CountingConnection(base):
        reads = 0

        def send_packed_command(self, command, check_health=True):
            CountingConnection.reads += 1
            return super().send_packed_command(command, check_health)

    pool = redis_lib.ConnectionPool.from_url(servers.redis_url, connection_class=CountingConnection)
    client = redis_lib.Redis(connection_pool=pool)
    publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=3600)
    publisher.gate()
    publisher._script_sha()
    sends = []
    for n, streams in ((10, 1), (300, 3), (1200, 4)):
        for s in range(streams):
            enqueue(n // streams, stream=f"rt{s}")
        CountingConnection.reads = 0
        messages = store.claim(f"o{n}", n, 30).messages
        collect(publisher, messages, plenty)
        sends.append(CountingConnection.reads)
    assert sends == [1, 1, 1]
    client.close()


def test_entries_carry_headers_when_given(app_engine, store, publisher, plenty, redis_client, redis_prefix):
    from outbox_relay.producer import enqueue_event

    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "h", type="t", payload=[1, 2], headers={"trace_id": "abc"})
    collect(publisher, store.claim("a", 10, 30).messages, plenty)
    ((_, fields),) = redis_client.xrange(redis_prefix + "h")
    assert fields["headers"] == '{"trace_id":"abc"}' and fields["payload"] == "[1,2]" and "key" not in fields


def test_busy_redis_refusing_script_load_is_downstream_unavailable(enqueue, store, plenty, redis_prefix, tmp_path):
    # Given a Redis of this test's own (a busy script would stall every other user of a shared one)
    # busy with a long script of someone else's, and a publisher that has not loaded its own
    import threading
    import time

    import pytest

    from outbox_relay.errors import DownstreamUnavailable
    from support.redis_nodes import RedisNode

    enqueue(2, stream="busy")
    claimed = store.claim("a", 10, 30).messages
    node = RedisNode(tmp_path).start()
    redis_client = node.client(decode_responses=True)
    # Redis 7 renamed lua-time-limit busy-reply-threshold
    setting = "busy-reply-threshold" if redis_client.config_get("busy-reply-threshold") else "lua-time-limit"
    redis_client.config_set(setting, 50)
    blocker = node.client()
    spin = "local s = tonumber(redis.call('TIME')[1]) while tonumber(redis.call('TIME')[1]) < s + 3 do end return 1"
    worker = threading.Thread(target=lambda: _ignore_errors(blocker.eval, spin, 0), daemon=True)
    client = node.client()
    try:
        worker.start()
        time.sleep(0.3)
        publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=60)
        # Then delivering refuses as "downstream unavailable" (the relay releases the batch, attempts
        # refunded), not as a bug that fails the invocation
        with pytest.raises(DownstreamUnavailable, match="BUSY"):
            publisher.deliver(claimed, plenty, lambda results: None)
        _ignore_errors(redis_client.script_kill)
        worker.join(10)
        assert redis_client.xlen(redis_prefix + "busy") == 0
    finally:
        _ignore_errors(redis_client.script_kill)
        blocker.close()
        client.close()
        node.stop()


def _ignore_errors(call, *args):
    try:
        return call(*args)
    except redis_lib.RedisError:
        return None


def test_a_key_stops_at_its_first_failure_within_a_call(enqueue, store, publisher, plenty, redis_client,
                                                         redis_prefix):
    # Given a stream that can take no more entries (its last id is the largest there is)
    stream = redis_prefix + "full"
    redis_client.xadd(stream, {"x": "1"}, id="18446744073709551615-18446744073709551615")
    enqueue(2, stream="full", key="k")
    enqueue(1, stream="full")
    enqueue(1, stream="full", key="k")
    # When a batch of two keyed messages, one without a key and another keyed one is published
    results = collect(publisher, store.claim("a", 10, 30).messages, plenty)
    # Then the key's first message failed with Redis's error; its later ones were not attempted;
    # the one without a key failed on its own
    by_seq = [results[s] for s in sorted(results)]
    assert [r.error_class.value for r in by_seq] == ["transient", "not_attempted", "transient", "not_attempted"]
    assert "exhausted" in by_seq[0].error and "earlier message of its key" in by_seq[1].error
    assert redis_client.xlen(stream) == 1
