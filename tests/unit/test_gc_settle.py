"""The collector is tuned once per container, after the dependencies are built (runtime.settle_gc).

Run in a fresh interpreter: the tuning is process-wide and happens once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import gc, json
calls = []
real_freeze = gc.freeze
gc.freeze = lambda: (calls.append(1), real_freeze())
from outbox_relay import runtime
from outbox_relay.publishers.redis import GC_YOUNG_THRESHOLD
before = gc.get_threshold()
deps = runtime.get_dependencies()
frozen = gc.get_freeze_count()
runtime.reset()
runtime.get_dependencies()  # a second container build in the same process: no second freeze
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": frozen, "freezes": len(calls),
                  "young": GC_YOUNG_THRESHOLD}))
"""


def _run(channel: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update({
        "OUTBOX_CHANNEL": channel,
        "OUTBOX_SES_FROM": "no-reply@example.com",
        "AWS_DEFAULT_REGION": "eu-west-1",
        # nothing connects while the dependencies are built
        "DATABASE_URL": "postgresql+pg8000://nobody@127.0.0.1:1/none",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "POWERTOOLS_TRACE_DISABLED": "true",
    })
    env.pop("DATABASE_SECRET_ARN", None)
    env.pop("REDIS_URL_SECRET_ARN", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_redis_relay_freezes_the_init_objects_and_raises_the_young_threshold_once() -> None:
    got = _run("redis")
    assert got["before"][0] == 700  # CPython's default, untouched until the container is built
    assert got["after"] == [got["young"], got["before"][1], got["before"][2]]
    assert got["frozen"] > 10_000  # modules, clients and engine moved out of the collector's way
    assert got["freezes"] == 1


def test_an_ses_relay_freezes_the_init_objects_and_keeps_the_default_threshold() -> None:
    # each SES send leaves reference cycles behind: the collector keeps its default pace
    got = _run("ses")
    assert got["after"] == got["before"] and got["before"][0] == 700
    assert got["frozen"] > 10_000 and got["freezes"] == 1
