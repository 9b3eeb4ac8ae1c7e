"""The benchmark runs end to end at tiny sizes, so the script cannot rot.

Not a timed assertion: it checks that every section ran, that its correctness
checks held (everything delivered once, plans on the partial indexes, SES
within MaxSendRate, SQS, SNS and EventBridge calls within 10 entries and
256 KiB and in each key's order), that statements and Redis round trips per batch do not
grow with the batch size, and that the bench cleans up after itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cli import SECTIONS
from outbox_tools.lambda_local import project_root
from support.leftovers import assert_nothing_left

pytestmark = pytest.mark.bench


def test_bench_all_quick_runs_every_section_and_cleans_up(servers, redis_prefix, tmp_path):
    database = f"outbox_bench_smoke_{os.getpid()}"
    out = tmp_path / "latest.json"
    proc = _bench(servers, "all", "--quick", "--n", "300", "--batch-sizes", "10,100", "--baseline-n", "40",
                  "--processes", "1,2", "--database-name", database, "--prefix", redis_prefix, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())

    assert set(SECTIONS) <= set(results)
    assert results["machine"]["nproc"] >= 1 and results["machine"]["postgresql"] and results["machine"]["redis"]
    drain = results["drain"]["runs"]
    assert [d["batch_size"] for d in drain] == [10, 100]
    for d in drain:  # one drain-mode invocation each
        assert d["check"]["ok"] and d["delivered"] == 300 and d["messages_per_second"] > 0
        # per batch a claim and the outcomes (which also read the oldest pending age), whatever its
        # size; besides, the claim that finds the backlog empty
        assert round(d["statements_per_batch"] * d["batches"]) == 2 * d["batches"] + 1
    layouts = results["drain"]["layouts"]  # the two entry layouts on traced messages: the same calls a batch
    assert layouts["fields"]["ok"] and layouts["cloudevents"]["ok"] and layouts["cloudevents_vs_fields"] > 0
    assert layouts["fields"]["redis_round_trips_per_batch"] == layouts["cloudevents"]["redis_round_trips_per_batch"]
    batches = results["batches"]["runs"]  # batch mode: one batch per invocation
    assert all(b["check"]["ok"] and b["delivered"] == 300 for b in batches)
    assert {b["statements_per_batch"]["max"] for b in batches} == {b["statements_per_batch"]["min"] for b in batches} \
        == {2}  # claim; outcomes
    assert {b["redis_round_trips_per_batch"]["max"] for b in batches} == {2}  # gate (INFO memory), one pipeline
    ordering = results["ordering"]
    assert [r["keys"] for r in ordering["runs"]] == [None, 10_000, 100, 1]
    for r in ordering["runs"]:
        assert r["check"]["ok"] and r["delivered"] == 300 and r["check"]["order_violations"] == 0
    assert [r["check"]["keys_seen"] for r in ordering["runs"]][0::3] == [0, 1]
    assert 1 < ordering["runs"][2]["check"]["keys_seen"] <= 100
    two = ordering["two_invocations"]
    assert two["check"]["ok"] and two["delivered"] == 300 and two["check"]["order_violations"] == 0
    assert results["baseline"]["check"]["ok"] and results["baseline"]["delivered"] == 40
    phases = results["phases"]
    assert phases["check"]["ok"] and phases["batch_size"] == 100 and phases["check"]["delivered"] == 300
    steps = {st["step"]: st for st in phases["steps"]}
    assert list(steps) == ["gate", "claim, first row", "claim, the rows", "claim, messages", "publish", "record",
                           "handler, the rest"]
    # the first-row hook fired: the claim is split into the server's part and the rows' part
    assert steps["claim, first row"]["wall_us"] > 0 and steps["claim, the rows"]["wall_us"] > 0
    assert phases["claim_first_row_ms_median"] > 0 and phases["claim_rows_ms_median"] > 0
    # "the rest" is each invocation's time less the other steps, so the steps add up to
    # the invocations' time, part of the loop's (which also holds the last, empty one);
    # a step counted twice would make "the rest" negative. At 3 batches held to Lambda's
    # CPU, one throttled period in the empty last invocation weighs much: a loose floor
    loop_us = 1e6 / phases["messages_per_second"]
    assert 0.2 * loop_us < phases["sum_wall_us"] <= loop_us * 1.001
    assert all(st["wall_us"] >= 0 and st["relay_cpu_us"] >= 0 for st in steps.values())
    assert steps["handler, the rest"]["wall_us"] > 0
    if steps["record"]["postgresql_cpu_us"] is not None:  # PostgreSQL on this host
        assert steps["claim, first row"]["postgresql_cpu_us"] > 0 and steps["record"]["postgresql_cpu_us"] > 0
        assert steps["publish"]["postgresql_cpu_us"] < steps["record"]["postgresql_cpu_us"]
        assert steps["claim, the rows"]["postgresql_cpu_us"] is None  # given with the whole statement
    for run in results["concurrency"]["runs"]:
        assert run["check"]["ok"] and run["check"]["duplicates"] == 0 and run["delivered"] == 300
    recovery = results["recovery"]  # four invocations at once, batch 100: drain, then a crashed fleet's leases
    assert (recovery["messages"], recovery["batch_size"], recovery["invocations"]) == (300, 100, 4)
    assert [r["kind"] for r in recovery["runs"]] == ["drain", "recovery"]
    for r, attempts in zip(recovery["runs"], ("1", "2")):
        assert r["check"]["ok"] and r["check"]["attempts"] == {attempts: 300}
        assert r["check"]["stream_entries"] == r["check"]["distinct_ids"] == 300
    assert recovery["runs"][1]["dead_holders"] == 3 and recovery["recovery_vs_drain"] > 0
    poison = recovery["poison"]["check"]  # dead alone after exactly its attempts, all the others once in a stream
    assert poison["ok"] and poison["poison_attempts"] == poison["max_attempts"] == 10
    assert poison["poison_error_class"] == "lease_expired" and poison["invocations_killed"] == 9
    assert poison["other_dead"] == 0 and poison["stream_entries"] == poison["distinct_ids"] == 299
    assert results["growth"]["plans_prune_history"] and results["growth"]["check"]["ok"] and len(results["growth"]["cases"]) == 2
    assert all(r["peak_rss_mb"] > 0 for r in results["memory"]["runs"])
    ses = results["ses"]
    assert ses["check"]["ok"] and ses["busiest_second"] <= ses["max_send_rate"]
    # SQS, SNS, EventBridge and Kinesis through a moto server: the channel's minimal loop and the relay, batch 100
    gates = {"sqs": "GetQueueAttributes", "sns": "GetTopicAttributes", "eventbridge": "DescribeEventBus",
             "kinesis": "DescribeStreamSummary"}
    variants = {"eventbridge": ["standard"], "kinesis": ["standard", "keyed"]}
    for channel, gate in gates.items():
        section = results[channel]
        per_call = 500 if channel == "kinesis" else 10  # a call's entries; a batch of 100 is 1 or 10 calls
        assert section["batch_size"] == 100 and section["rounds"] == 1
        assert [r["variant"] for r in section["runs"]] == variants.get(channel, ["standard", "fifo"])
        for r in section["runs"]:
            relayed, minimal = r["relay"], r["minimal"]
            assert r["check"]["ok"] and relayed["delivered"] == minimal["delivered"] == 300 and r["vs_minimal"] > 0
            assert relayed["batches"] == minimal["batches"] == 3
            calls = relayed["calls_by_operation"]
            # the gate's probe once (at most every 10 s), then the batch calls: 10 entries each without keys;
            # with 1,000 keys a key's second message in a batch waits for a later call
            assert calls[gate] == 1 and set(calls) == {gate, section["operation"]}
            assert relayed["check"]["server_calls"] == calls[section["operation"]]
            assert relayed["max_entries_per_call"] <= per_call
            assert relayed["max_bytes_per_call"] <= (5 * 1024 * 1024 if channel == "kinesis" else 256 * 1024)
            full = 300 // min(per_call, 100)
            if r["variant"] == "standard":
                assert calls[section["operation"]] == full and relayed["entries_per_call"] == min(per_call, 100)
            else:
                assert calls[section["operation"]] > full and relayed["check"]["out_of_order"] == 0
            # per batch a claim and the outcome writes, one per round of calls (sooner only when a result
            # waited a second), far fewer than the calls; besides, the claim that finds nothing
            writes = relayed["outcome_writes"]
            total = round(writes["per_batch"] * 3)
            assert 3 <= total <= calls[section["operation"]] and 0 < writes["share_of_wall"] < 1
            assert per_call > 100 or total < calls[section["operation"]]
            assert round(relayed["statements_per_batch"] * 3) == total + 3 + 1
    targets = {t["target"]: t for t in results["targets"]}
    assert all(targets[f"{service} through moto: every message accepted once, in its key's order, no call over 10 "
                       "entries or 256 KiB"]["met"] for service in ("SQS", "SNS", "EventBridge"))
    assert targets["Kinesis through moto: every message accepted once, in its key's order, no call over 500 "
                   "entries or 5 MiB"]["met"]
    assert "SQS through moto" in proc.stdout and "EventBridge through moto" in proc.stdout
    assert targets["Round trips per batch constant over batch sizes"]["met"]
    assert targets["Ordering keys: one key for every message (reported, order checked)"]["met"]
    assert "Ordering keys: 10,000 keys vs none, one invocation, batch 100" in targets
    recovered = [t for t in targets.values() if t["target"].startswith("Recovery after a fleet-wide crash: 300 ")]
    assert len(recovered) == 1 and recovered[0]["met"] is not None
    assert targets["... with a message among them that kills its invocation: dead alone after exactly its "
                   "attempts"]["met"]
    assert "Drain mode, Redis channel" in proc.stdout and "Phases of one invocation" in proc.stdout
    assert "Targets" in proc.stdout and "Ordering keys" in proc.stdout and "Recovery after a fleet-wide crash" in proc.stdout

    # Cleaned up: the bench database is gone and no key under the prefix is left
    assert_nothing_left(servers.database_url, servers.redis_url, database, redis_prefix)


def test_bench_instructions_counts_the_relay_process_under_callgrind(servers, redis_prefix, tmp_path):
    import shutil

    database = f"outbox_bench_ins_{os.getpid()}"
    out = tmp_path / "latest.json"
    proc = _bench(servers, "instructions", "--batch-sizes", "10", "--n", "30", "--database-name", database,
                  "--prefix", redis_prefix, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    section = json.loads(out.read_text())["instructions"]
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        assert "not found" in section["skipped"] and section["runs"] == []
        return
    (run,) = section["runs"]
    # 50 messages (five batches of 10) counted, the warm-up invocation not
    assert run["batch_size"] == 10 and run["messages"] == 50 and run["invocations"] == 6
    assert run["instructions"] > 0 and run["instructions_per_message"] == round(run["instructions"] / 50)
    assert_nothing_left(servers.database_url, servers.redis_url, database, redis_prefix)


def _bench(servers, *args: str) -> subprocess.CompletedProcess:
    """`python -m bench ARGS` in a fresh process on the test servers, with no OUTBOX_ or AWS_ setting inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "AWS_"))}
    env.update(DATABASE_URL=servers.database_url, REDIS_URL=servers.redis_url)
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=project_root(), env=env,
                          capture_output=True, text=True, timeout=600)


