"""Drain throughput of the Redis channel: N messages enqueued, then relay
invocations back to back, in this process, until one claims nothing.

Messages/second = messages delivered / wall time of the drain loop (enqueue
excluded). Each invocation is the real handler (see `handler`). Per
invocation that claimed something, the database statements and Redis round
trips are counted; they must not grow with the batch size.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from sqlalchemy import text

from .env import BenchEnv, CpuMeter
from .handler import Relay, relay


def prepare_backlog(env: BenchEnv, n: int, streams: tuple[str, ...]) -> float:
    """Empty the table and the prefix, enqueue `n` messages, VACUUM ANALYZE, CHECKPOINT.
    Returns the enqueue seconds."""
    env.reset_table()
    env.clean_redis()
    seconds = env.enqueue(n, streams=streams)
    env.vacuum_analyze()
    checkpoint(env)
    return seconds


def checkpoint(env: BenchEnv) -> None:
    """CHECKPOINT, so every scenario starts with the same WAL state (skipped without the privilege)."""
    try:
        with env.engine.connect() as conn:
            conn.execute(text("CHECKPOINT"))
    except Exception:
        pass


def drain(env: BenchEnv, *, n: int, batch_size: int, streams: tuple[str, ...]) -> dict[str, Any]:
    """Drain `n` messages at `batch_size`; returns the figures of that run."""
    with relay(env, batch_size) as r:
        enqueue_seconds = prepare_backlog(env, n, streams)
        invocations: list[tuple[int, int, int, int, float]] = []
        warm(r)
        meter = CpuMeter(env.backend_pids(), env.redis)
        with meter, GcTimer() as gc_timer:
            started = time.perf_counter()
            while True:
                result = r.invoke()
                statements = r.statements.take()
                trips = r.round_trips.take() if r.round_trips is not None else 0
                invocations.append((result["claimed"], result["delivered"], statements, trips,
                                    result["duration_ms"]))
                if result["claimed"] == 0:
                    break
            wall = time.perf_counter() - started
    delivered = sum(i[1] for i in invocations)
    working = [i for i in invocations if i[0] > 0]
    stream_total = sum(env.redis.xlen(s) for s in env.stream_names())
    counts = env.counts()
    return {
        "batch_size": batch_size,
        "messages": n,
        "delivered": delivered,
        "wall_seconds": round(wall, 3),
        "messages_per_second": round(delivered / wall, 1) if wall else None,
        "invocations": len(invocations),
        "statements_per_batch": _spread([i[2] for i in working]),
        "redis_round_trips_per_batch": _spread([i[3] for i in working]),
        "run_batch_share_of_wall": round(sum(i[4] for i in invocations) / 1000.0 / wall, 3) if wall else None,
        "cpu_us_per_message": meter.per_message_us(delivered),
        "gc": {"collections": gc_timer.collections,
               "us_per_message": round(gc_timer.seconds / delivered * 1e6, 2) if delivered else None},
        "enqueue_seconds": round(enqueue_seconds, 2),
        "check": {
            "rows_delivered": counts.get("delivered", 0),
            "stream_entries": stream_total,
            "ok": counts.get("delivered", 0) == n == delivered == stream_total,
        },
    }


class GcTimer:
    """Time the relay process spends in the garbage collector (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.collections = 0
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections += 1
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> "GcTimer":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self._callback)


def warm(r: "Relay") -> None:
    """Touch both connections after the backlog was prepared, as a container
    invoked back to back has them (not counted)."""
    r.deps.publisher.gate()
    r.deps.store.oldest_pending_age_seconds()
    r.statements.take()
    if r.round_trips is not None:
        r.round_trips.take()


def _spread(values: list[int]) -> dict[str, float | int | None]:
    if not values:
        return {"min": None, "max": None, "mean": None}
    return {"min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 2)}
