"""Delivery lag under a steady load, with latency-mode pollers handing over as
AWS's scheduler and Lambda start them.

Producer processes commit messages at an offered rate (split between them, small
transactions, as applications would), while relay "containers" (a pool of warm
processes, each the real handler, one invocation at a time, as Lambda keeps
them) run latency-mode invocations. A scheduler (`lambda_model.SchedulerModel`)
starts one every `period` seconds, punctually or as late within its slot as
`start_jitter` allows, some runs missed, each after a cold start; a poller near
its deadline with no newer one starts its successor itself through boto3 and an
Invoke API stand-in on loopback (`lambda_model.InvokeApi`). Invocations beyond the
reserved concurrency are throttled (`lambda_model.LocalLambda`). Each container is
held to Lambda's CPU at the function's memory (`lambda_model.start`).

Lag is measured per message by the database and Redis clocks on this host:
commit (the row's `created_at`) to stream entry (the entry id's milliseconds)
and to recorded delivery (`delivered_at`). The seconds without a poller come
from the registry (`outbox_poller`) and, as a cross-check, from when the bench's
own invocations ran.

The idle part runs one latency-mode invocation on a table with nothing to
deliver (a delivered history only, as a table between two bursts is) and
counts its statements and Redis round trips per poll, and checks the claim's plan.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import queue
import random
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from . import lambda_model, payloads
from .env import BenchEnv, is_local_backend, process_cpu_seconds
from .lambda_model import (
    FUNCTION_NAME,
    MAX_EVENT_AGE_SECONDS,
    Invocation,
    InvokeApi,
    LocalLambda,
    SchedulerModel,
    aws_environment,
    covered_seconds,
    plan_slots,
    schedule_event,
    uncovered,
)

_POOL = 2000  # distinct payloads a producer cycles through (message ids are always new)
#: Most messages a producer commits in one transaction: an application's transactions are
#: small, and a message's lag counts from its transaction's start.
_PER_TRANSACTION = 100
#: Offered messages per second per producer process, at most (more processes above it).
_PER_PRODUCER = 500
_MAX_PRODUCERS = 4
#: Warm containers of the function (at least one more than the reserved concurrency).
_MIN_CONTAINERS = 4
#: Seconds the producer starts after the first poller began polling.
_SETTLE = 1.0
#: Seconds to wait after the producer for every message to be delivered.
_DRAIN_LIMIT = 60.0


def producers_for(rate: int) -> int:
    """Producer processes for an offered rate: enough that each offers at most `_PER_PRODUCER`."""
    return max(1, min(_MAX_PRODUCERS, math.ceil(rate / _PER_PRODUCER)))


#: The seed of the first producer; producer i commits with seed `FIRST_SEED + i`.
FIRST_SEED = 6


def producer_key(seed: int, i: int, keys: int) -> str:
    """The ordering key of the i-th message producer `seed` commits over `keys` keys of its own."""
    return f"p{seed}.{i % keys}"


def offered_by(rate: float | list[tuple[float, float]], elapsed: float) -> float:
    """Messages offered in `elapsed` seconds at `rate` per second, or along steps of (seconds, rate)."""
    if not isinstance(rate, list):
        return rate * elapsed
    total = 0.0
    for seconds, step_rate in rate:
        total += step_rate * max(0.0, min(elapsed, seconds))
        elapsed -= seconds
    return total


def _step_start(rate: float | list[tuple[float, float]], elapsed: float) -> float:
    """When the step that `elapsed` falls in began (0 at a constant rate)."""
    start = 0.0
    for seconds, _ in rate[:-1] if isinstance(rate, list) else ():
        if elapsed < start + seconds:
            break
        start += seconds
    return start


def _producer(database_url: str, rate: float | list[tuple[float, float]], seconds: float, prefix: str,
              streams: tuple[str, ...], seed: int, keys: int | None, ready: Any, go: Any, out: Any) -> None:
    """Commit messages at `rate` per second (or along its steps) for `seconds`, in small
    transactions; with `keys`, the i-th message takes key i mod `keys` of this producer's
    own (no other producer commits to them, so their enqueue order is their commit order)."""
    from outbox_relay.ids import uuid7
    from outbox_relay.producer import enqueue_events_bulk

    try:
        pool = [dict(e, key=None) for e in payloads.events(_POOL, seed=seed, streams=streams, prefix=prefix)]
        engine = create_engine(database_url, poolclass=NullPool)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        ready.release()
        go.wait()
        peak = max(r for _, r in rate) if isinstance(rate, list) else rate
        tick = max(0.005, min(0.05, 1.0 / peak))
        began = time.time()
        started = time.perf_counter()
        sent = behind_max = 0
        step_began = carried = 0.0
        with engine.connect() as conn:
            while True:
                elapsed = time.perf_counter() - started
                if elapsed >= seconds:
                    break
                begun = _step_start(rate, elapsed)
                if begun != step_began:  # a step's shortfall is not carried into the next: each offers its rate
                    step_began, carried = begun, max(0.0, offered_by(rate, begun) - sent)
                due = int(offered_by(rate, elapsed) - carried) + 1 - sent
                behind_max = max(behind_max, due)
                if due > 0:
                    batch = [dict(pool[(sent + i) % _POOL], message_id=uuid7(),
                                  key=None if keys is None else producer_key(seed, sent + i, keys))
                             for i in range(min(due, _PER_TRANSACTION))]
                    with conn.begin():
                        enqueue_events_bulk(conn, batch)
                    sent += len(batch)
                pause = (tick if due <= _PER_TRANSACTION else 0.0) if isinstance(rate, list) else \
                    started + (sent / rate) - time.perf_counter()
                time.sleep(max(0.0, min(tick, pause)))
        out.put({"sent": sent, "seconds": time.perf_counter() - started, "began": began, "ended": time.time(),
                 "max_behind": behind_max, "error": None})
        engine.dispose()
    except BaseException as exc:  # report, never hang the parent
        ready.release()
        out.put({"sent": 0, "seconds": 0.0, "began": None, "ended": None, "max_behind": 0,
                 "error": f"{type(exc).__name__}: {exc}"})


def _container(index: int, database_url: str, redis_url: str, env_extra: dict[str, str | None], batch_size: int,
               ready: Any, commands: Any, out: Any) -> None:
    """A warm relay container: runs one latency-mode invocation per command, each after
    the cold start, with the remaining time counted from when it was requested."""
    import contextlib
    import io

    from outbox_relay import observability as obs
    from outbox_relay import runtime
    from outbox_tools.lambda_local import LocalContext, environment, load_handler

    from .handler import probe_environment
    from .handler import schedule_event as sample_event

    values = probe_environment(database_url, redis_url, batch_size) | env_extra
    sink = io.StringIO()
    try:
        obs.logger.registered_handler.setStream(sink)
        with contextlib.redirect_stdout(sink):
            # Imports and the handler's first call before the clock starts, as in a warm
            # container: one batch-mode invocation on the empty table (latency mode would
            # register a poller), then the latency-mode dependencies, connected.
            with environment(**(values | {"OUTBOX_MODE": "batch"})):
                runtime.reset()
                handler = load_handler("relay")
                handler(sample_event("redis"), LocalContext(30.0, function_name=FUNCTION_NAME))
            with environment(**values):
                runtime.reset()
                deps = runtime.get_dependencies()
                with runtime.get_engine().connect() as conn:
                    conn.execute(text("SELECT 1"))
                load_script = getattr(deps.publisher, "_script_sha", None)
                if load_script is not None:
                    load_script()
                ready.release()
                while True:
                    command = commands.get()
                    if command is None:
                        return
                    sink.seek(0)
                    sink.truncate()
                    wait = command["cold_start"] - (time.monotonic() - command["requested_mono"])
                    if wait > 0:
                        time.sleep(wait)
                    left = command["timeout"] - (time.monotonic() - command["requested_mono"])
                    out.put({"kind": "begin", "id": command["id"], "container": index, "at": time.time()})
                    summary = error = None
                    try:
                        summary = handler(command["event"], LocalContext(left, function_name=FUNCTION_NAME))
                    except Exception as exc:  # the invocation failed; the container goes on
                        error = f"{type(exc).__name__}: {exc}"
                    out.put({"kind": "end", "id": command["id"], "container": index, "at": time.time(),
                             "summary": summary, "error": error})
    except BaseException as exc:
        ready.release()
        out.put({"kind": "crashed", "container": index, "error": f"{type(exc).__name__}: {exc}"})


def run_latency(env: BenchEnv, *, rates: list[int], seconds: float, model: SchedulerModel, batch_size: int,
                streams: tuple[str, ...], idle_seconds: float, idle_history: int,
                producers: int | None = None) -> dict[str, Any]:
    """Lag at each offered rate under `model`; the highest rate is lowered until it is sustained."""
    seed = model.seed if model.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    runs = []
    for rate in rates:
        run = _one_rate(env, rate, seconds, model, rng, batch_size, streams, producers)
        runs.append(run)
        tried = rate
        while rate == rates[-1] and not run["sustained"] and tried > rates[0]:
            tried = int(tried * 0.7)
            run = _one_rate(env, tried, seconds, model, rng, batch_size, streams, producers)
            run["lowered_from"] = rate
            runs.append(run)
    entry = {"model": model.as_dict() | {"seed": seed}, "label": model.label(), "period_seconds": model.period,
             "timeout_seconds": model.timeout, "lease_seconds": model.lease, "margin_seconds": model.margin,
             "reserved_concurrency": model.reserved_concurrency, "max_event_age_seconds": MAX_EVENT_AGE_SECONDS,
             "batch_size": batch_size, "seconds": seconds, "runs": runs, "started_at": started_at,
             "load_average_at_start": load}
    return {"models": {model.key: entry},
            "idle": _idle(env, batch_size, idle_seconds, model.margin, idle_history, streams[0])}


def _reset(env: BenchEnv) -> None:
    env.reset_table()
    with env.engine.connect() as conn:
        if conn.execute(text("SELECT to_regclass('outbox_poller') IS NOT NULL")).scalar_one():
            conn.execute(text("TRUNCATE outbox_poller"))
    env.clean_redis()
    env.vacuum_analyze()


def _one_rate(env: BenchEnv, rate: int, seconds: float, model: SchedulerModel, rng: random.Random,
              batch_size: int, streams: tuple[str, ...], producers: int | None, *, pollers: int = 1,
              keys: int | None = None, during: Callable[[float], None] | None = None,
              drain_limit: float = _DRAIN_LIMIT, backlog: int = 0, backlog_keys: int | None = None,
              backlog_edit: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None,
              steps: list[tuple[float, float]] | None = None, settings: dict[str, str] | None = None) -> dict[str, Any]:
    """One offered rate (`rate`, or along `steps` of (seconds, rate), `rate` their mean).
    `pollers` sets OUTBOX_POLLERS, and the first slot starts one run per poller slot (as
    that many periods of the schedule would), with the reserved concurrency the template
    derives (2 per poller at most + 1) if the model's is lower; `settings` more of the
    function's environment (OUTBOX_POLLERS_MAX: the most pollers); `keys`
    ordering keys per producer, checked in the stream; `during(began)` runs in a thread
    once the producers began (epoch seconds); `backlog` messages (over `backlog_keys` keys,
    else `keys`; `backlog_edit` as `BenchEnv.enqueue`'s `edit`) wait when the first poller starts
    (enqueued once the containers are warm)."""
    _reset(env)
    ctx = mp.get_context("spawn")
    settings = settings or {}
    n_producers = producers or producers_for(max(r for _, r in steps) if steps else rate)
    reserved = max(model.reserved_concurrency, 2 * int(settings.get("OUTBOX_POLLERS_MAX") or pollers) + 1)
    n_containers = max(_MIN_CONTAINERS, reserved + 1)
    commands = [ctx.Queue() for _ in range(n_containers)]
    reports = ctx.Queue()
    lam = LocalLambda(commands, timeout=model.timeout, cold_start=model.cold_start, reserved=reserved)
    api = InvokeApi(lambda event: lam.invoke_async(event, "self-invoke"), _refused(lam))
    env_extra = {"OUTBOX_MODE": "latency", "OUTBOX_FUNCTION_TIMEOUT_SECONDS": f"{model.timeout:g}",
                 "OUTBOX_LEASE_SECONDS": f"{model.lease:g}", "OUTBOX_DEADLINE_MARGIN_SECONDS": f"{model.margin:g}",
                 "OUTBOX_METRICS_INTERVAL_SECONDS": "10", "OUTBOX_SELF_INVOKE": "true",
                 "OUTBOX_POLLERS": str(pollers)} | settings | aws_environment(api.url)
    ready = ctx.Semaphore(0)
    go = ctx.Event()
    produced = ctx.Queue()
    containers = [ctx.Process(target=_container, args=(i, env.database_url, env.servers.redis_url, env_extra,
                                                       batch_size, ready, commands[i], reports), daemon=True)
                  for i in range(n_containers)]
    share = [(s, r / n_producers) for s, r in steps] if steps else rate / n_producers
    producer_processes = [ctx.Process(target=_producer, args=(env.database_url, share, seconds,
                                                              env.prefix, streams, FIRST_SEED + i, keys, ready, go,
                                                              produced),
                                      daemon=True) for i in range(n_producers)]
    stop = threading.Event()
    crashed: list[str] = []
    threads: list[threading.Thread] = []
    try:
        for p in containers:  # the function's containers; the producers are the application's
            lambda_model.start(p)
        for p in producer_processes:
            p.start()
        for _ in range(n_containers + n_producers):
            if not ready.acquire(timeout=600):
                raise RuntimeError("a latency-bench process did not start within 600 s")
        if backlog:
            env.enqueue(backlog, streams=streams, keys=backlog_keys or keys, edit=backlog_edit)
            env.vacuum_analyze()

        def collect() -> None:
            while not stop.is_set():
                try:
                    message = reports.get(timeout=0.2)
                except queue.Empty:
                    continue
                if message["kind"] == "crashed":
                    crashed.append(message["error"])
                    stop.set()
                else:
                    lam.on_message(message)

        t0 = time.time() + 0.5
        measured_for = model.cold_start + _SETTLE + seconds
        slots = plan_slots(model, rng, measured_for=measured_for,
                           # The schedule fires while the bench waits for the drain, as EventBridge would.
                           horizon=model.start_jitter + measured_for + drain_limit + 2 * model.period)

        def schedule() -> None:
            for slot in slots:
                if stop.wait(max(0.0, t0 + slot.start - time.time())):
                    return
                if slot.index == 0 and pollers > 1:
                    for k in range(pollers):
                        lam.invoke_async(schedule_event(t0 + slot.at) | {"slot": k}, "schedule", slot.index)
                elif not slot.missed:
                    lam.invoke_async(schedule_event(t0 + slot.at), "schedule", slot.index)

        threads = [threading.Thread(target=collect, daemon=True), threading.Thread(target=schedule, daemon=True)]
        for t in threads:
            t.start()
        first = next(s for s in slots if s.index == 0)
        if not lam.first_began.wait(timeout=first.start + model.cold_start + 120) or crashed:
            raise RuntimeError(f"the first invocation did not start: {crashed[0] if crashed else 'timed out'}")
        while sum(1 for i in lam.invocations if i.began is not None) < pollers and not crashed:
            if time.time() > t0 + first.start + model.cold_start + 120:
                raise RuntimeError(f"fewer than {pollers} pollers started within 120 s")
            time.sleep(0.05)
        time.sleep(_SETTLE)  # the first pollers are polling before the first commit
        cpu = _CpuSampler(env)
        go.set()
        cpu.start()
        if during is not None:
            threads.append(threading.Thread(target=during, args=(time.time(),), daemon=True))
            threads[-1].start()
        outcomes = [produced.get(timeout=seconds + 600) for _ in producer_processes]
        cpu.stop()
        failed = [o["error"] for o in outcomes if o["error"]]
        if failed:
            raise RuntimeError(f"a producer failed: {failed[0]}")
        sent = sum(o["sent"] for o in outcomes)
        drained_after = _wait_drained(env, sent + backlog, limit=drain_limit)
        if crashed:
            raise RuntimeError(f"a relay container failed: {crashed[0]}")
        # Read the registry while the last pollers still renew their registrations.
        registry = _registry(env)
        lam.close()
        stopped_at = time.time()
    finally:
        stop.set()
        lam.close()
        api.close()
        for t in threads:
            t.join(timeout=5)
        for p in (*containers, *producer_processes):
            p.terminate()
        for p in (*containers, *producer_processes):
            p.join(timeout=10)
        for p in containers:
            lambda_model.release(p)
    run = _measure(env, rate, seconds, outcomes, drained_after, model, t0, slots, lam, registry, stopped_at,
                   backlog)
    run |= {"pollers": pollers, "keys_per_producer": keys, "cpu_cores": cpu.result()}
    if keys is not None:
        from .ordering import key_order

        order = key_order(env)
        run["order"] = order
        run["check"]["order_violations"] = order["order_violations"]
        run["check"]["ok"] = run["check"]["ok"] and order["order_violations"] == 0
    return run


class _CpuSampler:
    """Cores used while the producers run: the bench database's PostgreSQL backends
    (the relay's, named outbox-relay, and all) and the whole machine, sampled each
    second from /proc (a backend's CPU counts from its first sample to its last)."""

    def __init__(self, env: BenchEnv) -> None:
        self.env = env
        self.first: dict[int, tuple[str, float]] = {}
        self.last: dict[int, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.began = self.ended = 0.0
        self.machine0 = self.machine1 = (0.0, 0.0)

    @staticmethod
    def _machine() -> tuple[float, float]:
        with open("/proc/stat") as f:
            ticks = [float(v) for v in f.readline().split()[1:]]
        return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # busy, total (idle and iowait excluded)

    def _sample(self) -> None:
        with self.env.engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT pid, application_name, EXTRACT(EPOCH FROM backend_start)::float8 FROM pg_stat_activity "
                "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": self.env.database_name}).all()
        for pid, name, started in rows:
            if pid not in self.first and not is_local_backend(pid, started):
                continue
            used = process_cpu_seconds(pid)
            if used is not None:
                self.first.setdefault(pid, (name, used))
                self.last[pid] = used

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                self._sample()
            except Exception:  # a sample missed; the next one counts
                pass
            self.done.wait(1.0)

    def start(self) -> None:
        self.began, self.machine0 = time.time(), self._machine()
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)
        self.ended, self.machine1 = time.time(), self._machine()

    def result(self) -> dict[str, Any]:
        wall = self.ended - self.began
        if wall <= 0:
            return {}
        used = {pid: self.last[pid] - first for pid, (_, first) in self.first.items()}
        relay = sum(v for pid, v in used.items() if self.first[pid][0] == "outbox-relay")
        busy = self.machine1[0] - self.machine0[0]
        total = self.machine1[1] - self.machine0[1]
        return {"postgresql_relay": round(relay / wall, 3), "postgresql_all": round(sum(used.values()) / wall, 3),
                "machine_busy": round(busy / total * (os.cpu_count() or 1), 3) if total else None,
                "machine_cores": os.cpu_count(), "seconds": round(wall, 1)}


def _refused(lam: LocalLambda) -> Any:
    def refused() -> None:
        with lam.lock:
            lam.refused += 1
    return refused


def _wait_drained(env: BenchEnv, n: int, *, limit: float) -> float | None:
    """Seconds after the producer stopped until every message was delivered (None: not within `limit`)."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        if env.counts().get("delivered", 0) >= n:
            return round(time.perf_counter() - started, 3)
        time.sleep(0.1)
    return None


_REGISTRY = """
    SELECT owner, EXTRACT(EPOCH FROM started_at)::float8,
           EXTRACT(EPOCH FROM CASE WHEN left_at IS NULL AND expires_at > now() THEN now()
                                   ELSE coalesce(left_at, seen_at) END)::float8,
           gap_seconds, successor_requested_at IS NOT NULL, taken_over_at IS NOT NULL, left_at IS NOT NULL
      FROM outbox_poller WHERE channel = 'redis' ORDER BY started_at
"""


def _registry(env: BenchEnv) -> list[dict[str, Any]] | None:
    """The channel's poller registrations; a live one covers until now (None: no registry)."""
    with env.engine.connect() as conn:
        if not conn.execute(text("SELECT to_regclass('outbox_poller') IS NOT NULL")).scalar_one():
            return None
        return [{"owner": owner, "started": started, "until": until, "gap_seconds": gap, "successor": successor,
                 "taken_over": taken, "left": left}
                for owner, started, until, gap, successor, taken, left in conn.execute(text(_REGISTRY))]


_DELIVERED = """
    WITH d AS (
        SELECT (EXTRACT(EPOCH FROM created_at) * 1000)::float8 AS created_ms,
               split_part(delivery_ref, '-', 1)::float8 - EXTRACT(EPOCH FROM created_at) * 1000 AS entry_lag,
               EXTRACT(EPOCH FROM delivered_at - created_at) * 1000 AS recorded_lag
          FROM outbox_message WHERE status = 'delivered'
    )
"""
_LAG = _DELIVERED + """
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
# The lag of each second's commits (seconds from :origin, when the producers began), for the figure.
_LAG_PER_SECOND = _DELIVERED + """
    SELECT floor(created_ms / 1000 - :origin)::int AS second,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY entry_lag), percentile_cont(0.99) WITHIN GROUP (ORDER BY entry_lag),
           max(entry_lag)
      FROM d GROUP BY 1 ORDER BY 1
