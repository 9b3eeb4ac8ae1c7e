"""What the delivery guarantee depends on downstream: once `XADD` has answered, a
message is recorded as delivered and never published again, so a stream entry
survives a Redis restart only if Redis persisted it (docs/design.md, "Guarantees";
docs/channels.md, "Durability of the entries").

Each test starts a Redis server of its own on a free loopback port (never the
shared one), kills it with SIGKILL after the relay delivered, starts it again on
the same directory, and counts what is left.
"""

from __future__ import annotations

import threading
from typing import Iterator

import pytest
import redis as redis_lib

from outbox_relay.loop import RelayLoop
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from support.redis_nodes import RedisNode

N = 50


@pytest.fixture
def own_redis(tmp_path, request) -> Iterator[RedisNode]:
    server = RedisNode(tmp_path, *request.param).start()
    yield server
    server.stop()


NO_PERSISTENCE = ["--save", "", "--appendonly", "no"]
APPEND_ONLY_ALWAYS = ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]


def _deliver(enqueue, store, policy, own_redis, rows) -> list[str]:
    enqueue(N, stream="orders")
    client = redis_lib.Redis.from_url(own_redis.url)
    summary = RelayLoop(store, RedisStreamsPublisher(client, dedupe_ttl_seconds=3600), policy,
                        Deadline(lambda: 60_000, 5), "relay").run()
    client.close()
    assert summary.delivered == N
    return [r["delivery_ref"] for r in rows() if r["status"] == "delivered"]


def _entries(own_redis, stream: str) -> list[str]:
    client = redis_lib.Redis.from_url(own_redis.url, decode_responses=True)
    entries = [entry_id for entry_id, _ in client.xrange(stream)]
    client.close()
    return entries


@pytest.mark.parametrize("own_redis", [APPEND_ONLY_ALWAYS], indirect=True, ids=["appendonly-always"])
def test_entries_survive_a_redis_crash_when_redis_appends_every_write(enqueue, store, policy, own_redis,
                                                                      redis_prefix, rows):
    # Given messages the relay delivered to a Redis that writes its append-only file on every write
    refs = _deliver(enqueue, store, policy, own_redis, rows)
    # When Redis is killed and started again on its data
    own_redis.kill()  # SIGKILL: no shutdown save, as a node lost or a process killed by the kernel
    own_redis.restart()
    # Then every entry the rows point at is still in the stream
    assert _entries(own_redis, redis_prefix + "orders") == refs


@pytest.mark.parametrize("own_redis", [NO_PERSISTENCE], indirect=True, ids=["no-persistence"])
def test_entries_are_lost_by_a_redis_crash_when_redis_does_not_persist(enqueue, store, policy, own_redis,
                                                                       redis_prefix, rows):
    # Given messages the relay delivered to a Redis without persistence
    _deliver(enqueue, store, policy, own_redis, rows)
    # When Redis is killed and started again
    own_redis.kill()  # SIGKILL: no shutdown save, as a node lost or a process killed by the kernel
    own_redis.restart()
    # Then the stream is empty while every row says delivered: the relay does not publish them again
    assert _entries(own_redis, redis_prefix + "orders") == []
    assert {r["status"] for r in rows()} == {"delivered"} and len(rows()) == N
    assert store.claim("next", 100, 30).messages == ()


@pytest.mark.parametrize("own_redis", [APPEND_ONLY_ALWAYS + ["--key-load-delay", "100"]], indirect=True,
                         ids=["appendonly-loading"])
def test_the_gate_stays_closed_while_a_restarted_redis_loads_its_data(enqueue, store, plenty, own_redis,
                                                                      redis_prefix):
    # Given a Redis whose append-only file takes seconds to load (100 µs per key), killed and started again
    client = redis_lib.Redis.from_url(own_redis.url)
    with client.pipeline(transaction=False) as pipe:
        for i in range(20_000):
            pipe.set(f"{redis_prefix}filler.{i}", i)
        pipe.execute()
    own_redis.kill()
    restarted = threading.Thread(target=own_redis.restart)  # returns once PING is answered
    restarted.start()
    publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=60)

    # When the relay checks its gate while Redis loads (INFO is answered then, writes are refused)
    def loading() -> bool:
        try:
            return client.info("persistence")["loading"] == 1
        except redis_lib.ConnectionError:  # not listening yet
            return False

    closed = []
    while restarted.is_alive():
        if loading():
            reason = publisher.gate()
            if loading():  # still loading when the gate answered
                closed.append(reason)
    restarted.join()
    # Then the gate said so every time: no batch is claimed to fail on LOADING
    assert closed and all(reason and "redis" in reason for reason in closed), closed
    # and once loaded it opens, and a batch is delivered
    assert publisher.gate() is None
    enqueue(3, stream="after")
    claimed = store.claim("a", 10, 30).messages
    delivered = []
    publisher.deliver(claimed, plenty, delivered.extend)
    assert [r.error_class for r in delivered] == [None] * 3
    assert client.xlen(redis_prefix + "after") == 3
    client.close()
