"""Delivery lag under a steady load, with invocations handing over as a
one-minute schedule makes them do.

A producer process commits messages at an offered rate (small transactions,
as an application would), while relay "containers" (two processes, each the
real handler warm, as Lambda keeps them) run latency-mode invocations started
by a scheduler every `period` seconds, each with a Lambda-like remaining time of
`timeout` seconds: each invocation overlaps the next one's start by
timeout − margin − period. Lag is measured per message by the database and
Redis clocks on this host: commit (the row's `created_at`) to stream entry
(the entry id's milliseconds) and to recorded delivery (`delivered_at`).

The idle part runs one latency-mode invocation on a table with nothing to
deliver (a delivered history only, as a table between two bursts is) and
counts its statements and Redis round trips per poll, and checks the claim's plan.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import threading
import time
import uuid
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from . import payloads
from .env import BenchEnv

_POOL = 2000  # distinct payloads the producer cycles through (message ids are always new)
#: Most messages the producer commits in one transaction: an application's transactions are
#: small, and a message's lag counts from its transaction's start.
_PER_TRANSACTION = 100


def _producer(database_url: str, rate: float, seconds: float, prefix: str, streams: tuple[str, ...],
              ready: Any, go: Any, out: Any) -> None:
    """Commit messages at `rate` per second for `seconds`, in small transactions."""
    from outbox_relay.producer import enqueue_events_bulk

    try:
        pool = [dict(e, key=None) for e in payloads.events(_POOL, streams=streams, prefix=prefix)]
        engine = create_engine(database_url, poolclass=NullPool)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        ready.release()
        go.wait()
        tick = max(0.005, min(0.05, 1.0 / rate))
        started = time.perf_counter()
        sent = behind_max = 0
        with engine.connect() as conn:
            while True:
                elapsed = time.perf_counter() - started
                if elapsed >= seconds:
                    break
                due = int(rate * elapsed) + 1 - sent
                behind_max = max(behind_max, due)
                if due > 0:
                    batch = [dict(pool[(sent + i) % _POOL], message_id=uuid.uuid4())
                             for i in range(min(due, _PER_TRANSACTION))]
                    with conn.begin():
                        enqueue_events_bulk(conn, batch)
                    sent += len(batch)
                pause = started + (sent / rate) - time.perf_counter()
                time.sleep(max(0.0, min(tick, pause)))
        out.put({"sent": sent, "seconds": time.perf_counter() - started, "max_behind": behind_max, "error": None})
        engine.dispose()
    except BaseException as exc:  # report, never hang the parent
        ready.release()
        out.put({"sent": 0, "seconds": 0.0, "max_behind": 0, "error": f"{type(exc).__name__}: {exc}"})


def _container(database_url: str, redis_url: str, env_extra: dict[str, str], batch_size: int, ready: Any,
               commands: Any, out: Any) -> None:
    """A warm relay container: runs one latency-mode invocation per command."""
    import contextlib
    import io

    from outbox_relay import observability as obs
    from outbox_relay import runtime
    from outbox_tools.lambda_local import LocalContext, environment, load_handler

    from .handler import probe_environment, schedule_event

    values = probe_environment(database_url, redis_url, batch_size) | env_extra
    sink = io.StringIO()
    try:
        with environment(**values):
            runtime.reset()
            handler = load_handler("relay")
            obs.logger.registered_handler.setStream(sink)
            with contextlib.redirect_stdout(sink):
                # Cold start and connections before the clock starts, as a warm container.
                handler(schedule_event("redis"), LocalContext(float(env_extra["OUTBOX_DEADLINE_MARGIN_SECONDS"]) + 0.3))
                ready.release()
                while True:
                    command = commands.get()
                    if command is None:
                        return
                    sink.seek(0)
                    sink.truncate()
                    summary = handler(schedule_event("redis"), LocalContext(command))
                    out.put({"summary": summary, "error": None})
    except BaseException as exc:
        ready.release()
        out.put({"summary": None, "error": f"{type(exc).__name__}: {exc}"})


def run_latency(env: BenchEnv, *, rates: list[int], seconds: float, period: float, timeout: float, margin: float,
                batch_size: int, streams: tuple[str, ...], idle_seconds: float, idle_history: int) -> dict[str, Any]:
    """Lag at each offered rate; the highest one is lowered until it is sustained."""
    runs = []
    for rate in rates:
        run = _one_rate(env, rate, seconds, period, timeout, margin, batch_size, streams)
        runs.append(run)
        tried = rate
        while rate == rates[-1] and not run["sustained"] and tried > rates[0]:
            tried = int(tried * 0.7)
            run = _one_rate(env, tried, seconds, period, timeout, margin, batch_size, streams)
            run["lowered_from"] = rate
            runs.append(run)
    return {"period_seconds": period, "timeout_seconds": timeout, "margin_seconds": margin,
            "overlap_seconds": round(timeout - margin - period, 3), "batch_size": batch_size,
            "runs": runs, "idle": _idle(env, batch_size, idle_seconds, margin, idle_history, streams[0])}


def _one_rate(env: BenchEnv, rate: int, seconds: float, period: float, timeout: float, margin: float,
              batch_size: int, streams: tuple[str, ...]) -> dict[str, Any]:
    env.reset_table()
    env.clean_redis()
    env.vacuum_analyze()
    ctx = mp.get_context("spawn")
    env_extra = {"OUTBOX_MODE": "latency", "OUTBOX_FUNCTION_TIMEOUT_SECONDS": str(timeout),
                 "OUTBOX_LEASE_SECONDS": str(timeout + 60), "OUTBOX_DEADLINE_MARGIN_SECONDS": str(margin),
                 "OUTBOX_METRICS_INTERVAL_SECONDS": "10"}
    ready = ctx.Semaphore(0)
    results = ctx.Queue()
    commands = [ctx.Queue(), ctx.Queue()]
    containers = [ctx.Process(target=_container, args=(env.database_url, env.servers.redis_url, env_extra, batch_size,
                                                        ready, commands[i], results), daemon=True) for i in range(2)]
    produced = ctx.Queue()
    go = ctx.Event()
    producer = ctx.Process(target=_producer, args=(env.database_url, float(rate), seconds, env.prefix, streams,
                                                  ready, go, produced), daemon=True)
    for p in (*containers, producer):
        p.start()
    for _ in range(3):
        if not ready.acquire(timeout=180):
            raise RuntimeError("a latency-bench process did not start within 180 s")

    starts: list[float] = []
    stop = threading.Event()

    def schedule() -> None:
        k = 0
        first = time.time()
        while not stop.is_set():
            starts.append(time.time())
            commands[k % 2].put(timeout)
            k += 1
            stop.wait(max(0.0, first + k * period - time.time()))

    scheduler = threading.Thread(target=schedule, daemon=True)
    scheduler.start()
    time.sleep(1.0)  # the first invocation is polling before the first commit
    go.set()
    report = produced.get(timeout=seconds + 600)
    if report["error"]:
        raise RuntimeError(f"the producer failed: {report['error']}")
    drained_after = _wait_drained(env, report["sent"], limit=60.0)
    stop.set()
    scheduler.join(timeout=5)
    for c in containers:
        c.terminate()
        c.join(timeout=10)
    summaries = _drain_queue(results)
    errors = [s["error"] for s in summaries if s["error"]]
    if errors:
        raise RuntimeError(f"a relay container failed: {errors[0]}")
    return _measure(env, rate, seconds, report, drained_after, starts, summaries)


def _wait_drained(env: BenchEnv, n: int, *, limit: float) -> float | None:
    """Seconds after the producer stopped until every message was delivered (None: not within `limit`)."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        if env.counts().get("delivered", 0) >= n:
            return round(time.perf_counter() - started, 3)
        time.sleep(0.1)
    return None


