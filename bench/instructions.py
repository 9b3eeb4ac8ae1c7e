"""Instructions the relay process executes per message, counted by valgrind's
callgrind, per batch size.

Seconds move with the host's load (on the bench machine a pure-Python loop
ran 0.84 to 1.63 s within one minute); instruction counts do not, so two
versions of the code are compared with this section: run it on each checkout.

The parent prepares a backlog. A probe process (`python -m bench
instructions-probe`) runs under `valgrind --tool=callgrind
--instr-atstart=no`: it loads the real handler, runs one warm-up invocation
(cold start, connections, the Lua script) uncounted, then tells the parent,
which switches instrumentation on (`callgrind_control -i on`), lets the probe
drain the rest, and switches it off. Only the relay process is counted, not
PostgreSQL or Redis.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .env import BenchEnv


def probe(database_url: str, redis_url: str, batch_size: int, signals: Path) -> None:
    """Run in the probe process: warm up, wait for `go`, drain, write `done`, wait for `stop`."""
    from outbox_relay import observability as obs
    from outbox_relay import runtime
    from outbox_tools.lambda_local import LocalContext, environment, load_handler

    from .handler import probe_environment, schedule_event

    values = probe_environment(database_url, redis_url, batch_size)
    sink = io.StringIO()
    event = schedule_event("redis")
    with environment(**values):
        runtime.reset()
        handler = load_handler("relay")
        obs.logger.registered_handler.setStream(sink)
        with contextlib.redirect_stdout(sink):
            handler(event, LocalContext(timeout_seconds=60))  # warm-up, not counted
            (signals / "ready").touch()
            _wait_for(signals / "go")
            delivered = invocations = 0
            while True:
                result = handler(event, LocalContext(timeout_seconds=60))
                invocations += 1
                delivered += result["delivered"]
                if result["claimed"] == 0:
                    break
            (signals / "done").write_text(f"{delivered} {invocations}")
            _wait_for(signals / "stop")


def _wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 600.0) -> None:
    """Wait until `path` exists; raise if `proc` (the probe, when given) exits first
    or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"callgrind probe exited early ({proc.returncode}): "
                               f"{(proc.stderr.read() if proc.stderr else '')[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {path.name}")
        time.sleep(0.05)


def available() -> str | None:
    """None when valgrind and callgrind_control are on PATH, else why not."""
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    return f"not found on PATH: {', '.join(missing)}" if missing else None


def run_instructions(env: BenchEnv, *, batch_sizes: list[int], messages: int,
                     streams: tuple[str, ...]) -> dict[str, Any]:
    """For each batch size: relay-process instructions per message over about
    `messages` messages (at least 5 invocations' worth)."""
    from .drain import prepare_backlog

    reason = available()
    if reason:
        return {"skipped": reason, "runs": []}
    runs = []
    for b in batch_sizes:
        n = max(messages, 5 * b)
        prepare_backlog(env, n + b, streams)  # one batch for the uncounted warm-up
        runs.append(_count(env, b, n))
    return {"tool": "valgrind --tool=callgrind (instructions executed, Ir)", "runs": runs}


def _count(env: BenchEnv, batch_size: int, messages: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        signals = Path(tmp)
        log = signals / "valgrind.log"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--log-file={log}",
               f"--callgrind-out-file={signals / 'callgrind.out'}",
               sys.executable, "-m", "bench", "instructions-probe", "--database-url", env.database_url,
               "--redis-url", env.servers.redis_url, "--batch-size", str(batch_size), "--signals", str(signals)]
        proc = subprocess.Popen(cmd, cwd=str(Path(__file__).resolve().parent.parent),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(signals / "ready", proc, timeout=900.0)
            _control("on", proc.pid)
            (signals / "go").touch()
            _wait_for(signals / "done", proc, timeout=900.0)
            _control("off", proc.pid)
            delivered, invocations = map(int, (signals / "done").read_text().split())
            (signals / "stop").touch()
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = log.read_text(errors="replace") if log.exists() else ""
        found = re.findall(r"Collected\s*:\s*([\d,]+)", text)
        if proc.returncode != 0 or not found:
            raise RuntimeError(f"callgrind probe at batch {batch_size} failed: "
                               f"{(proc.stderr.read() if proc.stderr else '')[-1500:]}{text[-1500:]}")
        instructions = int(found[-1].replace(",", ""))
    return {"batch_size": batch_size, "messages": delivered, "invocations": invocations,
            "instructions": instructions,
            "instructions_per_message": round(instructions / delivered) if delivered else None}


def _control(state: str, pid: int) -> None:
    out = subprocess.run(["callgrind_control", "-i", state, str(pid)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or "Error" in out.stdout:
        raise RuntimeError(f"callgrind_control -i {state} {pid}: {out.stdout.strip()} {out.stderr.strip()}")
