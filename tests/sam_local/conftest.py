"""Fixtures of the sam_local tests, made of what `outbox local` runs
(outbox_tools.sam_local, decisions 0024 and 0039): Docker found or started,
the base image, the build for this machine's architecture, and the machine's
PostgreSQL, Redis, SES (moto) and a CloudFormation response server reachable
from a Lambda container on Docker's default bridge.

Without Docker or a python3.12, every test here is skipped with the reason
(`pytest -ra` prints it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from outbox_tools.cfn_response import ResponseServer
from outbox_tools.local_ses import LocalSesServer
from outbox_tools.sam_local.bridges import Bridges, ses_sender
from outbox_tools.sam_local.build import (
    HOST_ARCHITECTURE,
    Image,
    build_for_host,
    choose_image,
    find_python312,
    work_dir,
)
from outbox_tools.sam_local.docker import DockerEngine, find_or_start
from outbox_tools.sam_local.errors import Unavailable
from support.template import ROOT


@pytest.fixture(scope="session")
def docker() -> Iterator[DockerEngine]:
    """The running Docker engine, or one started for the session (as root) and stopped after it."""
    try:
        engine = find_or_start(start=True, log=work_dir(ROOT) / "dockerd.log")
    except Unavailable as exc:
        pytest.skip(f"Docker cannot run here: {exc}")
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def python312() -> str:
    try:
        return find_python312()
    except Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def invoke_image(docker: DockerEngine, python312: str) -> Image:
    """AWS's image where its registry answers, else the stand-in, built once and then reused."""
    try:
        return choose_image("auto", ROOT, python312, echo=print)
    except Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def build_dir(python312: str) -> Path:
    """`sam build` for this machine's architecture, checked by .ci/check_sam_build.py as CI
    checks the deployed build."""
    out = build_for_host(ROOT, python312)
    check = subprocess.run([sys.executable, str(ROOT / ".ci" / "check_sam_build.py"), str(out),
                            "--architecture", HOST_ARCHITECTURE], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    return out


@pytest.fixture(scope="session")
def host_services(servers, docker: DockerEngine) -> Iterator[Bridges]:
    """This machine's PostgreSQL and Redis at forwarders on the bridge, moto and the response server there."""
    with Bridges(ROOT, docker.bridge, servers.database_url, servers.redis_url) as bridges:
        yield bridges


@pytest.fixture
def ses(host_services: Bridges) -> LocalSesServer:
    """moto on the bridge, emptied, with the sender of infra/sam-env.json verified."""
    host_services.ses.reset()
    host_services.ses.verify(ses_sender(ROOT))
    return host_services.ses


@pytest.fixture
def moto(host_services: Bridges) -> LocalSesServer:
    """moto on the bridge, emptied: it serves SQS, SNS and EventBridge too (AWS_ENDPOINT_URL)."""
    host_services.ses.reset()
    return host_services.ses


@pytest.fixture
def cfn(host_services: Bridges) -> ResponseServer:
    """The response server on the bridge, with no response yet."""
    host_services.cfn.responses.clear()
    return host_services.cfn
