"""Memory: the peak resident set of a relay process running one invocation, per
batch size, each in a fresh process (as a cold Lambda container: imports,
connections and the invocation all count, as they do against the function's
memory size).

The parent enqueues enough messages for every probe; each probe process loads
the real handler, runs one invocation and reports VmRSS before it and VmHWM
(the peak) after it, from /proc/self/status.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .env import BenchEnv


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    if field == "VmHWM":
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return None


def probe(database_url: str, redis_url: str, batch_size: int) -> dict[str, Any]:
    """Run in the probe process: one cold invocation of the real handler."""
    from outbox_relay import observability as obs
    from outbox_relay import runtime
    from outbox_tools.lambda_local import LocalContext, environment, load_handler

    from .handler import probe_environment, schedule_event

    values = probe_environment(database_url, redis_url, batch_size)
    sink = io.StringIO()
    with environment(**values):
        runtime.reset()
        handler = load_handler("relay")
        before = _status_kb("VmRSS")
        obs.logger.registered_handler.setStream(sink)
        with contextlib.redirect_stdout(sink):
            result = handler(schedule_event("redis"), LocalContext(timeout_seconds=60))
    peak = _status_kb("VmHWM")
    return {"batch_size": batch_size, "delivered": result["delivered"],
            "rss_before_mb": round(before / 1024, 1) if before else None,
            "peak_rss_mb": round(peak / 1024, 1) if peak else None,
            "growth_mb": round((peak - before) / 1024, 1) if peak and before else None}


def run_memory(env: BenchEnv, *, batch_sizes: list[int], streams: tuple[str, ...]) -> dict[str, Any]:
    from .drain import prepare_backlog

    prepare_backlog(env, sum(batch_sizes), streams)
    runs = []
    for b in batch_sizes:
        proc = subprocess.run(
            [sys.executable, "-m", "bench", "memory-probe", "--database-url", env.database_url,
             "--redis-url", env.servers.redis_url, "--batch-size", str(b)],
            capture_output=True, text=True, timeout=600, cwd=str(Path(__file__).resolve().parent.parent),
        )
        if proc.returncode != 0:
            raise RuntimeError(f"memory probe at batch {b} failed: {proc.stderr.strip()[-2000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"runs": runs}
