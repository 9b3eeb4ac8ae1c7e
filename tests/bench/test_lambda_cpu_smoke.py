"""The bench holds every process that runs invocations, and the minimal loop's,
to Lambda's CPU at the function's memory (bench/lambda_model.py, `LambdaCpu`):
a quick drain at 256 MB records the share, the kernel really throttled the
processes, each invocation's CPU stayed within its share of the wall time, the
cgroups are gone afterwards and the rendered figures say how they were held."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import report
from bench.lambda_model import CGROUP_CPU, cpu_share, template_function_memory_mb
from outbox_tools.lambda_local import project_root

pytestmark = pytest.mark.bench


def _bench(servers, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "AWS_"))}
    env.update(DATABASE_URL=servers.database_url, REDIS_URL=servers.redis_url)
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=project_root(), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _writable_cgroup() -> bool:
    return os.access(CGROUP_CPU / "cgroup.procs", os.W_OK)


@pytest.mark.skipif(not _writable_cgroup(), reason="needs root and a writable cgroup v1 cpu controller")
def test_a_capped_drain_holds_each_process_to_lambdas_share(servers, redis_prefix, tmp_path):
    out = tmp_path / "latest.json"
    proc = _bench(servers, "drain", "--quick", "--n", "300", "--batch-sizes", "100", "--function-memory-mb", "256",
                  "--database-name", f"outbox_bench_cpu_{os.getpid()}", "--prefix", redis_prefix, "--out", str(out))
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    results = json.loads(out.read_text())
    share = cpu_share(256)

    for name, processes in (("limit", 3), ("drain", 9)):  # minimal loop 1 + 2; drain 1 + 2 + layouts 2 x 3
        cpu = results[name]["cpu"]
        assert cpu["function_memory_mb"] == 256 and cpu["share"] == round(share, 3) == 0.145 and cpu["capped"]
        assert cpu["cgroups"] == processes and cpu["periods"] > 0
    assert results["drain"]["cpu"]["throttled_periods"] > 0, results["drain"]["cpu"]  # the kernel held them
    assert results["machine"]["memory_mb"] > 256 * 4  # the host's memory, not the function's
    for run in results["drain"]["runs"]:
        assert run["check"]["ok"] and run["cold_start_seconds"] > 0
        # the invocation's own CPU within its share of the wall time (one period's quota of slack)
        cpu_seconds = run["cpu_us_per_message"]["client"] * run["delivered"] / 1e6
        assert cpu_seconds <= share * (run["wall_seconds"] + 0.1) + 0.005, (cpu_seconds, run["wall_seconds"])
    assert not [g for g in CGROUP_CPU.iterdir() if g.name.startswith(f"outbox-bench-{proc.pid}-")]
    page = report.markdown(results)
    assert page.count("held to Lambda's CPU at 256 MB (0.14 of a core)") >= 2  # the minimal loop and drain


def test_uncapped_figures_are_labelled_so(servers, redis_prefix, tmp_path):
    out = tmp_path / "latest.json"
    proc = _bench(servers, "limit", "--quick", "--n", "200", "--uncapped", "--database-name",
                  f"outbox_bench_uncapped_{os.getpid()}", "--prefix", redis_prefix, "--out", str(out))
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    limit = json.loads(out.read_text())["limit"]
    assert limit["cpu"]["capped"] is False and limit["cpu"]["label"].startswith("uncapped")
    assert all(r["check"]["ok"] for r in limit["runs"])
    memory = template_function_memory_mb()
    assert limit["cpu"]["function_memory_mb"] == memory
    assert f"; uncapped (not held to Lambda's CPU at {memory:,} MB" in report.markdown(json.loads(out.read_text()))
