"""Retention: old delivered messages and dead letters deleted in bounded batches, SKIP
LOCKED, never one table-wide DELETE, so neither the purge nor a relay waits on the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from sqlalchemy import Engine

from .. import sql
from ..db import run_with_retry
from ..publishers.registry import Channel

PURGE_BATCH = 5000


@dataclass
class PurgeResult:
    """What a purge deleted; not `complete` when `keep_going` stopped it (the next run goes on)."""

    delivered: int = 0
    dead: int = 0
    batches: int = 0
    complete: bool = True
    by_channel: dict[str, int] = field(default_factory=dict)
    largest_batch: int = 0

    @property
    def total(self) -> int:
        return self.delivered + self.dead

    def as_dict(self) -> dict[str, Any]:
        return {"delivered": self.delivered, "dead": self.dead, "total": self.total, "batches": self.batches,
                "largest_batch": self.largest_batch, "complete": self.complete, "by_channel": self.by_channel}


def count_purge(engine: Engine, *, delivered_older_than_seconds: float,
                dead_older_than_seconds: float | None = None) -> dict[str, int]:
    def work(conn: Any) -> dict[str, int]:
        delivered = conn.execute(sql.operations.count_delivered_older,
                                 {"older_than_seconds": float(delivered_older_than_seconds)}).scalar_one()
        dead = 0 if dead_older_than_seconds is None else sum(
            conn.execute(statement, {"channel": ch.value, "older_than_seconds": float(dead_older_than_seconds)})
            .scalar_one() for ch in Channel
            for statement in (sql.operations.count_dead_older, sql.operations.count_discarded_older))
        return {"delivered": int(delivered), "dead": int(dead)}

    return run_with_retry(engine, work)


def purge(engine: Engine, *, delivered_older_than_seconds: float, dead_older_than_seconds: float | None = None,
          batch_size: int = PURGE_BATCH, on_batch: Callable[[str, int], None] | None = None,
          keep_going: Callable[[], bool] | None = None, day_zero: bool = False) -> PurgeResult:
    """Delivered and, given a window, dead and discarded rows, in batches while `keep_going()`;
    `day_zero`: delivered rows of day 0 only (the other days are dropped whole: partitions.py)."""
    if delivered_older_than_seconds <= 0 or (dead_older_than_seconds is not None and dead_older_than_seconds <= 0):
        raise ValueError("retention windows must be longer than zero")
    if not 1 <= batch_size <= 50_000:
        raise ValueError("batch_size must be between 1 and 50000")
    result = PurgeResult()

    def run(kind: str, statement: Any, params: dict[str, Any]) -> bool:
        while True:
            if keep_going is not None and not keep_going():
                result.complete = False
                return False
            rows = run_with_retry(engine, lambda c: c.execute(statement, params).fetchall())
            n = sum(int(count) for _, count in rows)
            if n == 0:
                return True
            result.batches += 1
            result.largest_batch = max(result.largest_batch, n)
            setattr(result, kind, getattr(result, kind) + n)
            for channel, count in rows:
                result.by_channel[channel] = result.by_channel.get(channel, 0) + int(count)
            if on_batch is not None:
                on_batch(kind, n)
            if n < batch_size:
                return True

    if not run("delivered", sql.operations.purge_delivered_batch,
               {"older_than_seconds": float(delivered_older_than_seconds), "limit": batch_size,
                "day_zero": day_zero}):
        return result
    if dead_older_than_seconds is not None:
        for ch in Channel:
            for statement in (sql.operations.purge_dead_batch, sql.operations.purge_discarded_batch):
                if not run("dead", statement, {"channel": ch.value, "limit": batch_size,
                                               "older_than_seconds": float(dead_older_than_seconds)}):
                    return result
    return result