"""


def _measure(env: BenchEnv, rate: int, seconds: float, outcomes: list[dict[str, Any]], drained_after: float | None,
             model: SchedulerModel, t0: float, slots: list[Any], lam: LocalLambda,
             registry: list[dict[str, Any]] | None, stopped_at: float, backlog: int = 0) -> dict[str, Any]:
    lo = min(o["began"] for o in outcomes)
    hi = max(o["ended"] for o in outcomes)
    wall = hi - lo
    invocations: list[Invocation] = list(lam.invocations)
    begun = sorted(i.began for i in invocations if i.began is not None)
    handover_starts = [b for b in begun[1:] if lo - 1.0 <= b <= hi]
    with env.engine.connect() as conn:
        n, e50, e99, emax, emean, r50, r99, rmax, rmean, handover = conn.execute(
            text(_LAG), {"starts": "{" + ",".join(f"{t * 1000:.3f}" for t in handover_starts) + "}"}).one()
        per_second = conn.execute(text(_LAG_PER_SECOND), {"origin": lo}).all()
        committed = {str(r) for (r,) in conn.execute(text("SELECT message_id FROM outbox_message"))}
    stream_ids = env.stream_message_ids()
    distinct = set(stream_ids)
    duplicates = len(stream_ids) - len(distinct)
    lost = len(committed - distinct)
    sent = sum(o["sent"] for o in outcomes)
    offered_seconds = max(o["seconds"] for o in outcomes)
    sustained = (sent >= 0.98 * rate * seconds and drained_after is not None and drained_after <= 5.0)

    def spread(p50: Any, p99: Any, top: Any, mean: Any) -> dict[str, float | None]:
        return {k: (round(float(v), 1) if v is not None else None)
                for k, v in (("p50", p50), ("p99", p99), ("max", top), ("mean", mean))}

    # Invocations the run asked for: requested before the producer stopped.
    asked = [i for i in invocations if i.accepted_at < hi]
    ran = [(i.began, i.ended if i.ended is not None else stopped_at) for i in invocations if i.began is not None]
    occupied = [(i.requested_at, i.ended if i.ended is not None else stopped_at)
                for i in invocations if i.requested_at is not None]
    bench_gap, bench_longest, bench_gaps = uncovered(ran, lo, hi)
    without = {"bench_seconds": round(bench_gap, 3), "bench_longest_seconds": round(bench_longest, 3),
               "bench_gaps": bench_gaps}
    if registry is not None:
        spans = [(r["started"], r["until"]) for r in registry]
        reg_gap, reg_longest, reg_gaps = uncovered(spans, lo, hi)
        registered = [r for r in registry if lo <= r["started"] <= hi]
        without |= {"registry_seconds": round(reg_gap, 3), "registry_longest_seconds": round(reg_longest, 3),
                    "registry_gaps": reg_gaps,
                    "registered_gap_seconds": round(sum(r["gap_seconds"] or 0.0 for r in registered), 3),
                    "pollers_registered": len(registry),
                    "successors_requested": sum(1 for r in registry if r["successor"]),
                    "taken_over": sum(1 for r in registry if r["taken_over"]),
                    "poller_seconds_per_second": round(covered_seconds(spans, lo, hi) / wall, 3) if wall else None}
    errors = [i.error for i in invocations if i.error]
    over_timeout = sum(1 for i in invocations if i.requested_at is not None and i.ended is not None
                       and i.ended - i.requested_at > model.timeout)
    slots_asked = [s for s in slots if t0 + s.start < hi]
    counts = {
        "slots": len(slots_asked),
        "by_schedule": sum(1 for i in asked if i.source == "schedule" and i.began is not None),
        "by_self_invoke": sum(1 for i in asked if i.source == "self-invoke" and i.began is not None),
        "self_invokes_received": sum(1 for i in asked if i.source == "self-invoke"),
        "missed": sum(1 for s in slots_asked if s.missed),
        "throttled": sum(i.throttles for i in asked),
        "dropped": sum(1 for i in asked if i.dropped),
        "refused_invokes": lam.refused,
        "errors": len(errors),
        "over_timeout": over_timeout,
        "most_at_once": _most_at_once(occupied, lo, hi),
    }
    timeline = [{"source": i.source, "slot": i.slot, "accepted": _rel(i.accepted_at, lo),
                 "requested": _rel(i.requested_at, lo), "began": _rel(i.began, lo), "ended": _rel(i.ended, lo),
                 "container": i.container, "throttles": i.throttles, "dropped": i.dropped,
                 "predecessor": i.predecessor is not None, "error": i.error,
                 "summary": None if not i.summary else {k: i.summary.get(k) for k in (
                     "claimed", "delivered", "batches", "polls", "duration_ms", "handover")}}
                for i in invocations]
    return {
        "offered_per_second": rate,
        "began_at": lo,
        "seconds": round(offered_seconds, 1),
        "producers": len(outcomes),
        "sent": sent,
        "sent_per_second": round(sent / offered_seconds, 1) if offered_seconds else None,
        "producer_max_behind": max(o["max_behind"] for o in outcomes),
        "delivered": n,
        "delivered_per_second": round((n - backlog) / offered_seconds, 1) if offered_seconds else None,
        "drained_seconds_after_producer": drained_after,
        "handovers": max(0, len(begun) - 1),
        "lag_ms": spread(e50, e99, emax, emean),
        "recorded_lag_ms": spread(r50, r99, rmax, rmean),
        "handover_max_lag_ms": [round(float(h), 1) for h in (handover or []) if h is not None],
        "lag_per_second_ms": {"second": [r[0] for r in per_second],
                              **{k: [round(float(r[i]), 1) for r in per_second]
                                 for i, k in ((1, "p50"), (2, "p99"), (3, "max"))}},
        "without_poller": without,
        "poller_seconds_per_second": round(covered_seconds(occupied, lo, hi) / wall, 3) if wall else None,
        "invocations": counts,
        "duplicates": duplicates,
        "lost": lost,
        "sustained": sustained,
        "first_error": errors[0] if errors else None,
        "timeline": timeline,
        "check": {"rows_delivered": n, "stream_entries": len(stream_ids), "distinct_ids": len(distinct),
                  "duplicates": duplicates, "lost": lost, "invocation_errors": len(errors),
                  "ok": n == sent + backlog == len(distinct) and duplicates == 0 and lost == 0 and not errors
                  and lam.refused == 0},
    }


def _rel(t: float | None, origin: float) -> float | None:
    return None if t is None else round(t - origin, 3)


def _most_at_once(spans: list[tuple[float, float]], lo: float, hi: float) -> int:
    """The most invocations running at one time within [lo, hi]."""
    edges = sorted([(max(a, lo), 1) for a, b in spans if b > lo and a < hi]
                   + [(min(b, hi), -1) for a, b in spans if b > lo and a < hi], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


def _idle(env: BenchEnv, batch_size: int, seconds: float, margin: float, history: int,
          stream: str) -> dict[str, Any]:
    """One latency-mode invocation with nothing to deliver: statements and round trips per poll."""
    from outbox_relay import sql
    from outbox_relay.publishers.registry import Channel
    from outbox_relay.store import LeaseStore

    from .growth import _seed
    from .handler import relay

    _reset(env)
    _seed(env, delivered=history, pending=0, stream=env.prefix + stream.removeprefix("bench."))
    extra = {"OUTBOX_MODE": "latency", "OUTBOX_FUNCTION_TIMEOUT_SECONDS": str(seconds + margin),
             "OUTBOX_LEASE_SECONDS": str(seconds + margin + 60), "OUTBOX_DEADLINE_MARGIN_SECONDS": str(margin),
             "OUTBOX_SELF_INVOKE": "false", "AWS_LAMBDA_FUNCTION_NAME": None}
    with relay(env, batch_size, timeout_seconds=seconds + margin, extra_env=extra) as r:
        r.statements.take_apart()
        started = time.perf_counter()
        summary = r.invoke()
        wall = time.perf_counter() - started
        statements = r.statements.take()
        registry_statements = r.statements.take_apart()
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
        "history_rows": history, "seconds": round(wall, 2), "polls": polls, "batch_invocation_ms": batch_ms,
        "polls_per_second": round(polls / wall, 2) if wall else None,
        "statements": statements, "statements_per_poll": round(statements / polls, 3) if polls else None,
        "registry_statements": registry_statements,
        "registry_statements_per_second": round(registry_statements / wall, 2) if wall else None,
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
