"""`python -m bench growth` at tiny counts: its own PostgreSQL with autovacuum on, the
delivered history seeded in bulk into each id's day (rows, bodies, some history, UUIDv7 ids
of each row's time), a day's retention by drop and by DELETE on as many rows, and a short
soak with days dropped while producers and a relay run."""

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
                "history": conn.execute(text("SELECT count(*) FROM outbox_message_history")).scalar_one()}


def test_seeded_days_a_days_drop_against_delete_and_a_soak_on_the_bench_server(servers, redis_prefix):
    outer = BenchEnv(servers, f"outbox_bench_growth_{os.getpid()}", redis_prefix)
    with growth.growth_env(outer) as env:
        with env.engine.connect() as conn:
            assert conn.execute(text("SHOW autovacuum")).scalar_one() == "on"
        growth._seed(env, delivered=1400, pending=30, stream=redis_prefix + "growth")
        # Seeded again: each case starts from empty tables, not from the last one's dead history
        env.reset_table()
        with env.engine.connect() as conn:
            assert conn.execute(text("SELECT sum(pg_relation_size(inhrelid)) FROM pg_inherits "
                                     "WHERE inhparent = 'outbox_message_history'::regclass")).scalar_one() == 0
        # (in chunks that the cores seed at once, as 10^8 rows are)
        growth._seed(env, delivered=1400, pending=30, stream=redis_prefix + "growth", chunk=300)
        assert _counts(env) == {"delivered": 1400, "pending": 30, "bodies": 1430, "history": 70}
        with env.engine.connect() as conn:
            rows = conn.execute(text("SELECT message_id, created_at, day, tableoid::regclass::text FROM outbox_message "
                                     "WHERE status = 'delivered'")).all()
            astray = conn.execute(text(
                "SELECT (SELECT count(*) FROM outbox_message o JOIN outbox_message_body b USING (seq) "
                "WHERE b.day <> o.day) + (SELECT count(*) FROM outbox_message_history h "
                "JOIN outbox_message o USING (seq) WHERE h.day <> o.day)")).scalar_one()
        assert astray == 0  # bodies and history in their message's day
        for message_id, created_at, day, partition in rows:  # UUIDv7 of the row's millisecond, in that day
            assert message_id.version == 7 and message_id.variant == uuid.RFC_4122
            assert message_id.int >> 80 == round(created_at.timestamp() * 1000)
            assert day == (message_id.int >> 80) // 86_400_000 and partition == f"outbox_message_done_d{day}"
        assert growth.claim_plan(env, 10)["history_scans"] == 0

        result = growth.measure_retention(env, stream=redis_prefix + "growth")

        drop, delete = result["drop"], result["delete"]
        assert result["ok"] and drop["dropped"] and drop["kept"] == 0
        assert drop["rows"]["outbox_message"] == delete["purged"] == delete["rows"]["outbox_message"] > 0
        assert drop["dead_rows"] == {t: 0 for t in growth.TABLES}
        assert drop["wal_bytes"] > 0 and delete["wal_bytes"] > 0 and drop["producer"]["enqueues"] > 0
        with env.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM outbox_day WHERE day = :d"), {"d": drop["day"]}
                                ).scalar_one() == 0
            assert conn.execute(text("SELECT to_regclass(:t)"), {"t": f"outbox_message_body_d{drop['day']}"}
                                ).scalar_one() is None
            assert conn.execute(text("SELECT count(*) FROM outbox_message WHERE day = 0 AND status = 'delivered'")
                                ).scalar_one() == 0

        soak = growth.run_soak(env, minutes=0.75, rate=40)

        assert soak["ok"] and soak["errors"] == [] and soak["rows_lost"] == 0 and soak["sent"] > 0
        assert soak["delivered"] == soak["sent"]
        assert [m["dropped"] for m in soak["maintenance"]] == [1] * growth.SOAK_DROPS
        assert soak["days_open_ahead"] == growth.MARGIN_DAYS + growth.SOAK_DROPS  # one more day ahead per run
        assert len(soak["windows"]) >= 4 and any(w["claim_p99_ms"] for w in soak["windows"])
        assert soak["bytes_at_first_drop"] > 0 and soak["partitions_min_max"][0] > 3


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
    assert result["server"]["autovacuum"] == "on" and result["check"]["ok"] and result["plans_prune_history"]
    assert [c["delivered"] for c in result["cases"]] == [700, 2100]
    for case in result["cases"]:
        assert case["rows"] == case["delivered"] + 200 and case["history_rows"] == case["delivered"] // 20
        retention = case["retention"]
        assert retention["delete"]["purged"] == retention["drop"]["rows"]["outbox_message"] > 0
        assert sum(retention["drop"]["dead_rows"].values()) == 0
        assert case["planning"]["repetitions"] == 10 and case["planning"]["p99_ms"] > 0
        assert case["drain"]["delivered"] == 200 and case["size"]["total_bytes"] > 0
    assert result["cases"][1]["size"]["total_bytes"] > result["cases"][0]["size"]["total_bytes"]

    # A soak run alone keeps the cases, each half labelled with its own run
    refused = subprocess.run([*command, "--soak-only"], cwd=project_root(), env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "'--soak-only'" in refused.stderr and "Traceback" not in refused.stderr
    soaked = subprocess.run([*command, "--soak-only", "--soak-minutes", "0.75", "--rate", "40"], cwd=project_root(),
                            env=env, capture_output=True, text=True, timeout=600)
    assert soaked.returncode == 0, soaked.stdout[-3000:] + soaked.stderr[-3000:]
    after = json.loads(out.read_text())["growth"]
    assert after["cases"] == result["cases"] and after["check"]["ok"]
    assert after["cases_run"]["started_at"] == result["started_at"] < after["soak"]["started_at"]
    assert after["soak"]["ok"] and after["soak"]["delivered"] == after["soak"]["sent"] > 0
    # ... and a run of the cases alone keeps that soak
    again = subprocess.run([*command, "--delivered", "700,1400"], cwd=project_root(), env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    last = json.loads(out.read_text())["growth"]
    assert [c["delivered"] for c in last["cases"]] == [700, 1400] and "cases_run" not in last
    assert last["soak"] == after["soak"]
