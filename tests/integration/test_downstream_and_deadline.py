"""Redis down before or during a batch, and an invocation running out of time."""

from __future__ import annotations

import pytest

from outbox_relay.models import Mode
from outbox_relay.publishers.base import Deadline, Publisher
from outbox_relay.publishers.redis.client import create_redis_client
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from outbox_tools.redis_nodes import free_port


def test_redis_down_before_claim_claims_nothing(enqueue, store, policy, rows, invoke, mode):
    # Given Redis does not answer (nothing listens on the port)
    enqueue(5)
    client = create_redis_client(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_seconds=0.2)
    publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=60)
    # When an invocation runs
    summary = invoke(store, publisher, policy, "a")
    # Then it claims nothing, says why (latency mode kept asking until its deadline), and no attempt is spent
    assert summary.claimed == 0 and summary.gate_closed
    assert summary.skipped.startswith("redis unavailable") if mode is not Mode.LATENCY else summary.polls > 1
    assert {(r["status"], r["attempts"]) for r in rows()} == {("pending", 0)}


def test_redis_down_mid_batch_releases_with_attempts_refunded(enqueue, store, policy, rows, tcp_redis,
                                                              redis_client, redis_prefix, invoke):
    # Given Redis answers the gate's PING and then the network drops
    enqueue(30, stream="mid")
    client = create_redis_client(f"redis://127.0.0.1:{tcp_redis.port}/0", socket_timeout_seconds=1)
    publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=60)
    gate = publisher.gate

    def gate_then_partition():
        reason = gate()
        tcp_redis.cut()
        return reason

    publisher.gate = gate_then_partition
    # When the batch is published (latency mode then keeps finding the gate closed until its deadline)
    summary = invoke(store, publisher, policy, "a")
    # Then the whole batch is released, attempts refunded, due again now
    assert (summary.claimed, summary.released, summary.delivered) == (30, 30, 0)
    assert summary.stopped == "downstream_unavailable"
    assert summary.error_classes == {"downstream_unavailable": 30}
    assert {(r["status"], r["attempts"], r["last_error_class"], r["due"]) for r in rows()} == \
        {("pending", 0, "downstream_unavailable", True)}
    assert redis_client.xlen(redis_prefix + "mid") == 0


def test_no_time_left_claims_nothing(enqueue, store, publisher, policy, rows, invoke):
    enqueue(5)
    summary = invoke(store, publisher, policy, "a", Deadline(lambda: 4_000, margin_seconds=5))
    assert summary.claimed == 0 and "deadline" in summary.skipped
    assert {(r["status"], r["attempts"]) for r in rows()} == {("pending", 0)}


def test_time_running_out_after_claim_releases_the_rest(enqueue, store, publisher, policy, rows, redis_client,
                                                        redis_prefix, invoke):
    # Given an invocation whose remaining time falls below the margin right after the claim
    enqueue(10, stream="late")
    remaining = iter([30_000, 30_000] + [1_000] * 100)
    deadline = Deadline(lambda: next(remaining), margin_seconds=5)
    # When it runs
    summary = invoke(store, publisher, policy, "a", deadline)
    # Then nothing was started late: no entry reached the stream, all released with attempts refunded
    assert (summary.claimed, summary.released, summary.delivered) == (10, 10, 0)
    assert redis_client.exists(redis_prefix + "late") == 0
    assert {(r["status"], r["attempts"], r["last_error_class"]) for r in rows()} == {("pending", 0, "not_attempted")}


def test_an_unexpected_error_releases_before_raising(enqueue, store, policy, rows, invoke):
    enqueue(3)

    class Broken(Publisher):
        channel = store.channel
        pipelined = True

        def begin(self, deadline):
            pass

        def gate(self):
            return None

        def claim_limit(self, batch_size, seconds):
            return batch_size

        def deliver(self, messages, deadline, record):
            raise KeyError("a bug")

    with pytest.raises(KeyError):
        invoke(store, Broken(), policy, "a")
    assert {(r["status"], r["attempts"], r["last_error"]) for r in rows()} == \
        {("pending", 0, "not recorded: the relay raised KeyError")}
