"""Backpressure when Redis is out of memory (docs/channels.md, "Memory full (OOM)"):
the gate claims nothing while memory is at the high mark of maxmemory, or after an
OOM reply until Redis recovers.

Each test starts a Redis of its own on a free loopback port (maxmemory is set on it,
never on the shared Redis) and stops it by pid.
"""

from __future__ import annotations

from collections import Counter

import pytest

from outbox_relay.loop import RelayLoop
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.redis import MEMORY_FULL
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from support.redis_nodes import RedisNode

PLENTY = Deadline(lambda: 60_000, 5)


@pytest.fixture
def node(tmp_path):
    server = RedisNode(tmp_path, "--maxmemory-policy", "noeviction").start()
    yield server
    server.stop()


def _limit_to(client, headroom: int) -> int:
    """Set maxmemory `headroom` bytes above what Redis uses now; returns the limit."""
    limit = int(client.info("memory")["used_memory"]) + headroom
    client.config_set("maxmemory", limit)
    return limit


def _fill_to(client, fraction: float) -> None:
    """Store 4 MiB, then set maxmemory so that Redis uses `fraction` of it. In small
    appends: a large request's read buffer counts in used_memory until Redis frees it."""
    for _ in range(256):
        client.append("filler", b"x" * 16 * 1024)
    client.config_set("maxmemory", int(int(client.info("memory")["used_memory"]) / fraction))


def _used(client) -> float:
    """The fraction of maxmemory that Redis uses now (0 without a limit)."""
    memory = client.info("memory")
    return int(memory["used_memory"]) / int(memory["maxmemory"]) if int(memory["maxmemory"]) else 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_gate_claims_nothing_while_memory_is_at_the_high_mark(node, enqueue, store, policy, rows,
                                                                  redis_prefix):
    admin = node.client()
    _fill_to(admin, 0.95)
    enqueue(5, stream="orders")
    publisher = RedisStreamsPublisher(node.client(), dedupe_ttl_seconds=3600)
    # When memory is above the high mark (0.9) before and after the gate reads it, nothing
    # is claimed, and it is counted
    assert _used(admin) >= 0.92
    summary = RelayLoop(store, publisher, policy, PLENTY, "a").run()
    assert _used(admin) >= 0.92
    assert summary.claimed == 0 and summary.gate_closed and "memory" in summary.skipped
    assert publisher.counters[MEMORY_FULL] == 1
    assert [(r["status"], r["attempts"]) for r in rows()] == [("pending", 0)] * 5
    # Once memory is freed, the next run delivers
    admin.delete("filler")
    assert RelayLoop(store, publisher, policy, PLENTY, "b").run().delivered == 5
    assert admin.xlen(redis_prefix + "orders") == 5


def test_after_an_oom_reply_the_gate_waits_for_recovery_when_redis_hides_its_memory(
        node, enqueue, store, policy, rows, redis_prefix):
    admin = node.client()
    # A user that may not run INFO (as where the provider hides it): the gate falls back to PING
    admin.acl_setuser("relay", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                      commands=["+@all", "-info"])
    _limit_to(admin, 300 * 1024)
    clock = Clock()
    publisher = RedisStreamsPublisher(node.client(username="relay", password="pw"), dedupe_ttl_seconds=3600,
                                      oom_backoff_seconds=10, clock=clock)
    for i in range(6):  # a script call per stream: Redis checks memory as each call starts
        enqueue(10, stream=f"big{i}", payload={"blob": "y" * 20_000})
    # Given a batch that ran Redis out of memory (the calls after it ran out refused: all or some)
    first = RelayLoop(store, publisher, policy, PLENTY, "a").run()
    assert first.delivered < 60 and first.error_classes.get("downstream_unavailable") == 60 - first.delivered
    left = [r for r in rows() if r["status"] != "delivered"]
    assert {(r["status"], r["attempts"]) for r in left} == {("pending", 0)}
    # Then the next run claims nothing: Redis answered OOM and says nothing of its memory
    again = RelayLoop(store, publisher, policy, PLENTY, "b").run()
    assert again.claimed == 0 and "OOM" in again.skipped and publisher.counters[MEMORY_FULL] >= 1
    # And once the backoff passed (and memory was freed), the rest is delivered, each message once
    admin.config_set("maxmemory", 0)
    clock.now += 10
    assert RelayLoop(store, publisher, policy, PLENTY, "c").run().delivered == len(left)
    ids = Counter(fields[b"id"].decode() for i in range(6) for _, fields in admin.xrange(f"{redis_prefix}big{i}"))
    assert ids == Counter({str(r["message_id"]): 1 for r in rows()})
    assert {r["status"] for r in rows()} == {"delivered"}


def test_an_allkeys_policy_near_its_limit_does_not_close_the_gate(node, enqueue, store, policy):
    admin = node.client()
    admin.config_set("maxmemory-policy", "allkeys-lru")
    _fill_to(admin, 0.95)
    enqueue(3, stream="orders")
    assert _used(admin) >= 0.92
    assert RelayLoop(store, RedisStreamsPublisher(node.client(), dedupe_ttl_seconds=3600), policy, PLENTY,
                     "a").run().delivered == 3