def test_backend_cpu_is_read_only_from_the_backends_own_process(app_engine):
    """The bench reads a backend's CPU from /proc/<pid> only when that pid is the
    backend's process here (named postgres, started when the backend started),
    never an unrelated local process with the same number."""
    from sqlalchemy import text

    from bench.env import is_local_backend
    from bench.phases import BackendCpu

    with app_engine.connect() as conn:
        pid, started = conn.execute(text(
            "SELECT pid, EXTRACT(EPOCH FROM backend_start)::float8 FROM pg_stat_activity "
            "WHERE pid = pg_backend_pid()")).one()
        comm = Path(f"/proc/{pid}/comm")
        if comm.exists() and comm.read_text().strip() == "postgres":  # PostgreSQL on this host
            assert is_local_backend(pid, started)
            cpu = BackendCpu(pid)
            assert cpu.read() > 0
            cpu.close()
        assert not is_local_backend(pid, started - 3600)  # the same number, another start: not it
    assert not is_local_backend(os.getpid(), time.time())  # a local process, not PostgreSQL
    assert BackendCpu(None).read() is None


def test_phases_hooks_are_removed_afterwards(servers, redis_prefix, monkeypatch):
    """The step hooks wrap the store, the publisher and pg8000 for the section only."""
    import pg8000.core

    from bench.env import BenchEnv
    from bench.payloads import STREAMS
    from bench.phases import run_phases
    from outbox_relay import store as store_module
    from outbox_relay.publishers.redis.streams import RedisStreamsPublisher

    originals = (store_module.LeaseStore.claim, store_module.LeaseStore.record, store_module.run_with_retry,
                 pg8000.core.CoreConnection.execute_unnamed, RedisStreamsPublisher.gate,
                 RedisStreamsPublisher.deliver)
    monkeypatch.setenv("DATABASE_URL", servers.database_url)
    monkeypatch.setenv("REDIS_URL", servers.redis_url)
    database = f"outbox_bench_hooks_{os.getpid()}"
    with BenchEnv.open(database_name=database, prefix=redis_prefix) as env:
        result = run_phases(env, n=25, batch_size=10, streams=STREAMS[:1])
    assert result["check"]["ok"] and result["invocations"] == 3
    assert result["claim_first_row_ms_median"] is not None  # two full claims of 10, one of 5
    assert (store_module.LeaseStore.claim, store_module.LeaseStore.record, store_module.run_with_retry,
            pg8000.core.CoreConnection.execute_unnamed, RedisStreamsPublisher.gate,
            RedisStreamsPublisher.deliver) == originals
    assert_nothing_left(servers.database_url, servers.redis_url, database, redis_prefix)


