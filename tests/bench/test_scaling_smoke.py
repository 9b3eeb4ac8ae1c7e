"""Several pollers per channel and an outage's catch-up, in the bench (bench/scaling.py),
at tiny sizes: every message committed is in the stream once, each key's messages in
their order, and the outage delivered nothing while it lasted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import report
from bench.lambda_model import CGROUP_CPU
from outbox_tools.lambda_local import project_root
from support.leftovers import assert_nothing_left

pytestmark = pytest.mark.bench

#: Held to Lambda's CPU where this machine allows it, else labelled uncapped.
CAP = () if os.access(CGROUP_CPU / "cgroup.procs", os.W_OK) else ("--uncapped",)


def _bench(servers, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "AWS_"))}
    env.update(DATABASE_URL=servers.database_url, REDIS_URL=servers.redis_url)
    return subprocess.run([sys.executable, "-m", "bench", *args, *CAP], cwd=project_root(), env=env,
                          capture_output=True, text=True, timeout=600)


def _section(servers, redis_prefix, tmp_path, name: str, *args: str) -> tuple[str, dict]:
    """Run one section into a results file of the test's own: its database's name and the results."""
    database = f"outbox_bench_{name}_{os.getpid()}"
    out = tmp_path / "latest.json"
    proc = _bench(servers, name, "--quick", *args, "--database-name", database, "--prefix", redis_prefix,
                  "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return database, json.loads(out.read_text())


def _every_message_once_in_order(run: dict) -> None:
    check = run["check"]
    assert check["ok"], check
    assert run["sent"] > 0 and run["delivered"] == check["distinct_ids"] == check["stream_entries"] >= run["sent"]
    assert run["lost"] == 0 and run["duplicates"] == 0 and run["keys_out_of_order"] == 0


def test_two_pollers_deliver_every_keyed_message_once_in_order(servers, redis_prefix, tmp_path):
    database, results = _section(servers, redis_prefix, tmp_path, "pollers", "--pollers", "2", "--rates", "150",
                                 "--latency-seconds", "4")
    section = results["pollers"]
    assert [c["pollers"] for c in section["counts"]] == [2]
    for count in section["counts"]:
        (run,) = count["runs"]
        _every_message_once_in_order(run)
        assert run["pollers"] == count["pollers"] and run["keys_per_producer"] == section["keys_per_producer"]
        assert run["invocations"]["most_at_once"] >= count["pollers"] and run["invocations"]["errors"] == 0
        assert run["cpu_cores"]["machine_cores"] == os.cpu_count() and run["cpu_cores"]["seconds"] > 0
        drain = count["drain"]  # a backlog waiting when the pollers start
        _every_message_once_in_order(drain["run"])
        assert drain["run"]["sent"] + drain["messages"] == drain["run"]["delivered"]
        assert drain["messages"] == section["backlog"] > 0 and drain["drain_per_second"] > 0
    assert section["check"] == {"ok": True, "keys_out_of_order": 0, "lost": 0}
    assert "Pollers per channel" in report.markdown(results)
    assert_nothing_left(servers.database_url, servers.redis_url, database, redis_prefix)


def test_a_downstream_outage_delivers_nothing_then_drains_in_key_order(servers, redis_prefix, tmp_path):
    database, results = _section(servers, redis_prefix, tmp_path, "catchup", "--r1", "200", "--pollers", "2",
                                 "--outage-minutes", "0.1")
    section = results["catchup"]
    assert section["pollers"] == 2 and section["offered_per_second"] == 100 and section["outage_seconds"] == 6
    _every_message_once_in_order(section["latency_run"])
    assert section["delivered_during_outage"] == 0
    # what was committed during the outage waited, and was delivered after it
    assert section["backlog_at_restart"] >= 0.9 * 100 * 6 and section["drain_per_second"] > 0
    assert section["caught_up_after_seconds"] is not None
    # each second from the restart to the backlog's last entry counted once (the drain's seconds rounded)
    after = section["drain_per_second"] * section["backlog_drained_seconds"]
    assert abs(sum(section["entries_per_second"]) - after) <= 0.06 * section["drain_per_second"] + 1
    # the references: the same pollers draining a backlog over the producers' keys, with no producer to keep
    # up with (the pollers section's size), and the outage's backlog while the producers offer as after it
    unloaded, reference = section["unloaded_drain"], section["reference_drain"]
    for drain, messages, offered in ((unloaded, 500, 50), (reference, 600, 100)):
        _every_message_once_in_order(drain["run"])
        assert drain["messages"] == messages and drain["offered_per_second"] == offered
        assert drain["run"]["offered_per_second"] == offered
        assert drain["keys"] == section["keys_per_producer"] * reference["run"]["producers"]
        assert drain["run"]["sent"] + drain["messages"] == drain["run"]["delivered"] and drain["drain_per_second"] > 0
        # each second of the drain counted once
        written = drain["drain_per_second"] * drain["seconds"]  # both rounded
        assert abs(sum(drain["entries_per_second"]) - written) <= 0.01 * drain["drain_per_second"] + 1
    # the outage's backlog waits on the producers' own keys, the unloaded one on keys of its own
    assert reference["keys_the_producers_used"] == reference["keys"] and unloaded["keys_the_producers_used"] == 0
    assert reference["producers_outlasted_drain"]
    assert section["reference_per_second"] == reference["drain_per_second"]
    assert section["unloaded_per_second"] == unloaded["drain_per_second"]
    assert section["drain_vs_reference"] == round(section["drain_per_second"] / section["reference_per_second"], 3)
    assert section["check"] == {"ok": True, "keys_out_of_order": 0, "lost": 0, "duplicates": 0}
    assert "Catching up after a downstream outage" in report.markdown(results)
    assert_nothing_left(servers.database_url, servers.redis_url, database, redis_prefix)


@pytest.mark.parametrize("option", [("--pollers", "0"), ("--pollers", "two"), ("--outage-minutes", "-1"),
                                    ("--r1", "fast"), ("--search-runs", "0")])
def test_bad_scaling_options_are_refused_naming_the_option(servers, option):
    proc = _bench(servers, "catchup", *option, "--database-name", f"outbox_bench_refused_{os.getpid()}")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"Invalid value for '{option[0]}'" in errors[0], proc.stderr
