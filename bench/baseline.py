"""The design this project replaces, written faithfully as a small reference:
a polling worker that moves one row at a time, the shape of a classic
mail-queue worker.

Per message:
1. a transaction that selects the oldest due row `FOR UPDATE SKIP LOCKED LIMIT 1`
   and marks it leased, then commits;
2. one `XADD` of the same entry fields the relay writes (`id`, `type`, `key`,
   `payload`, `created_at`);
3. a second transaction that marks the row delivered with its entry id.

It runs on the same database, table, indexes, payloads and Redis as the relay,
with an ordinary (transactional) SQLAlchemy engine on pg8000.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis as redis_lib
from sqlalchemy import create_engine, text

from . import lambda_model
from .counting import RoundTripCounter, StatementCounter
from .env import BenchEnv, CpuMeter

CLAIM_ONE = text(
    """
    SELECT o.seq, o.message_id::text, o.destination, o.type, o.key, b.payload::text,
           to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
      FROM outbox_message o JOIN outbox_message_body b ON b.seq = o.seq
     WHERE o.status = 'pending' AND o.channel = 'redis' AND o.available_at <= now()
     ORDER BY o.available_at, o.seq
     LIMIT 1
       FOR UPDATE OF o SKIP LOCKED
    """
)
MARK_LEASED = text(
    "UPDATE outbox_message SET status = 'leased', attempts = attempts + 1, lease_owner = :owner, "
    "lease_expires_at = now() + interval '120 seconds' WHERE seq = :seq"
)
MARK_SENT = text(
    "UPDATE outbox_message SET status = 'delivered', delivered_at = now(), delivery_ref = :ref, "
    "lease_owner = NULL, lease_expires_at = NULL WHERE seq = :seq"
)


class PerRowWorker:
    """One row per loop: claim transaction, publish, mark-sent transaction."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        self.engine = create_engine(database_url, pool_size=1, connect_args={"application_name": "per-row-worker"})
        self.redis = redis_lib.Redis.from_url(redis_url)
        self.owner = f"worker-{uuid.uuid4().hex[:8]}"

    def step(self) -> bool:
        """Move one message; False when none is due."""
        with self.engine.begin() as conn:
            row = conn.execute(CLAIM_ONE).first()
            if row is None:
                return False
            seq, message_id, stream, type_, key, payload, created_at = row
            conn.execute(MARK_LEASED, {"owner": self.owner, "seq": seq})
        fields = {"id": message_id, "type": type_, "payload": payload, "created_at": created_at}
        if key is not None:
            fields["key"] = key
        entry = self.redis.xadd(stream, fields)
        with self.engine.begin() as conn:
            conn.execute(MARK_SENT, {"ref": entry.decode(), "seq": seq})
        return True

    def close(self) -> None:
        self.engine.dispose()
        self.redis.close()


def run_baseline(env: BenchEnv, *, n: int, streams: tuple[str, ...]) -> dict[str, Any]:
    """Drain `n` messages with the per-row worker and return its figures."""
    from .drain import prepare_backlog

    worker = PerRowWorker(env.database_url, env.servers.redis_url)
    statements = StatementCounter(worker.engine)
    trips = RoundTripCounter(worker.redis)
    try:
        worker.redis.ping()
        with worker.engine.connect() as conn:  # open the pooled connection before timing
            conn.execute(text("SELECT 1"))
        enqueue_seconds = prepare_backlog(env, n, streams)
        statements.take()
        trips.take()
        meter = CpuMeter(env.backend_pids("per-row-worker"), env.redis)
        with lambda_model.holding(), meter:
            started = time.perf_counter()
            moved = 0
            while worker.step():
                moved += 1
            wall = time.perf_counter() - started
        n_statements, n_trips = statements.take(), trips.take()
    finally:
        statements.remove()
        worker.close()
    counts = env.counts()
    return {
        "messages": n,
        "delivered": moved,
        "wall_seconds": round(wall, 3),
        "messages_per_second": round(moved / wall, 1) if wall else None,
        "statements_per_message": round(n_statements / max(moved, 1), 2),
        "transactions_per_message": 2,
        "redis_round_trips_per_message": round(n_trips / max(moved, 1), 2),
        "cpu_us_per_message": meter.per_message_us(moved),
        "enqueue_seconds": round(enqueue_seconds, 2),
        "check": {"rows_delivered": counts.get("delivered", 0), "ok": counts.get("delivered", 0) == n == moved},
    }
