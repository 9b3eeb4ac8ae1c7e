"""The store contract suite's harnesses: one per `Store` implementation, each
driving its own rows and clock (tests/contract/store/test_store_contract.py)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from typing import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from outbox_relay.models import OrderingOnDead, Status
from outbox_relay.producer import enqueue_events_bulk
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore, LockedHeads, Store
from outbox_relay.testing import InMemoryStore


class MemoryHarness:
    """`testing.InMemoryStore`: rows in a dict, time a number."""

    name, store_class = "memory", InMemoryStore

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.store: Store | None = None

    def make(self, *, ordering_on_dead: OrderingOnDead = OrderingOnDead.SKIP, max_attempts: int = 3) -> Store:
        self.store = InMemoryStore(default_max_attempts=max_attempts, ordering_on_dead=ordering_on_dead)
        return self.store

    def add(self, n: int = 1, *, key: str | None = None, payload: str = '{"n": 1}', deliver_in: float | None = None,
            max_attempts: int | None = None) -> list[int]:
        return [self.store.add(key=key, payload_json=payload, deliver_at=deliver_in, max_attempts=max_attempts).seq
                for _ in range(n)]

    def advance(self, seconds: float) -> None:
        self.store.advance(seconds)

    def wait(self, seconds: float) -> None:
        """Let `seconds` pass on the process's clock (the locked heads' own)."""
        self.store.advance(seconds)

    def row(self, seq: int) -> tuple[str, int, str | None, bool]:
        """(status, attempts, last_error_class, due now)."""
        r = self.store.rows[seq]
        return (r.status.value, r.attempts, r.last_error_class,
                r.status is Status.PENDING and r.available_at <= self.store.now)

    @contextlib.contextmanager
    def locked(self, seq: int) -> Iterator[None]:
        self.store.lock(seq, 4242)
        try:
            yield
        finally:
            self.store.unlock(seq)

    def redrive(self, seq: int) -> None:
        self.store.redrive([seq])


class PostgresHarness:
    """`store.LeaseStore` on this test's database; time passes by moving every stored
    time back (the claim reads the database's clock)."""

    name, store_class = "postgres", LeaseStore

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.relay_engine: Engine = request.getfixturevalue("relay_engine")
        self.url: str = request.getfixturevalue("database_url")
        self.app: Engine = request.getfixturevalue("app_engine")
        self.store: Store | None = None
        self.moved = 0.0  # seconds `advance` let pass

    def make(self, *, ordering_on_dead: OrderingOnDead = OrderingOnDead.SKIP, max_attempts: int = 3) -> Store:
        self.store = LeaseStore(self.relay_engine, Channel.REDIS, default_max_attempts=max_attempts,
                                ordering_on_dead=ordering_on_dead)
        # The locked heads' clock is the process's: time let pass moves it with the database's, as the fake's.
        self.store.locked_heads = LockedHeads(clock=lambda: time.monotonic() + self.moved)
        return self.store

    def add(self, n: int = 1, *, key: str | None = None, payload: str = '{"n": 1}', deliver_in: float | None = None,
            max_attempts: int | None = None) -> list[int]:
        at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=deliver_in) if deliver_in else None
        with self.app.begin() as conn:
            ids = enqueue_events_bulk(conn, [dict(stream="s", type="t", payload=json.loads(payload), key=key,
                                                  deliver_at=at, max_attempts=max_attempts) for _ in range(n)])
            return list(conn.execute(text("SELECT seq FROM outbox_message WHERE message_id = ANY(:ids) ORDER BY seq"),
                                     {"ids": [str(i) for i in ids]}).scalars())

    def advance(self, seconds: float) -> None:
        self.moved += seconds
        with self.app.begin() as conn:
            conn.execute(text(
                "UPDATE outbox_message SET available_at = available_at - make_interval(secs => :s), "
                "lease_expires_at = lease_expires_at - make_interval(secs => :s), "
                "created_at = created_at - make_interval(secs => :s), "
                "scheduled_at = scheduled_at - make_interval(secs => :s)"), {"s": seconds})

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def row(self, seq: int) -> tuple[str, int, str | None, bool]:
        with self.app.connect() as conn:
            r = conn.execute(text("SELECT status, attempts, last_error_class, "
                                  "status = 'pending' AND available_at <= now() FROM outbox_message WHERE seq = :s"),
                             {"s": seq}).one()
        return r[0], r[1], r[2], r[3]

    @contextlib.contextmanager
    def locked(self, seq: int) -> Iterator[None]:
        # Another transaction (an application's, an operator's) holds the row.
        engine = create_engine(self.url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                with conn.begin():
                    conn.execute(text("SELECT 1 FROM outbox_message WHERE seq = :s FOR UPDATE"), {"s": seq})
                    yield
        finally:
            engine.dispose()

    def redrive(self, seq: int) -> None:
        from outbox_relay.operations.redrive import RedriveSelection, redrive

        with self.app.connect() as conn:
            mid = conn.execute(text("SELECT message_id FROM outbox_message WHERE seq = :s"), {"s": seq}).scalar_one()
        redrive(self.app, RedriveSelection(message_ids=(mid,)))


HARNESSES = {h.name: h for h in (MemoryHarness, PostgresHarness)}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest):
    return HARNESSES[request.param](request)
