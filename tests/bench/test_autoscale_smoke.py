"""Pollers following a stepped load, in the bench (bench/autoscale.py), at tiny sizes:
the results' shape per second and per step, and every message committed in the
stream once, each key's messages in their order. No speed is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import plots, report
from bench.lambda_model import CGROUP_CPU
from outbox_tools.lambda_local import project_root
from support.leftovers import assert_nothing_left

pytestmark = pytest.mark.bench

#: Held to Lambda's CPU where this machine allows it, else labelled uncapped.
CAP = () if os.access(CGROUP_CPU / "cgroup.procs", os.W_OK) else ("--uncapped",)


def _bench(servers, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "AWS_"))}
    env.update(DATABASE_URL=servers.database_url, REDIS_URL=servers.redis_url)
    return subprocess.run([sys.executable, "-m", "bench", "autoscale", *args, *CAP], cwd=project_root(), env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_stepped_load_is_delivered_once_in_key_order_with_its_pollers_per_second(servers, redis_prefix, tmp_path):
    database = f"outbox_bench_autoscale_{os.getpid()}"
    out = tmp_path / "latest.json"
    proc = _bench(servers, "--quick", "--r1", "200", "--step-seconds", "8", "--pollers-max", "2",
                  "--database-name", database, "--prefix", redis_prefix, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    section = results["autoscale"]

    # The steps: 10 %, 300 %, 10 % of R1, each needing offered / R1 rounded up, at most the maximum
    assert section["r1_per_second"] == 200 and section["r1_from"] == "--r1" and section["pollers_max"] == 2
    assert [(s["fraction"], s["offered_per_second"], s["needs"]) for s in section["steps"]] == [
        (0.1, 20, 1), (3.0, 600, 2), (0.1, 20, 1)]
    assert [(c["at_second"], c["direction"], c["needs_after"]) for c in section["changes"]] == [
        (8, "up", 2), (16, "down", 1)]
    per = section["per_second"]
    assert per["second"] == list(range(24))
    assert all(len(per[k]) == 24 for k in per)
    assert per["offered"] == [20] * 8 + [600] * 8 + [20] * 8 and per["needs"] == [1] * 8 + [2] * 8 + [1] * 8
    # Pollers were live (read from the registry), never more than each slot and, at a
    # handover, its successor
    live = [v for v in per["live_pollers"] if v is not None]
    assert len(live) >= 12 and 1 <= max(live) <= 2 * 2 and sum(per["poller_seconds"]) > 0
    assert section["poller_seconds_per_second"] > 0 and section["vs_needs"] > 0

    # Every message committed reached the stream once, each key's in order
    run = section["latency_run"]
    assert run["sent"] > 0 and run["delivered"] == run["sent"] == run["check"]["distinct_ids"]
    assert section["check"] == {"ok": True, "keys_out_of_order": 0, "lost": 0, "duplicates": 0}
    assert sum(per["committed"]) <= run["sent"] and sum(per["delivered"]) <= run["delivered"]
    assert section["lag_outside_steps_ms"]["messages"] > 0

    # The page's section, its figure, and a target row for each of the three goals
    page = report.markdown(results)
    assert "Autoscaling (`python -m bench autoscale`" in page and plots.autoscale_figure(results).link() in page
    assert sum(t["target"].startswith(("Autoscaling", "... lag p99 outside", "... poller-seconds"))
               for t in results["targets"]) == 3
    assert_nothing_left(servers.database_url, servers.redis_url, database, redis_prefix)


@pytest.mark.parametrize("option", [("--step-seconds", "0"), ("--pollers-max", "0"), ("--add-age-seconds", "-1"),
                                    ("--pollers", "3", "--pollers-max", "2")])
def test_bad_autoscale_options_are_refused_naming_the_option(servers, option, tmp_path):
    proc = _bench(servers, *option, "--r1", "100", "--database-name", f"outbox_bench_refused_{os.getpid()}",
                  "--out", str(tmp_path / "latest.json"))
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    name = option[-2]
    assert len(errors) == 1 and f"Invalid value for '{name}'" in errors[0], proc.stderr
    assert not (tmp_path / "latest.json").exists()
