"""`python -m bench enqueue-sql` runs end to end at a tiny size: four ways
measured in one run, every message written once, the ratios printed and
merged into the results file as a section the docs render."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from outbox_tools.lambda_local import project_root

pytestmark = pytest.mark.bench


def test_enqueue_sql_measures_both_ways_in_one_run(servers, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "AWS_"))}
    env.update(DATABASE_URL=servers.database_url, REDIS_URL=servers.redis_url)
    out = tmp_path / "enqueue-sql.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "enqueue-sql", "--n", "40", "--rounds", "2",
                           "--database-name", f"outbox_bench_enqueue_{os.getpid()}", "--out", str(out)],
                          cwd=project_root(), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())["enqueue_sql"]
    assert result["check"] == {"ok": True, "written": 160, "expected": 160}
    assert set(result["messages_per_second"]) == {"event_python", "event_sql", "email_python", "email_sql"}
    assert [line.split(":")[0] for line in proc.stdout.splitlines()][:2] == ["event", "email"]
    assert all(ratio > 0 for ratio in result["sql_vs_python"].values())
    # the figures render as a line of docs/benchmark.md
    from bench import report

    assert "Enqueue from SQL (`python -m bench enqueue-sql`" in report.markdown(json.loads(out.read_text()))
