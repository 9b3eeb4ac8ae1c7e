"""Redrive racing relay invocations: no message is delivered twice.

Every message fails permanently on its first delivery (dead letter), so each
one passes through pending → leased → dead → (redrive) → pending → leased →
delivered while two redrive loops and two relay loops run at once against
the real PostgreSQL and Redis.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Sequence

import redis as redis_lib
from sqlalchemy import text

from outbox_relay.backoff import Backoff
from outbox_relay.loop import RelayLoop, RelayPolicy
from outbox_relay.models import ClaimedMessage, DeliveryResult, ErrorClass
from outbox_relay.operations.redrive import RedriveSelection, redrive
from outbox_relay.publishers.base import Deadline, Publisher, RecordResults
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from outbox_relay.store import LeaseStore, lease_token

N = 400
TIME_LIMIT_SECONDS = 60


class FailOnceThenPublish(Publisher):
    """The real Redis publisher, except that each message's first delivery
    fails permanently; counts every successful delivery per message id."""

    def __init__(self, inner: RedisStreamsPublisher, ledger: "Ledger") -> None:
        self.inner = inner
        self.channel = inner.channel
        self.ledger = ledger

    def gate(self) -> str | None:
        return self.inner.gate()

    def claim_limit(self, batch_size: int, seconds_available: float) -> int:
        return self.inner.claim_limit(batch_size, seconds_available)

    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None:
        first, again = [], []
        for m in messages:
            (again if self.ledger.failed_before(m.message_id) else first).append(m)
        if first:
            record([DeliveryResult(m.seq, error_class=ErrorClass.PERMANENT, error="rejected on first try")
                    for m in first])
        by_seq = {m.seq: m.message_id for m in again}

        def counting(results: Sequence[DeliveryResult]) -> None:
            for r in results:
                if r.ok:
                    self.ledger.delivered(by_seq[r.seq])
            record(results)

        if again:
            self.inner.deliver(again, deadline, counting)


class Ledger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failed: set = set()
        self.deliveries: collections.Counter = collections.Counter()

    def failed_before(self, message_id) -> bool:
        with self.lock:
            if message_id in self.failed:
                return True
            self.failed.add(message_id)
            return False

    def delivered(self, message_id) -> None:
        with self.lock:
            self.deliveries[message_id] += 1

    def done(self, n: int) -> bool:
        with self.lock:
            return len(self.deliveries) >= n


def test_redrive_racing_the_relay_delivers_each_message_once(enqueue, relay_engine, servers, redis_client,
                                                             redis_prefix, app_engine):
    # Given N messages that will each be dead-lettered once
    ids = enqueue(N, stream="race")
    stream = redis_prefix + "race"
    ledger = Ledger()
    redriven: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    deadline = time.monotonic() + TIME_LIMIT_SECONDS

    def relay_loop() -> None:
        client = redis_lib.Redis.from_url(servers.redis_url)
        try:
            store = LeaseStore(relay_engine, RedisStreamsPublisher.channel, default_max_attempts=5)
            publisher = FailOnceThenPublish(RedisStreamsPublisher(client, dedupe_ttl_seconds=3600), ledger)
            policy = RelayPolicy(batch_size=23, lease_seconds=30, backoff=Backoff())
            while not stop.is_set() and time.monotonic() < deadline:
                RelayLoop(store, publisher, policy, Deadline(lambda: 60_000, 5), lease_token("race")).run()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            client.close()

    def redrive_loop() -> None:
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                result = redrive(relay_engine, RedriveSelection(everything=True), batch_size=7)
                with ledger.lock:
                    redriven.append(result.moved)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    # When two relay loops and two redrive loops run at once until all is delivered
    threads = [threading.Thread(target=f) for f in (relay_loop, relay_loop, redrive_loop, redrive_loop)]
    for t in threads:
        t.start()
    while not ledger.done(N) and time.monotonic() < deadline and not errors:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors

    # Then every message was delivered exactly once
    assert len(ledger.deliveries) == N and set(ledger.deliveries.values()) == {1}
    entries = redis_client.xrange(stream)
    assert len(entries) == N
    assert collections.Counter(f["id"] for _, f in entries) == {str(i): 1 for i in ids}
    # And each dead letter was redriven exactly once, by one of the racing redrives
    assert len(ledger.failed) == N and sum(redriven) == N
    assert sum(1 for n in redriven if n) >= 2  # the redrives really interleaved with the relay
    # And every row is delivered after one claim since its redrive, the old error kept as history
    with app_engine.connect() as conn:
        rows = conn.execute(text("SELECT status, attempts, last_error_class, dead_at FROM outbox_message")).fetchall()
    assert collections.Counter(tuple(r) for r in rows) == {("delivered", 1, "permanent", None): N}
