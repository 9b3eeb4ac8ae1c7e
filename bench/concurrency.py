"""Concurrency: 1, 2, 4 and 8 processes, each a relay container running
invocations back to back, drain one backlog together.

Processes start on a common signal after their cold start (and a warm-up
invocation on the empty table), once the backlog is in place; the wall time runs
from that signal until the last process has seen an invocation claim nothing.
Proof that no message was delivered twice: every row is delivered, the bench
streams hold exactly one entry per message (distinct `id` fields = entries =
messages), and the per-process delivered counts add up to the backlog.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import Counter
from typing import Any

from .env import BenchEnv


def _worker(env_args: dict[str, Any], batch_size: int, ready: Any, go: Any, out: Any,
            extra_env: dict[str, str] | None = None, timeout_seconds: float = 60.0, once: bool = False) -> None:
    """One process: a warm relay container, then invocations until one claims
    nothing (or, with `once`, a single invocation)."""
    from outbox_tools.servers import Servers

    from .handler import relay

    env = BenchEnv(Servers(env_args["database_url_admin"], env_args["redis_url"], "env", "env"),
                   env_args["database_name"], env_args["prefix"], keep=True,
                   admin_url=env_args["database_url_admin"], database_url=env_args["database_url"])
    delivered = invocations = lease_lost = 0
    try:
        with relay(env, batch_size, extra_env=extra_env, timeout_seconds=timeout_seconds) as r:
            ready.release()
            go.wait()
            started = time.perf_counter()
            while True:
                result = r.invoke()
                invocations += 1
                delivered += result["delivered"]
                lease_lost += result["lease_lost"]
                if result["claimed"] == 0 or once:
                    break
            out.put({"delivered": delivered, "invocations": invocations, "lease_lost": lease_lost,
                     "seconds": time.perf_counter() - started, "error": None})
    except BaseException as exc:  # report, never hang the parent
        ready.release()
        out.put({"delivered": delivered, "invocations": invocations, "lease_lost": lease_lost,
                 "seconds": 0.0, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        env.close()


def run_concurrency(env: BenchEnv, *, n: int, batch_size: int, processes: list[int],
                    streams: tuple[str, ...], extra_env: dict[str, str] | None = None,
                    timeout_seconds: float = 60.0, once: bool = False, keys: int | None = None) -> dict[str, Any]:
    """Drain `n` messages (keyless, or over `keys` ordering keys) with each
    process count in `processes` (each process a container; `once`: one
    invocation each, as in drain mode)."""
    from .drain import prepare_backlog

    ctx = mp.get_context("spawn")
    env_args = {"database_url_admin": env.admin_url, "database_url": env.database_url,
                "redis_url": env.servers.redis_url, "database_name": env.database_name, "prefix": env.prefix}
    runs = []
    for k in processes:
        env.reset_table()  # the warm-up invocations find nothing to claim
        ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(env_args, batch_size, ready, go, out, extra_env,
                                                   timeout_seconds, once), daemon=True)
                 for _ in range(k)]
        for p in procs:
            p.start()
        for _ in procs:
            if not ready.acquire(timeout=120):
                raise RuntimeError("a relay process did not start within 120 s")
        prepare_backlog(env, n, streams, keys)
        started = time.perf_counter()
        go.set()
        reports = [out.get(timeout=1800) for _ in procs]
        wall = time.perf_counter() - started
        for p in procs:
            p.join(timeout=30)
        errors = [r["error"] for r in reports if r["error"]]
        if errors:
            raise RuntimeError(f"relay process failed: {errors[0]}")
        ids = env.stream_message_ids()
        counts = env.counts()
        duplicates = sum(c - 1 for c in Counter(ids).values() if c > 1)
        delivered = sum(r["delivered"] for r in reports)
        runs.append({
            "processes": k,
            "wall_seconds": round(wall, 3),
            "messages_per_second": round(delivered / wall, 1) if wall else None,
            "delivered": delivered,
            "invocations": sum(r["invocations"] for r in reports),
            "lease_lost": sum(r["lease_lost"] for r in reports),
            "per_process_delivered": sorted((r["delivered"] for r in reports), reverse=True),
            "check": {
                "rows_delivered": counts.get("delivered", 0),
                "stream_entries": len(ids),
                "distinct_ids": len(set(ids)),
                "duplicates": duplicates,
                "ok": duplicates == 0 and len(ids) == len(set(ids)) == n == delivered
                      and counts.get("delivered", 0) == n,
            },
        })
    return {"messages": n, "batch_size": batch_size, "runs": runs}
