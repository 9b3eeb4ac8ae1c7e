"""Drain throughput of the Redis channel.

`run_drain`: one invocation in drain mode (OUTBOX_MODE=drain, pipelined) over a
backlog of N messages, at each batch size, and two such invocations at once in
two processes (each then invokes again until an invocation claims nothing: a
claim cut short by the other's concurrent claim may end an invocation with
messages left); then the two entry layouts (OUTBOX_REDIS_FORMAT) on messages
with a trace context, interleaved, as a ratio (`compare_layouts`). `batches`: invocations in batch mode back to back, in this
process (held to Lambda's CPU while they run: `lambda_model.holding`), until one
claims nothing.

Messages/second = messages delivered / wall time of the drain loop (enqueue
excluded). Each invocation is the real handler (see `handler`); drain-mode
invocations run in container processes held to Lambda's CPU at the function's
memory (`lambda_model.start`). Per
invocation that claimed something, the database statements and Redis round
trips are counted; they must not grow with the batch size.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from sqlalchemy import text

from . import lambda_model
from .env import BenchEnv, CpuMeter
from .handler import Relay, relay


def prepare_backlog(env: BenchEnv, n: int, streams: tuple[str, ...], keys: int | None = None,
                    edit: Any = None) -> float:
    """Empty the table and the prefix, enqueue `n` messages (keyless, or over
    `keys` ordering keys; `edit` as `BenchEnv.enqueue` takes it), VACUUM ANALYZE,
    CHECKPOINT. Returns the enqueue seconds."""
    env.reset_table()
    env.clean_redis()
    seconds = env.enqueue(n, streams=streams, keys=keys, edit=edit)
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


DRAIN_ENV = {"OUTBOX_MODE": "drain", "OUTBOX_FUNCTION_TIMEOUT_SECONDS": "600", "OUTBOX_LEASE_SECONDS": "900"}


def run_drain(env: BenchEnv, *, n: int, batch_sizes: list[int], streams: tuple[str, ...]) -> dict[str, Any]:
    """Drain mode: one invocation per batch size, then two at once at the largest."""
    runs = [one_invocation(env, n=n, batch_size=b, streams=streams) for b in batch_sizes]
    from .concurrency import run_concurrency

    two = run_concurrency(env, n=n, batch_size=max(batch_sizes), processes=[2], streams=streams,
                          extra_env=DRAIN_ENV, timeout_seconds=600)["runs"][0]
    two |= {"batch_size": max(batch_sizes)}
    layouts = compare_layouts(env, n=n, batch_size=1000 if 1000 in batch_sizes else max(batch_sizes), streams=streams)
    return {"messages": n, "streams": list(streams), "mode": "drain", "runs": runs, "two_invocations": two,
            "layouts": layouts}


#: A W3C trace context on every message of the layouts' comparison, as a traced producer stores it.
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def compare_layouts(env: BenchEnv, *, n: int, batch_size: int, streams: tuple[str, ...],
                    rounds: int = 3) -> dict[str, Any]:
    """Drain mode with OUTBOX_REDIS_FORMAT=fields and =cloudevents, interleaved for `rounds`,
    on messages with a trace context: the medians, and cloudevents / fields. The round
    trips per batch must be the same: the layout changes an argument, not the calls."""
    def traced(i: int, event: dict[str, Any]) -> dict[str, Any]:
        return {**event, "headers": {"traceparent": TRACEPARENT}}

    got: dict[str, list[dict[str, Any]]] = {"fields": [], "cloudevents": []}
    for _ in range(rounds):
        for layout, runs in got.items():
            runs.append(one_invocation(env, n=n, batch_size=batch_size, streams=streams, edit=traced,
                                       extra_env={"OUTBOX_REDIS_FORMAT": layout}))
    out: dict[str, Any] = {"batch_size": batch_size, "rounds": rounds}
    for layout, runs in got.items():
        out[layout] = {"messages_per_second": _median([r["messages_per_second"] for r in runs]),
                       "redis_round_trips_per_batch": _median([r["redis_round_trips_per_batch"] for r in runs]),
                       "ok": all(r["check"]["ok"] for r in runs)}
    fields, cloudevents = out["fields"]["messages_per_second"], out["cloudevents"]["messages_per_second"]
    out["cloudevents_vs_fields"] = round(cloudevents / fields, 2) if fields else None
    return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def one_invocation(env: BenchEnv, *, n: int, batch_size: int, streams: tuple[str, ...],
                   keys: int | None = None, edit: Any = None,
                   extra_env: dict[str, str | None] | None = None) -> dict[str, Any]:
    """One drain-mode invocation over a backlog of `n` (keyless, or over `keys` ordering keys;
    each message `edit`ed when given), with `extra_env` on top of drain mode's, in a container
    process of its own held to the bench's CPU (`lambda_model.start`)."""
    from .concurrency import env_arguments, run_together

    [got], _ = run_together(env, 1, _one_invocation, (env_arguments(env), batch_size,
                                                      {**DRAIN_ENV, **(extra_env or {})}),
                            n=n, streams=streams, keys=keys, edit=edit, what="relay")
    counts = env.counts()
    entries = sum(env.redis.xlen(s) for s in env.stream_names())
    batches = max(1, got["batches"])
    return {
        "batch_size": batch_size, "invocations": 1, "processes": 1, "messages": n, "delivered": got["delivered"],
        "wall_seconds": round(got["wall"], 3), "messages_per_second": round(got["delivered"] / got["wall"], 1),
        "batches": got["batches"], "statements_per_batch": round(got["statements"] / batches, 2),
        "redis_round_trips_per_batch": round(got["trips"] / batches, 2),
        "cpu_us_per_message": got["cpu_us_per_message"], "cold_start_seconds": round(got["cold_start_seconds"], 3),
        "check": {"rows_delivered": counts.get("delivered", 0), "stream_entries": entries,
                  "ok": counts.get("delivered", 0) == n == got["delivered"] == entries},
    }


def _one_invocation(ready: Any, go: Any, out: Any, env_args: dict[str, Any], batch_size: int,
                    extra_env: dict[str, str | None]) -> None:
    """The container of `one_invocation`: warm, then one invocation timed once `go` is set."""
    from .concurrency import worker_env
    from .lambda_model import process_age_seconds

    env = worker_env(env_args)
    try:
        with relay(env, batch_size, timeout_seconds=600, extra_env=extra_env) as r:
            cold_start = process_age_seconds()
            ready.release()
            go.wait()
            warm(r)
            meter = CpuMeter(env.backend_pids(), env.redis)
            with meter:
                started = time.perf_counter()
                result = r.invoke()
                wall = time.perf_counter() - started
            out.put({"delivered": result["delivered"], "batches": result["batches"], "wall": wall,
                     "statements": r.statements.take(),
                     "trips": r.round_trips.take() if r.round_trips is not None else 0,
                     "cpu_us_per_message": meter.per_message_us(result["delivered"]),
                     "cold_start_seconds": cold_start, "error": None})
    except BaseException as exc:  # report, never hang the parent
        ready.release()
        out.put({"delivered": 0, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        env.close()


def batches(env: BenchEnv, *, n: int, batch_size: int, streams: tuple[str, ...]) -> dict[str, Any]:
    """Batch mode: drain `n` messages with invocations back to back at `batch_size`."""
    with relay(env, batch_size) as r:
        enqueue_seconds = prepare_backlog(env, n, streams)
        invocations: list[tuple[int, int, int, int, float]] = []
        warm(r)
        meter = CpuMeter(env.backend_pids(), env.redis)
        with lambda_model.holding(), meter, GcTimer() as gc_timer:
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
