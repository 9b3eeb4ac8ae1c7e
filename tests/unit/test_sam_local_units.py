"""`outbox local` without Docker: the template built for this machine, the
default events, the environment a container gets, the image names it takes,
and the one line it prints when Docker or a python3.12 is missing (decision
0039). The runs in containers are tests/sam_local."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import cfn_yaml
from click.testing import CliRunner

from outbox_tools.cli import main
from outbox_tools.sam_local import build, docker
from outbox_tools.sam_local.bridges import (
    Addresses,
    container_database_url,
    container_redis_url,
    database_target,
    redis_target,
    sam_env,
    ses_sender,
)
from outbox_tools.sam_local.errors import Unavailable
from outbox_tools.sam_local.session import DEFAULT_EVENTS
from support.events import EVENTS, SENDER, functions_for, load
from support.template import ROOT, TemplateModel


def _leaves(node: Any, path: tuple = ()) -> dict[tuple, Any]:
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, (*path, key)).items()}
    if isinstance(node, list):
        return {k: v for i, value in enumerate(node) for k, v in _leaves(value, (*path, i)).items()}
    return {path: node}


def test_the_local_build_differs_from_the_template_only_in_architecture(monkeypatch) -> None:
    monkeypatch.setattr(build, "HOST_ARCHITECTURE", "x86_64")
    deployed, local = _leaves(cfn_yaml.load(str(ROOT / "template.yaml"))), _leaves(build.host_template(ROOT))
    changed = {path for path in deployed.keys() | local.keys() if deployed.get(path) != local.get(path)}
    assert changed, "the deployed template is arm64: an x86_64 build must differ"
    assert all(p[-1] == "BuildArchitecture" or "Architectures" in p[-2:] or "CompatibleArchitectures" in p
               for p in changed), changed
    assert {deployed[p] for p in changed} == {"arm64"} and {local[p] for p in changed} == {"x86_64"}


def test_every_function_has_a_default_event_that_is_one_of_its_samples() -> None:
    functions = set(TemplateModel(every_condition=True).of_type("AWS::Serverless::Function"))
    assert set(build.function_names(ROOT)) == functions == set(DEFAULT_EVENTS)
    for function, sample in DEFAULT_EVENTS.items():
        assert function in functions_for(load(EVENTS / sample)), (function, sample)


def test_a_unix_socket_server_is_reached_over_tcp_with_its_credentials_and_database() -> None:
    pg = "postgresql+pg8000://postgres:secret@/outbox_dev?unix_sock=/tmp/pg/.s.PGSQL.5432"
    assert database_target(pg) == ("/tmp/pg/.s.PGSQL.5432", None)
    assert container_database_url(pg, "172.17.0.1", 41000) == (
        "postgresql+pg8000://postgres:secret@172.17.0.1:41000/outbox_dev")
    assert database_target("postgresql+pg8000://app@127.0.0.1:5433/shop") == ("127.0.0.1", 5433)
    assert redis_target("unix:///tmp/r/redis.sock?db=2") == ("/tmp/r/redis.sock", None)
    assert container_redis_url("unix:///tmp/r/redis.sock?db=2", "172.17.0.1", 42000) == "redis://172.17.0.1:42000/2"
    assert container_redis_url("redis://:pw@127.0.0.1:6379/3", "172.17.0.1", 42000) == (
        "redis://:pw@172.17.0.1:42000/3")


def test_the_environment_is_sam_env_json_with_every_compose_service_replaced() -> None:
    addresses = Addresses(postgres=("172.17.0.1", 41000), redis=("172.17.0.1", 42000), moto=("172.17.0.1", 43000))
    env = sam_env(ROOT, addresses, "postgresql+pg8000://postgres@127.0.0.1:5432/outbox_dev",
                  "redis://127.0.0.1:6379/0")
    assert env["Parameters"]["DATABASE_URL"] == "postgresql+pg8000://postgres@172.17.0.1:41000/outbox_dev"
    assert env["Parameters"]["AWS_ENDPOINT_URL"] == "http://172.17.0.1:43000"
    assert env["RelayRedisFunction"]["REDIS_URL"] == "redis://172.17.0.1:42000/0"
    text = str(env)
    assert not any(f"//{name}:" in text or f"@{name}:" in text for name in ("postgres", "redis", "moto")), text
    assert ses_sender(ROOT) == SENDER


@pytest.mark.parametrize(("text", "ok"), [
    ("outbox-relay/lambda-python3.12:x86_64-24d5a966a9f3", True),
    ("public.ecr.aws/lambda/python:3.12-x86_64", True),
    ("localhost:5000/lambda:latest", True),
    ("Has Space", False), ("UPPER/case", False), ("name:", False), ("", False),
])
def test_image_names(text: str, ok: bool) -> None:
    assert build.is_image_reference(text) is ok


def _executable(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def no_docker_engine(tmp_path, monkeypatch) -> Path:
    """A PATH whose `docker` answers as it does when its engine is not running."""
    _executable(tmp_path, "docker", 'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2\n'
                                    "exit 1\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(docker, "DOCKERD_PATHS", ())
    return tmp_path


def test_without_docker_the_line_names_what_to_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Unavailable, match="Docker is not installed.*apt-get install docker.io"):
        docker.find_or_start()


def test_without_dockerd_the_line_names_what_to_install(no_docker_engine) -> None:
    with pytest.raises(Unavailable, match=r"not running and dockerd is not installed \(Cannot connect.*\): "
                                          "apt-get install docker.io"):
        docker.find_or_start()


def test_starting_dockerd_needs_root(no_docker_engine, monkeypatch) -> None:
    _executable(no_docker_engine, "dockerd", "exit 1\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(Unavailable, match="starting dockerd needs root"):
        docker.find_or_start()
    # and nothing was started: the fake dockerd would have failed the wait instead


def test_pyenv_installs_are_candidates_newest_first(tmp_path, monkeypatch) -> None:
    for version in ("3.12.1", "3.12.10", "3.11.7", "3.12.9"):
        (tmp_path / "versions" / version / "bin").mkdir(parents=True)
        (tmp_path / "versions" / version / "bin" / "python3.12").touch()
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    pyenv = [c for c in build.python312_candidates() if c.startswith(str(tmp_path))]
    assert [Path(c).parents[1].name for c in pyenv] == ["3.12.10", "3.12.9", "3.12.1"]


def test_without_a_python312_the_line_says_how_to_provide_one(monkeypatch) -> None:
    monkeypatch.setattr(build, "python312_candidates", lambda: [])
    with pytest.raises(Unavailable, match=r"no python3.12 found \(PATH, /usr/local/bin, /usr/bin, pyenv\).*"
                                          "pyenv install 3.12.*--python"):
        build.find_python312()


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click 8.1
    except TypeError:  # click 8.2 keeps standard error apart and dropped the argument
        return CliRunner()


def test_the_command_without_docker_exits_2_with_one_line(no_docker_engine, monkeypatch) -> None:
    # Given a machine with the SAM CLI and a python3.12, but no Docker engine or dockerd
    from outbox_tools.sam_local import session

    monkeypatch.setattr(session, "find_python312", lambda: "/usr/bin/python3.12")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    # When the user invokes a function
    result = _runner().invoke(main, ["local", "invoke", "RelayRedisFunction"])
    # Then one line says what is missing and how to get it, with the usage status and no traceback
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "apt-get install docker.io" in lines[0], lines
    assert result.stdout == "" and (result.exception is None or isinstance(result.exception, SystemExit))


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("DATABASE_URL", "mysql://root@127.0.0.1/x", "DATABASE_URL"),
    ("REDIS_URL", "redis://127.0.0.1:6379/orders", "REDIS_URL: the database in the URL's path must be a number"),
])
def test_a_bad_server_url_is_named_before_docker_is_touched(variable, value, says, monkeypatch) -> None:
    from outbox_tools.sam_local import session

    def no_docker(**kwargs):
        raise AssertionError("Docker was looked for")

    monkeypatch.setattr(session, "find_or_start", no_docker)
    monkeypatch.setenv(variable, value)
    result = _runner().invoke(main, ["local", "invoke", "RelayRedisFunction"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and says in lines[0], (result.stderr, result.exception)


def test_a_sam_cli_that_ignores_ctrl_c_is_stopped_without_waiting_a_minute():
    # Given a process that ignores SIGINT, as `sam local invoke` may once its container is gone
    import subprocess
    import sys
    import time

    from outbox_tools.sam_local.sam import _stop

    process = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, "
                                "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    began = time.monotonic()
    # When it is stopped: SIGINT, then SIGTERM after the wait
    _stop(process, seconds=0.5)
    # Then it is gone within about one wait, not the old minute
    assert process.poll() is not None and time.monotonic() - began < 5
    process.stdout.close()


def test_the_runtimes_poll_after_the_report_is_not_copied_to_the_logs():
    # Given what sam local invoke printed: the invocation, its REPORT, then the runtime interface
    # client's failed poll for a next invocation as the container is stopped
    import io

    from outbox_tools.sam_local.sam import _collect

    class Process:
        stderr = io.StringIO(
            "START RequestId: 1 Version: $LATEST\n"
            '{"level":"ERROR","message":"LAMBDA_RUNTIME Failed to get next invocation"}\n'  # before: the function's
            "END RequestId: 1\nREPORT RequestId: 1\tDuration: 812.33 ms\n"
            "[ERROR] 2026-12-06T05:00:00Z LAMBDA_RUNTIME Failed to get next invocation\n")
        returncode = 0

        def wait(self, timeout=None):
            return 0

        def poll(self):
            return 0

    copied = io.StringIO()
    kept = _collect(Process(), copied, timeout=60)
    # Then everything up to the REPORT is kept and copied, and the poll after it is not
    assert kept == copied.getvalue() and kept.endswith("Duration: 812.33 ms\n")
    assert kept.count("LAMBDA_RUNTIME Failed to get next invocation") == 1