@pytest.mark.parametrize("option", [("--batch-sizes", "0"), ("--batch-sizes", "10,-5"), ("--processes", "1,x")])
def test_bench_refuses_sizes_that_are_not_positive_integers(servers, option):
    proc = _bench(servers, "drain", *option, "--database-name", f"outbox_bench_refused_{os.getpid()}")
    assert proc.returncode == 2
    assert f"expected comma-separated positive integers, got '{option[1]}'" in proc.stderr


def test_bench_latency_under_aws_like_scheduling_hands_over_and_loses_nothing(servers, redis_prefix, tmp_path):
    """A short run of the scheduler model: starts late within their slot, a run
    missed, cold starts. The seed puts the missed run inside the producer's time,
    so the poller before it starts its successor itself, through boto3 and the
    Invoke API stand-in; every message is delivered once."""
    database = f"outbox_bench_lat_{os.getpid()}"
    out = tmp_path / "latest.json"
    proc = _bench(servers, "latency", "--quick", "--rates", "100", "--latency-seconds", "70", "--period", "20",
                  "--function-timeout", "40", "--deadline-margin", "5", "--start-jitter", "20", "--missed-runs", "0.3",
                  "--cold-start", "1", "--seed", "1", "--database-name", database, "--prefix", redis_prefix,
                  "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    models = results["latency"]["models"]
    (key,) = models
    entry = models[key]
    assert key == "jitter 20 s, missed 0.3, cold start 1 s" and entry["model"]["seed"] == 1
    assert (entry["period_seconds"], entry["timeout_seconds"], entry["lease_seconds"], entry["margin_seconds"],
            entry["reserved_concurrency"]) == (20, 40, 70, 5, 3)
    (run,) = entry["runs"]
    assert run["check"]["ok"], run["check"]
    assert run["sent"] >= 0.98 * 100 * 70 and run["delivered"] == run["sent"] == run["check"]["distinct_ids"]
    assert run["lost"] == 0 and run["duplicates"] == 0
    inv = run["invocations"]
    assert inv["missed"] >= 1 and inv["by_self_invoke"] >= 1 and inv["by_schedule"] >= 2
    assert inv["self_invokes_received"] == inv["by_self_invoke"] and inv["refused_invokes"] == 0
    assert inv["errors"] == 0 and inv["over_timeout"] == 0 and inv["throttled"] == 0
    assert run["handovers"] >= 2
    gap = run["without_poller"]
    for field in ("registry_seconds", "bench_seconds", "registry_longest_seconds", "bench_longest_seconds",
                  "successors_requested"):
        assert field in gap
    # a poller starts its successor before its deadline, with a cold start to spare: no gap
    assert gap["registry_seconds"] < 1.0 and gap["bench_seconds"] < 1.0
    assert gap["successors_requested"] == inv["by_self_invoke"]
    assert 0.9 < run["poller_seconds_per_second"] < 2.0
    for field in ("p50", "p99", "max"):
        assert run["lag_ms"][field] is not None
    # the lag of each second's commits, for the figure: every second of the producer's, the run's worst among them
    series = run["lag_per_second_ms"]
    assert len(series["second"]) == len(series["p50"]) == len(series["p99"]) == len(series["max"])
    assert 65 <= len(series["second"]) <= 72 and series["second"] == sorted(series["second"])
    assert max(series["max"]) == pytest.approx(run["lag_ms"]["max"], abs=0.11)
    assert all(a <= b <= c for a, b, c in zip(series["p50"], series["p99"], series["max"]))
    started = [t for t in run["timeline"] if t["began"] is not None]
    assert all(t["began"] - t["requested"] >= 0.99 for t in started)  # the cold start
    assert any(t["source"] == "self-invoke" and t["predecessor"] for t in started)

    from bench import report

    page = report.markdown(results)
    assert "Latency mode, a slot every 20 s, starts uniform within 20 s after their slot" in page
    for column in report.LATENCY_COLUMNS:
        assert column in page
    assert "Latency mode, a slot every 20 s" in proc.stdout
    assert_nothing_left(servers.database_url, servers.redis_url, database, redis_prefix)


@pytest.mark.parametrize("option", [("--start-jitter", "-1"), ("--start-jitter", "soon"), ("--missed-runs", "1.5"),
                                    ("--missed-runs", "-0.1"), ("--missed-runs", "nan"), ("--cold-start", "x"),
                                    ("--cold-start", "-2"), ("--cold-start", "inf"), ("--reserved-concurrency", "0"),
                                    ("--period", "0"), ("--function-timeout", "-5")])
def test_bench_refuses_bad_scheduler_model_values_naming_the_option(servers, option):
    proc = _bench(servers, "latency", *option, "--database-name", f"outbox_bench_refused_{os.getpid()}")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"Invalid value for '{option[0]}'" in errors[0] and repr(option[1]) in errors[0]


def test_bench_redis_compares_one_node_and_a_cluster_with_and_without_wait(servers, redis_prefix, tmp_path):
    import shutil

    if not (shutil.which("redis-server") and shutil.which("redis-cli")):
        pytest.skip("redis-server and redis-cli are needed for the redis section's own servers")
    database = f"outbox_bench_redis_{os.getpid()}"
    out = tmp_path / "latest.json"
    proc = _bench(servers, "redis", "--quick", "--n", "300", "--database-name", database, "--prefix", redis_prefix,
                  "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rd = json.loads(out.read_text())["redis"]
    runs = {(r["topology"], r["wait_replicas"]): r for r in rd["runs"]}
    assert set(runs) == {(t, w) for t in ("single node", "cluster, 3 primaries") for w in (0, 1)}
    assert all(r["check"]["ok"] and r["delivered"] == 300 and r["messages_per_second"] > 0 for r in runs.values())
    assert all(r["not_replicated"] == 0 for r in runs.values())
    assert rd["cluster_vs_single"] > 0 and rd["wait1_vs_none_single"] > 0
    f = rd["failover"]
    assert f["check"]["ok"] and f["recorded_delivered"] == 300
    assert f["recorded_delivered_and_missing"] == 0 and f["duplicate_entries"] == 0
    assert "Redis as on AWS" in proc.stdout
    assert_nothing_left(servers.database_url, servers.redis_url, database, redis_prefix)
