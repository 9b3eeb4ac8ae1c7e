"""Fixtures of the sam_local tests: Docker, the stand-in image, the build for
this machine's architecture, and the machine's PostgreSQL, Redis, SES (moto)
and a CloudFormation response server reachable from a Lambda container on
Docker's default bridge (decision 0024).

Without Docker, a python3.12 or PostgreSQL and Redis over TCP, every test here
is skipped with the reason (`pytest -ra` prints it).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest
from sqlalchemy.engine import make_url

from outbox_tools.cfn_response import ResponseServer
from outbox_tools.local_ses import LocalSesServer
from support.events import SENDER
from support.forward import Forwarder
from support.sam_local import (
    HOST_ARCHITECTURE,
    IMAGE_SCRIPT,
    SAM,
    WORK,
    Addresses,
    find_python312,
    host_template,
    sam_environment,
)
from support.template import ROOT


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="session")
def docker_bridge() -> str:
    """The address of the host on Docker's default bridge (the gateway a container sees)."""
    try:
        info = _run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"Docker cannot start here: {exc}")
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["docker info failed"])[-1]
        pytest.skip(f"Docker cannot start here: {reason}")
    bridge = _run(["docker", "network", "inspect", "bridge", "--format",
                   '{{index .Options "com.docker.network.bridge.name"}}'], timeout=30)
    assert bridge.returncode == 0, bridge.stderr
    try:
        return interface_ipv4(bridge.stdout.strip())
    except OSError as exc:
        pytest.skip(f"Docker's bridge {bridge.stdout.strip()!r} is not an interface of this machine ({exc})")


def interface_ipv4(name: str) -> str:
    """The IPv4 address of a network interface of this machine (Linux: SIOCGIFADDR)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
    return socket.inet_ntoa(packed[20:24])


@pytest.fixture(scope="session")
def python312() -> str:
    found = find_python312()
    if found is None:
        pytest.skip("no python3.12 with pip (PATH, /usr/bin, /usr/local/bin, pyenv): sam build needs one")
    return found


@pytest.fixture(scope="session")
def invoke_image(docker_bridge: str, python312: str) -> str:
    """The stand-in base image, built once and then reused (infra/lambda-image/build.sh)."""
    proc = _run(["bash", str(IMAGE_SCRIPT), python312], timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def build_dir(python312: str) -> Path:
    """`sam build` of template.yaml for this machine's architecture (support.sam_local.host_template),
    checked by .ci/check_sam_build.py as CI checks the deployed build."""
    WORK.mkdir(parents=True, exist_ok=True)
    template = WORK / "template.json"
    template.write_text(json.dumps(host_template(), indent=1))
    out = WORK / "build"
    proc = _run([SAM, "build", "-t", str(template), "--base-dir", str(ROOT), "--build-dir", str(out),
                 "--cached", "--cache-dir", str(WORK / "cache")],
                timeout=1200, cwd=WORK, env=sam_environment(python312))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check = _run([str(Path(SAM).with_name("python")), str(ROOT / ".ci" / "check_sam_build.py"), str(out),
                  "--architecture", HOST_ARCHITECTURE], timeout=300)
    assert check.returncode == 0, check.stderr
    return out


@dataclass
class HostServices:
    """The machine's services as a Lambda container reaches them."""

    addresses: Addresses
    ses: LocalSesServer
    cfn: ResponseServer


def _host_and_port(url: str, default_port: int) -> tuple[str, int]:
    if url.startswith("redis"):
        parts = urlsplit(url)
        return parts.hostname or "", parts.port or default_port
    parsed = make_url(url)
    return parsed.host or "", parsed.port or default_port


@pytest.fixture(scope="session")
def host_services(servers, docker_bridge: str) -> Iterator[HostServices]:
    """Forwarders on the bridge address to PostgreSQL and Redis (they listen on
    127.0.0.1 only and are shared: not ours to reconfigure), and moto and the
    response server listening on the bridge address themselves."""
    pg, redis = _host_and_port(servers.database_url, 5432), _host_and_port(servers.redis_url, 6379)
    if not pg[0] or not redis[0]:
        pytest.skip("the sam_local tests need PostgreSQL and Redis over TCP (not a Unix socket)")
    with (Forwarder(docker_bridge, *pg) as pg_forward, Forwarder(docker_bridge, *redis) as redis_forward,
          LocalSesServer(host=docker_bridge, max_send_rate=100) as ses, ResponseServer(host=docker_bridge) as cfn):
        yield HostServices(Addresses(postgres=(docker_bridge, pg_forward.port),
                                     redis=(docker_bridge, redis_forward.port),
                                     moto=(docker_bridge, ses.port)), ses, cfn)


@pytest.fixture
def ses(host_services: HostServices) -> LocalSesServer:
    """moto on the bridge, emptied, with the sender of infra/sam-env.json verified."""
    host_services.ses.reset()
    host_services.ses.verify(SENDER)
    return host_services.ses


@pytest.fixture
def cfn(host_services: HostServices) -> ResponseServer:
    """The response server on the bridge, with no response yet."""
    host_services.cfn.responses.clear()
    return host_services.cfn
