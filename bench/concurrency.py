"""Concurrency: 1, 2, 4 and 8 processes, each a relay container running
invocations back to back, drain one backlog together.

Processes start on a common signal after their cold start (and a warm-up
invocation on the empty table), once the backlog is in place; the wall time runs
from that signal until the last process has seen an invocation claim nothing.
Each process is held to Lambda's CPU at the function's memory from its fork
(`lambda_model.start`), its cold start included.
Proof that no message was delivered twice: every row is delivered, the bench
streams hold exactly one entry per message (distinct `id` fields = entries =
messages), and the per-process delivered counts add up to the backlog.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import Counter
from typing import Any

from . import lambda_model
from .env import BenchEnv
from .lambda_model import process_age_seconds


def worker_env(env_args: dict[str, Any]) -> BenchEnv:
    """The parent's `BenchEnv` (`env_args`, from `env_arguments`) in a worker process; nothing is created or dropped."""
    from outbox_tools.servers import Servers

    return BenchEnv(Servers(env_args["database_url_admin"], env_args["redis_url"], "env", "env"),
                    env_args["database_name"], env_args["prefix"], keep=True,
                    admin_url=env_args["database_url_admin"], database_url=env_args["database_url"])


def env_arguments(env: BenchEnv) -> dict[str, Any]:
    return {"database_url_admin": env.admin_url, "database_url": env.database_url,
            "redis_url": env.servers.redis_url, "database_name": env.database_name, "prefix": env.prefix}


def _worker(ready: Any, go: Any, out: Any, env_args: dict[str, Any], batch_size: int,
            extra_env: dict[str, str] | None = None, timeout_seconds: float = 60.0) -> None:
    """One process: a warm relay container, then invocations until one claims nothing."""
    from .handler import relay

    env = worker_env(env_args)
    delivered = invocations = lease_lost = 0
    try:
        with relay(env, batch_size, extra_env=extra_env, timeout_seconds=timeout_seconds) as r:
            cold_start = process_age_seconds()
            ready.release()
            go.wait()
            started = time.perf_counter()
            while True:
                result = r.invoke()
                invocations += 1
                delivered += result["delivered"]
                lease_lost += result["lease_lost"]
                if result["claimed"] == 0:
                    break
            out.put({"delivered": delivered, "invocations": invocations, "lease_lost": lease_lost,
                     "seconds": time.perf_counter() - started, "cold_start_seconds": cold_start, "error": None})
    except BaseException as exc:  # report, never hang the parent
        ready.release()
        out.put({"delivered": delivered, "invocations": invocations, "lease_lost": lease_lost,
                 "seconds": 0.0, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        env.close()


def run_together(env: BenchEnv, k: int, target: Any, args: tuple, *, n: int, streams: tuple[str, ...],
                 keys: int | None = None, edit: Any = None, what: str) -> tuple[list[dict[str, Any]], float]:
    """Start `k` spawned processes of `target(ready, go, out, *args)` on an empty table, each
    under the bench's CPU (`lambda_model.start`); once each has released `ready` (warm),
    enqueue the backlog (`edit` as `BenchEnv.enqueue` takes it) and set `go` for all at once.
    Returns their reports (each with `delivered` and `error`) and the wall seconds from
    `go` until the last report; raises the first process error."""
    from .drain import prepare_backlog

    ctx = mp.get_context("spawn")
    env.reset_table()  # warm-up work finds nothing to claim
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(ready, go, out, *args), daemon=True) for _ in range(k)]
    try:
        for p in procs:
            lambda_model.start(p)
        for _ in procs:
            # A cold start held to a small share of a loaded machine's core takes its time.
            if not ready.acquire(timeout=600):
                raise RuntimeError(f"a {what} process did not start within 600 s")
        prepare_backlog(env, n, streams, keys, edit)
        started = time.perf_counter()
        go.set()
        reports = [out.get(timeout=1800) for _ in procs]
        wall = time.perf_counter() - started
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=30)
            lambda_model.release(p)
    errors = [r["error"] for r in reports if r["error"]]
    if errors:
        raise RuntimeError(f"{what} process failed: {errors[0]}")
    return reports, wall


def cold_start(reports: list[dict[str, Any]]) -> float:
    """The slowest process's seconds from its fork to a warm container (imports, dependencies,
    connections, the warm-up invocation), under the CPU it ran with."""
    return round(max(r["cold_start_seconds"] for r in reports), 3)


def delivery_check(env: BenchEnv, n: int, delivered: int) -> dict[str, Any]:
    """Every one of the `n` rows delivered, each once in the bench streams, and the
    processes' own counts adding up to `n`."""
    ids = env.stream_message_ids()
    rows_delivered = env.counts().get("delivered", 0)
    duplicates = sum(c - 1 for c in Counter(ids).values() if c > 1)
    return {"rows_delivered": rows_delivered, "stream_entries": len(ids), "distinct_ids": len(set(ids)),
            "duplicates": duplicates,
            "ok": duplicates == 0 and len(ids) == n == delivered == rows_delivered}


def run_concurrency(env: BenchEnv, *, n: int, batch_size: int, processes: list[int],
                    streams: tuple[str, ...], extra_env: dict[str, str] | None = None,
                    timeout_seconds: float = 60.0, keys: int | None = None) -> dict[str, Any]:
    """Drain `n` messages (keyless, or over `keys` ordering keys) with each
    process count in `processes` (each process a container)."""
    env_args = env_arguments(env)
    runs = []
    for k in processes:
        reports, wall = run_together(env, k, _worker, (env_args, batch_size, extra_env, timeout_seconds),
                                     n=n, streams=streams, keys=keys, what="relay")
        delivered = sum(r["delivered"] for r in reports)
        runs.append({
            "processes": k,
            "wall_seconds": round(wall, 3),
            "messages_per_second": round(delivered / wall, 1) if wall else None,
            "delivered": delivered,
            "invocations": sum(r["invocations"] for r in reports),
            "lease_lost": sum(r["lease_lost"] for r in reports),
            "per_process_delivered": sorted((r["delivered"] for r in reports), reverse=True),
            "cold_start_seconds": cold_start(reports),
            "check": delivery_check(env, n, delivered),
        })
    return {"messages": n, "batch_size": batch_size, "runs": runs}
