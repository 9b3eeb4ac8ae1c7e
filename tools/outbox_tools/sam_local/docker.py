"""Docker's engine for `outbox local`: the one running, or one started here
(dockerd installed, run as root) and stopped again, with the containerd it
started, by their process ids."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..servers import wait_gone
from .errors import Unavailable

#: What to install when Docker is missing (Debian and Ubuntu; .ci/run installs the same).
INSTALL_DOCKER = "apt-get install docker.io"
START_SECONDS = 60


@dataclass
class DockerEngine:
    """A Docker engine that answers: its version, the host's address on the
    default bridge (where a container finds the host), and whether it was
    started here (then `stop` stops it)."""

    version: str
    bridge: str
    started: bool = False
    _dockerd: subprocess.Popen | None = field(default=None, repr=False)
    _containerd: list[int] = field(default_factory=list, repr=False)

    @property
    def pid(self) -> int | None:
        """The process id of the dockerd started here, else None."""
        return self._dockerd.pid if self._dockerd is not None else None

    def stop(self) -> None:
        """Stop the dockerd started here, then any containerd it started that
        outlived it (a killed dockerd leaves its containerd running). Nothing
        when the engine was already running."""
        if self._dockerd is None:
            return
        dockerd, self._dockerd = self._dockerd, None
        dockerd.terminate()
        try:
            dockerd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            dockerd.kill()
            dockerd.wait(timeout=30)
        for pid in self._containerd:
            _stop_pid(pid)
        self._containerd = []


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _docker_info() -> tuple[str | None, str]:
    """(server version, '') when the engine answers, else (None, docker info's last line)."""
    try:
        info = _run(["docker", "info", "--format", "{{.ServerVersion}}"])
    except subprocess.TimeoutExpired:
        return None, "docker info did not answer within 30 s"
    version = info.stdout.strip()
    if info.returncode == 0 and version:
        return version, ""
    lines = [line for line in (info.stderr + info.stdout).splitlines() if line.strip()]
    return None, lines[-1].strip() if lines else f"docker info exited with {info.returncode}"


#: Where dockerd is looked for beyond PATH: a user's PATH may leave out the sbin directories.
DOCKERD_PATHS = ("/usr/sbin/dockerd", "/usr/bin/dockerd", "/usr/local/bin/dockerd")


def _which_dockerd() -> str | None:
    return shutil.which("dockerd") or next((p for p in DOCKERD_PATHS if os.access(p, os.X_OK)), None)


def find_or_start(*, start: bool = True, log: Path | None = None,
                  echo: Callable[[str], None] = lambda line: None) -> DockerEngine:
    """The running Docker engine, or one started here when `start` allows it.

    Raises `Unavailable` with one line saying what is missing and how to provide it."""
    if shutil.which("docker") is None:
        raise Unavailable(f"Docker is not installed: install it ({INSTALL_DOCKER} on Debian or Ubuntu) "
                          "and run the command again")
    version, why = _docker_info()
    engine = None
    if version is None:
        dockerd = _which_dockerd()
        if dockerd is None:
            raise Unavailable(f"Docker's engine is not running and dockerd is not installed ({why}): "
                              f"{INSTALL_DOCKER}")
        if not start:
            raise Unavailable(f"Docker's engine is not running ({why})")
        if os.geteuid() != 0:
            raise Unavailable(f"Docker's engine is not running ({why}) and starting dockerd needs root: "
                              "start it (sudo systemctl start docker, or sudo dockerd) or run as root")
        engine = _start_dockerd(dockerd, log, echo)
        version = engine.version
    try:
        bridge = _bridge_address()
    except BaseException:
        if engine is not None:
            engine.stop()
        raise
    if engine is None:
        return DockerEngine(version, bridge)
    engine.bridge = bridge
    return engine


def _storage_driver() -> str:
    """overlay2 where this kernel mounts overlayfs, else vfs (slower: a full copy per container), as .ci/run."""
    probe = Path(tempfile.mkdtemp(prefix="outbox-overlay-"))
    try:
        for name in ("lower", "upper", "work", "merged"):
            (probe / name).mkdir()
        mounted = _run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={probe}/lower,upperdir={probe}/upper,workdir={probe}/work", str(probe / "merged")])
        if mounted.returncode != 0:
            return "vfs"
        _run(["umount", str(probe / "merged")])
        return "overlay2"
    except (OSError, subprocess.TimeoutExpired):
        return "vfs"
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _start_dockerd(dockerd: str, log: Path | None, echo: Callable[[str], None]) -> DockerEngine:
    driver = _storage_driver()
    if log is None:
        log = Path(tempfile.mkdtemp(prefix="outbox-dockerd-")) / "dockerd.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    echo(f"starting dockerd ({driver}); its log: {log}")
    with log.open("ab") as out:
        # A session of its own: a Ctrl-C meant for `outbox local` reaches dockerd only through stop().
        process = subprocess.Popen([dockerd, f"--storage-driver={driver}"], stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    engine = DockerEngine("", "", started=True, _dockerd=process)
    try:
        began = time.monotonic()
        while True:
            version, _ = _docker_info()
            if version is not None:
                break
            waited = time.monotonic() - began
            if process.poll() is not None or waited >= START_SECONDS:
                raise Unavailable(f"dockerd did not start within {waited:.0f} s: {_last_error(log)} (log: {log})")
            time.sleep(1)
        engine.version = version
        engine._containerd = _children(process.pid, "containerd")
        echo(f"dockerd {version} ready after {time.monotonic() - began:.0f} s")
        return engine
    except BaseException:
        engine.stop()
        raise


def _last_error(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    errors = [line for line in lines if "level=error" in line or "level=fatal" in line]
    return (errors or lines or ["no output"])[-1].strip()[:300]


def _children(pid: int, name: str) -> list[int]:
    """The processes called `name` whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid …: comm may hold spaces, so split after its closing parenthesis.
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if comm == name and ppid == pid:
            found.append(int(entry.name))
    return found


def _stop_pid(pid: int, seconds: float = 15.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    wait_gone(pid, seconds)


def _bridge_address() -> str:
    """The host's IPv4 address on Docker's default bridge: where a container
    on that network reaches the host."""
    name = _run(["docker", "network", "inspect", "bridge", "--format",
                 '{{index .Options "com.docker.network.bridge.name"}}'])
    if name.returncode != 0 or not name.stdout.strip():
        raise Unavailable(f"Docker has no default bridge network ({(name.stderr.strip() or 'no name')[:200]})")
    interface = name.stdout.strip()
    try:
        return interface_ipv4(interface)
    except OSError as exc:
        raise Unavailable(f"Docker's bridge {interface!r} is not an interface of this machine ({exc.strerror}): "
                          "`outbox local` needs Docker's engine on this machine, not in a virtual machine") from None


def interface_ipv4(name: str) -> str:
    """The IPv4 address of a network interface of this machine (Linux: SIOCGIFADDR)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
    return socket.inet_ntoa(packed[20:24])