def _drain_queue(q: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


_LAG = """
    WITH d AS (
        SELECT (EXTRACT(EPOCH FROM created_at) * 1000)::float8 AS created_ms,
               split_part(delivery_ref, '-', 1)::float8 - EXTRACT(EPOCH FROM created_at) * 1000 AS entry_lag,
               EXTRACT(EPOCH FROM delivered_at - created_at) * 1000 AS recorded_lag
          FROM outbox_message WHERE status = 'delivered'
    )
    SELECT count(*),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY entry_lag), percentile_cont(0.99) WITHIN GROUP (ORDER BY entry_lag),
           max(entry_lag), avg(entry_lag),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY recorded_lag),
           percentile_cont(0.99) WITHIN GROUP (ORDER BY recorded_lag), max(recorded_lag), avg(recorded_lag),
           (SELECT array_agg(w.m ORDER BY w.at) FROM (
                SELECT s.at, (SELECT max(entry_lag) FROM d
                               WHERE d.created_ms BETWEEN s.at - 1000 AND s.at + 3000) AS m
                  FROM unnest(CAST(:starts AS float8[])) AS s(at)) w)
      FROM d
"""


def _measure(env: BenchEnv, rate: int, seconds: float, report: dict[str, Any], drained_after: float | None,
             starts: list[float], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    with env.engine.connect() as conn:
        n, e50, e99, emax, emean, r50, r99, rmax, rmean, handover = conn.execute(
            text(_LAG), {"starts": "{" + ",".join(f"{t * 1000:.3f}" for t in starts[1:]) + "}"}).one()
    entries = sum(env.redis.xlen(s) for s in env.stream_names())
    sent = report["sent"]
    offered_seconds = report["seconds"]
    sustained = (sent >= 0.98 * rate * seconds and drained_after is not None and drained_after <= 5.0)

    def spread(p50: Any, p99: Any, top: Any, mean: Any) -> dict[str, float | None]:
        return {k: (round(float(v), 1) if v is not None else None)
                for k, v in (("p50", p50), ("p99", p99), ("max", top), ("mean", mean))}

    return {
        "offered_per_second": rate,
        "seconds": round(offered_seconds, 1),
        "sent": sent,
        "producer_max_behind": report["max_behind"],
        "delivered": n,
        "delivered_per_second": round(n / offered_seconds, 1) if offered_seconds else None,
        "drained_seconds_after_producer": drained_after,
        "invocations": len(starts),
        "handovers": len(starts) - 1,
        "lag_ms": spread(e50, e99, emax, emean),
        "recorded_lag_ms": spread(r50, r99, rmax, rmean),
        "handover_max_lag_ms": [round(float(h), 1) for h in (handover or []) if h is not None],
        "sustained": sustained,
        "invocation_summaries": [{k: s["summary"][k] for k in ("claimed", "delivered", "batches", "polls",
                                                                "duration_ms", "delivery_lag_ms")}
                                 for s in summaries if s.get("summary")],
        "check": {"rows_delivered": n, "stream_entries": entries, "ok": n == sent == entries},
    }


def _idle(env: BenchEnv, batch_size: int, seconds: float, margin: float, history: int,
          stream: str) -> dict[str, Any]:
    """One latency-mode invocation with nothing to deliver: statements and round trips per poll."""
    from outbox_relay import sql
    from outbox_relay.models import Channel
    from outbox_relay.store import LeaseStore

    from .growth import _seed
    from .handler import relay

    _seed(env, delivered=history, pending=0, stream=env.prefix + stream.removeprefix("bench."))
    extra = {"OUTBOX_MODE": "latency", "OUTBOX_FUNCTION_TIMEOUT_SECONDS": str(seconds + margin),
             "OUTBOX_LEASE_SECONDS": str(seconds + margin + 60), "OUTBOX_DEADLINE_MARGIN_SECONDS": str(margin)}
    with relay(env, batch_size, timeout_seconds=seconds + margin, extra_env=extra) as r:
        started = time.perf_counter()
        summary = r.invoke()
        wall = time.perf_counter() - started
        statements = r.statements.take()
        trips = r.round_trips.take() if r.round_trips is not None else None
    with relay(env, batch_size) as r:  # one batch-mode invocation on the same idle table, warm
        timings = []
        for _ in range(20):
            started = time.perf_counter()
            r.invoke()
            timings.append(time.perf_counter() - started)
    batch_ms = round(sorted(timings)[len(timings) // 2] * 1000, 2)
    params = LeaseStore(env.engine, Channel.REDIS, default_max_attempts=10).claim_parameters(
        "explain", batch_size, 60.0, 1 << 24)
    with env.engine.connect() as conn:  # the table is empty: the claim changes nothing
        (plan,) = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.relay.claim.text), params).one()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    nodes = _plan_nodes(plan[0]["Plan"])
    polls = summary["polls"]
    return {
        "history_rows": history, "seconds": round(wall, 2), "polls": polls, "batch_invocation_ms": batch_ms, "polls_per_second": round(polls / wall, 2) if wall else None,
        "statements": statements, "statements_per_poll": round(statements / polls, 3) if polls else None,
        "redis_round_trips_per_poll": round(trips / polls, 3) if trips is not None and polls else None,
        "claim_execution_ms": round(plan[0]["Execution Time"], 3),
        "claim_plan_index_scans": sorted({n["Index Name"] for n in nodes if "Index Name" in n}),
        "claim_plan_seq_scans": sorted({n.get("Relation Name", "?") for n in nodes if n["Node Type"] == "Seq Scan"}),
    }


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node.get("Plans", []):
        out.extend(_plan_nodes(child))
    return out
