"""`python -m bench growth` at tiny counts: its own PostgreSQL with autovacuum on, the
delivered history seeded in bulk (rows, bodies, some history, UUIDv7 ids of each row's
time), and today's purge removing the oldest day of it with its bodies and history."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from sqlalchemy import text

from bench import growth
from bench.env import BenchEnv
from outbox_tools.lambda_local import project_root

pytestmark = pytest.mark.bench


def _counts(env: BenchEnv) -> dict[str, int]:
    with env.engine.connect() as conn:
        return {"delivered": conn.execute(text("SELECT count(*) FROM outbox_message WHERE status = 'delivered'")
                                          ).scalar_one(),
                "pending": conn.execute(text("SELECT count(*) FROM outbox_message WHERE status = 'pending'")
                                        ).scalar_one(),
                "bodies": conn.execute(text("SELECT count(*) FROM outbox_message_body")).scalar_one(),
                "history": conn.execute(text("SELECT count(*) FROM outbox_message_history")).scalar_one(),
                "older_than_6_days": conn.execute(text(
                    "SELECT count(*) FROM outbox_message WHERE delivered_at < now() - interval '6 days'")).scalar_one()}


def test_seeded_history_and_a_days_purge_on_the_bench_server(servers, redis_prefix):
    outer = BenchEnv(servers, f"outbox_bench_growth_{os.getpid()}", redis_prefix)
    with growth.growth_env(outer) as env:
        with env.engine.connect() as conn:
            assert conn.execute(text("SHOW autovacuum")).scalar_one() == "on"
        growth._seed(env, delivered=1400, pending=30, stream=redis_prefix + "growth")
        seeded = _counts(env)
        assert seeded == {"delivered": 1400, "pending": 30, "bodies": 1430, "history": 70, "older_than_6_days": 200}
        with env.engine.connect() as conn:
            rows = conn.execute(text("SELECT message_id, created_at FROM outbox_message ORDER BY seq")).all()
        for message_id, created_at in rows:  # UUIDv7 of the row's own millisecond
            assert message_id.version == 7 and message_id.variant == uuid.RFC_4122
            assert message_id.int >> 80 == round(created_at.timestamp() * 1000)

        result = growth.measure_retention(env)

        after = _counts(env)
        assert result["ok"] and result["due"] == result["purged"] == 200 and result["wal_bytes"] > 0
        enqueued = result["producer"]["enqueues"]  # the producer's messages, pending beside the seeded ones
        assert after["older_than_6_days"] == 0 and after["pending"] == 30 + enqueued > 30
        assert after["delivered"] == 1200 and after["bodies"] == 1230 + enqueued
        assert after["history"] == 60  # the purged messages' history went with them
        assert result["dead_rows"]["outbox_message_body"] >= 200 or result["autovacuum_ran"]["outbox_message_body"]


def test_the_growth_command_writes_both_cases_and_refuses_a_bad_count(servers, redis_prefix, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "AWS_"))}
    env.update(DATABASE_URL=servers.database_url, REDIS_URL=servers.redis_url)
    out = tmp_path / "growth.json"
    command = [sys.executable, "-m", "bench", "growth", "--quick", "--database-name",
               f"outbox_bench_growth_cli_{os.getpid()}", "--prefix", redis_prefix, "--out", str(out)]
    refused = subprocess.run([*command, "--delivered", "700,0"], cwd=project_root(), env=env, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and "'--delivered'" in refused.stderr and "Traceback" not in refused.stderr
    assert not out.exists()

    proc = subprocess.run([*command, "--delivered", "2100,700"], cwd=project_root(), env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())["growth"]
    assert result["server"]["autovacuum"] == "on" and result["check"]["ok"] and result["plans_ok"]
    assert [c["delivered"] for c in result["cases"]] == [700, 2100]
    for case in result["cases"]:
        assert case["rows"] == case["delivered"] + 200 and case["history_rows"] == case["delivered"] // 20
        assert case["retention"]["purged"] == case["delivered"] // 7
        assert case["drain"]["delivered"] == 200 and case["size"]["total_bytes"] > 0
    assert result["cases"][1]["size"]["total_bytes"] > result["cases"][0]["size"]["total_bytes"]
