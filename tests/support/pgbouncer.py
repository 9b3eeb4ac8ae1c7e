"""A PgBouncer of a test's own in front of the test PostgreSQL: a process started
here on a free loopback port, its files in a directory of the caller's, stopped by
its own pid. Never a shared pooler.

The binary is `OUTBOX_TEST_PGBOUNCER` when set (to try another version), else
`pgbouncer` on PATH or in /usr/sbin, where Debian's package puts it (.ci/run
installs that package when the binary is absent). `OUTBOX_TEST_PGBOUNCER_SETTINGS`
adds `name=value` settings, separated by `;` (e.g. `max_prepared_statements=200`,
which exists from PgBouncer 1.21 on).

By default the pool is in transaction mode with `server_round_robin = 1` and
its server connections opened before the test: the pooler then hands each
client's next transaction, or next message outside a transaction, to another
server connection whenever two are idle, so a statement whose protocol
messages are not held together by a transaction fails every time, not only
under load.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from outbox_tools.redis_nodes import free_port


class MissingPgBouncer(RuntimeError):
    """No pgbouncer binary was found."""


def pgbouncer_binary() -> str:
    chosen = os.environ.get("OUTBOX_TEST_PGBOUNCER")
    if chosen:
        return chosen
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if not found:
        raise MissingPgBouncer("pgbouncer is not installed (Debian: apt-get install pgbouncer; .ci/run does)")
    return found


def pgbouncer_version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise MissingPgBouncer(f"{binary} --version said {out.strip()[:100]!r}")
    return tuple(int(g or 0) for g in match.groups())


def _settings_from_environment() -> dict[str, str]:
    pairs = [p for p in os.environ.get("OUTBOX_TEST_PGBOUNCER_SETTINGS", "").split(";") if p.strip()]
    return {name.strip(): value.strip() for name, _, value in (p.partition("=") for p in pairs)}


def _unprivileged_user(socket_directory: Path | None) -> str | None:
    """PgBouncer refuses to run as root: as root, name a user for its `-u`, the owner
    of the server's socket directory when it connects through one (an embedded
    server's is its own)."""
    if os.geteuid() != 0:
        return None
    if socket_directory is not None and socket_directory.stat().st_uid != 0:
        return pwd.getpwuid(socket_directory.stat().st_uid).pw_name
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise MissingPgBouncer("running as root, and neither user postgres nor nobody exists for pgbouncer -u")


class PgBouncer:
    """PgBouncer in front of the server of `database_url` (any database on it, by
    name); `settings` are more lines of its `[pgbouncer]` section (they win)."""

    def __init__(self, directory: Path, database_url: str, *, pool_size: int = 2, **settings: Any) -> None:
        self.binary = pgbouncer_binary()
        self.version = pgbouncer_version(self.binary)
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o755)  # read by pgbouncer after it dropped root
        self.database_url = make_url(database_url)
        self.pool_size = pool_size
        self.settings = {
            "listen_addr": "127.0.0.1", "unix_socket_dir": "", "auth_type": "trust",
            "auth_file": str(directory / "userlist.txt"), "admin_users": self.database_url.username or "postgres",
            "pool_mode": "transaction", "default_pool_size": pool_size, "max_client_conn": 100,
            "server_round_robin": 1, "server_lifetime": 3600, "server_idle_timeout": 600,
            **_settings_from_environment(), **settings,
        }
        self.process: subprocess.Popen | None = None
        self.port = 0

    def _socket(self) -> Path | None:
        path = self.database_url.query.get("unix_sock")
        return Path(str(path)) if path else None

    def _target(self) -> str:
        url, path = self.database_url, self._socket()
        if path is not None:  # the embedded server: a directory and the port in the socket's name
            return f"host={path.parent} port={path.name.rsplit('.', 1)[-1]}"
        return f"host={url.host or '127.0.0.1'} port={url.port or 5432}"

    def _write_files(self) -> Path:
        user = self.database_url.username or "postgres"
        (self.directory / "userlist.txt").write_text(f'"{user}" ""\n')
        lines = ["[databases]", f"* = {self._target()}", "", "[pgbouncer]", f"listen_port = {self.port}"]
        lines += [f"{key} = {value}" for key, value in self.settings.items()]
        ini = self.directory / "pgbouncer.ini"
        ini.write_text("\n".join(lines) + "\n")
        for path in (ini, self.directory / "userlist.txt"):
            path.chmod(0o644)
        return ini

    def start(self) -> "PgBouncer":
        """Start it on a free port (another one when the port was taken meanwhile)."""
        for _ in range(5):
            self.port = free_port()
            ini = self._write_files()
            socket_path = self._socket()
            user = _unprivileged_user(socket_path.parent if socket_path else None)
            log = (self.directory / "pgbouncer.log").open("ab")
            self.process = subprocess.Popen([self.binary, *(["-u", user] if user else []), str(ini)],
                                            stdout=log, stderr=subprocess.STDOUT)
            log.close()
            if self._listening():
                return self
            self.process.wait(5)
            self.process = None
            if "Address already in use" not in self.log():
                break
        raise AssertionError(f"pgbouncer did not start:\n{self.log()[-3000:]}")

    def _listening(self) -> bool:
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up:
            if self.process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                time.sleep(0.02)
        raise AssertionError(f"pgbouncer did not listen within 10 s:\n{self.log()[-3000:]}")

    def warm(self, database: str) -> None:
        """Open the `pool_size` server connections of `database`'s pool (one pool per
        database and user): as many transactions at once."""
        import pg8000.dbapi

        clients = [pg8000.dbapi.connect(user=self.database_url.username or "postgres", host="127.0.0.1",
                                        port=self.port, database=database, timeout=10)
                   for _ in range(self.pool_size)]
        try:
            for client in clients:
                client.cursor().execute("SELECT 1")  # pg8000 opens a transaction first
            for client in clients:
                client.rollback()
        finally:
            for client in clients:
                client.close()

    def url(self, database_url: str | None = None) -> str:
        """`database_url` (default: the one given) through this pooler."""
        url = make_url(database_url) if database_url else self.database_url
        url = url.set(host="127.0.0.1", port=self.port, query={k: v for k, v in url.query.items() if k != "unix_sock"})
        return url.render_as_string(hide_password=False)

    def show(self, what: str) -> list[dict[str, Any]]:
        """The admin console's `SHOW what` (POOLS, STATS, SERVERS, …) as dicts."""
        import pg8000.dbapi

        admin = pg8000.dbapi.connect(user=self.database_url.username or "postgres", host="127.0.0.1",
                                     port=self.port, database="pgbouncer", timeout=10)
        admin.autocommit = True  # the console takes no BEGIN
        try:
            cursor = admin.cursor()
            cursor.execute(f"SHOW {what}")
            names = [c[0] for c in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]
        finally:
            admin.close()

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to its own pid (an immediate shutdown), then wait for it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None
