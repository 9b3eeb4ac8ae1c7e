"""Redis down before or during a batch, and an invocation running out of time."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse

import pytest

from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.redis_streams import RedisStreamsPublisher, create_redis_client
from outbox_relay.relay import run_batch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CuttableProxy:
    """A TCP proxy in front of the real Redis whose connections can be cut, as a
    network partition or a failover would (real sockets, real client errors)."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.cut_now = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_now:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.cut_now = True
        self.listener.close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


@pytest.fixture
def tcp_redis(servers):
    parsed = urlparse(servers.redis_url)
    if parsed.scheme not in ("redis", "rediss") or not parsed.port:
        pytest.skip("needs Redis over TCP")
    proxy = CuttableProxy((parsed.hostname, parsed.port))
    yield proxy
    proxy.cut()


def test_redis_down_before_claim_claims_nothing(enqueue, store, policy, plenty, rows):
    # Given Redis does not answer (nothing listens on the port)
    enqueue(5)
    client = create_redis_client(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_seconds=0.5)
    publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=60)
    # When an invocation runs
    summary = run_batch(store, publisher, policy, plenty, "a")
    # Then it claims nothing, says why, and no attempt is spent
    assert summary.claimed == 0 and summary.skipped.startswith("redis unavailable")
    assert {(r["status"], r["attempts"]) for r in rows()} == {("pending", 0)}


def test_redis_down_mid_batch_releases_with_attempts_refunded(enqueue, store, policy, plenty, rows, tcp_redis,
                                                              redis_client, redis_prefix):
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
    # When the batch is published
    summary = run_batch(store, publisher, policy, plenty, "a")
    # Then the whole batch is released, attempts refunded, due again now
    assert (summary.claimed, summary.released, summary.delivered) == (30, 30, 0)
    assert summary.stopped == "downstream_unavailable"
    assert summary.error_classes == {"downstream_unavailable": 30}
    assert {(r["status"], r["attempts"], r["last_error_class"], r["due"]) for r in rows()} == \
        {("pending", 0, "downstream_unavailable", True)}
    assert redis_client.xlen(redis_prefix + "mid") == 0


def test_no_time_left_claims_nothing(enqueue, store, publisher, policy, rows):
    enqueue(5)
    summary = run_batch(store, publisher, policy, Deadline(lambda: 4_000, margin_seconds=5), "a")
    assert summary.claimed == 0 and "deadline" in summary.skipped
    assert {(r["status"], r["attempts"]) for r in rows()} == {("pending", 0)}


def test_time_running_out_after_claim_releases_the_rest(enqueue, store, publisher, policy, rows, redis_client,
                                                        redis_prefix):
    # Given an invocation whose remaining time falls below the margin right after the claim
    enqueue(10, stream="late")
    remaining = iter([30_000, 30_000] + [1_000] * 100)
    deadline = Deadline(lambda: next(remaining), margin_seconds=5)
    # When it runs
    summary = run_batch(store, publisher, policy, deadline, "a")
    # Then nothing was started late: no entry reached the stream, all released with attempts refunded
    assert (summary.claimed, summary.released, summary.delivered) == (10, 10, 0)
    assert redis_client.exists(redis_prefix + "late") == 0
    assert {(r["status"], r["attempts"], r["last_error_class"]) for r in rows()} == {("pending", 0, "not_attempted")}


def test_an_unexpected_error_releases_before_raising(enqueue, store, policy, plenty, rows):
    enqueue(3)

    class Broken:
        channel = store.channel

        def gate(self):
            return None

        def claim_limit(self, batch_size, seconds):
            return batch_size

        def deliver(self, messages, deadline, record):
            raise KeyError("a bug")

    with pytest.raises(KeyError):
        run_batch(store, Broken(), policy, plenty, "a")
    assert {(r["status"], r["attempts"], r["last_error"]) for r in rows()} == \
        {("pending", 0, "not recorded: the relay raised KeyError")}
