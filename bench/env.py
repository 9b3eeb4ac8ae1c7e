"""Where the benchmark runs: its own database and Redis key prefix, the machine,
and CPU accounting of the three processes involved (this Python process, the
PostgreSQL backend serving it, the Redis server).

The benchmark never touches another database: it creates `outbox_bench` (or
`--database-name`), migrates it with the project's migrations, empties it
between scenarios (TRUNCATE) and drops it at the end unless `--keep`. Redis
keys are written only under the stream prefix (default `bench.`), and removed
before and after each scenario.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

import redis as redis_lib
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from outbox_migrations import upgrade
from outbox_relay.producer import enqueue_events_bulk
from outbox_tools.servers import Servers, create_database, drop_database, find_servers, with_database

from . import payloads

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class BenchEnv:
    """The servers, the bench database and the Redis prefix of one benchmark run."""

    servers: Servers
    database_name: str
    prefix: str
    keep: bool = False
    admin_url: str = ""
    database_url: str = ""
    _engine: Engine | None = field(default=None, repr=False)
    _redis: redis_lib.Redis | None = field(default=None, repr=False)

    @classmethod
    @contextlib.contextmanager
    def open(cls, *, database_name: str = "outbox_bench", prefix: str = "bench.",
             keep: bool = False) -> Iterator["BenchEnv"]:
        """Find the servers (DATABASE_URL / REDIS_URL, else the local services,
        else embedded ones), create and migrate the bench database, and clean
        up afterwards (database dropped unless `keep`, prefix keys removed)."""
        if not database_name.replace("_", "").isalnum():
            raise ValueError(f"database name must be letters, digits and underscores: {database_name!r}")
        if not prefix or "*" in prefix or "?" in prefix or "[" in prefix:
            raise ValueError(f"prefix must be non-empty and free of glob characters: {prefix!r}")
        servers = find_servers()
        env = cls(servers, database_name, prefix, keep)
        env.admin_url = servers.database_url
        env.database_url = with_database(servers.database_url, database_name)
        try:
            drop_database(env.admin_url, database_name)
            create_database(env.admin_url, database_name)
            engine = create_engine(env.database_url, poolclass=NullPool)
            upgrade(engine)
            engine.dispose()
            env.clean_redis()
            yield env
        finally:
            env.clean_redis()
            env.close()
            if not keep:
                drop_database(env.admin_url, database_name)
            servers.close()

    # --- PostgreSQL -------------------------------------------------------
    @property
    def engine(self) -> Engine:
        """An autocommit engine on the bench database, for setup and checks (not the relay's)."""
        if self._engine is None:
            self._engine = create_engine(self.database_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        return self._engine

    def reset_table(self) -> None:
        """Empty the outbox (TRUNCATE, identity restarted): each scenario starts from clean tables.
        The history is named too: the trigger would DELETE it, leaving its pages behind."""
        with self.engine.connect() as conn:
            conn.execute(text("TRUNCATE outbox_message, outbox_message_body, outbox_message_history RESTART IDENTITY"))

    def vacuum_analyze(self) -> None:
        """VACUUM ANALYZE the outbox, as autovacuum would have done on a maintained server."""
        with self.engine.connect() as conn:
            conn.execute(text("VACUUM ANALYZE outbox_message"))

    def enqueue(self, n: int, *, streams: tuple[str, ...] = payloads.STREAMS[:1], seed: int = 6,
                chunk: int = 5000, keys: int | None = None,
                edit: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None) -> float:
        """Enqueue `n` ~1 KB events through the producer API (`enqueue_events_bulk`),
        in transactions of `chunk` messages, keyless or over `keys` ordering keys;
        `edit(i, event)`, when given, returns the i-th event to write instead.
        Returns the seconds it took."""
        started = time.perf_counter()
        engine = create_engine(self.database_url, poolclass=NullPool)
        try:
            batch: list[dict[str, Any]] = []
            for i, event in enumerate(payloads.events(n, seed=seed, streams=streams, prefix=self.prefix, keys=keys)):
                batch.append(edit(i, event) if edit is not None else event)
                if len(batch) >= chunk:
                    with engine.begin() as conn:
                        enqueue_events_bulk(conn, batch)
                    batch = []
            if batch:
                with engine.begin() as conn:
                    enqueue_events_bulk(conn, batch)
        finally:
            engine.dispose()
        return time.perf_counter() - started

    def counts(self) -> dict[str, int]:
        """Rows per status."""
        with self.engine.connect() as conn:
            return {s: n for s, n in conn.execute(text("SELECT status, count(*) FROM outbox_message GROUP BY status"))}

    def backend_pids(self, application_name: str = "outbox-relay") -> list[int]:
        """Backend pids of the bench database's connections named `application_name`
        whose processes run on this host (`is_local_backend`); empty when any of
        them does not, so no figure is read from an unrelated process."""
        with self.engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT pid, EXTRACT(EPOCH FROM backend_start)::float8 FROM pg_stat_activity "
                "WHERE datname = :d AND application_name = :a"),
                {"d": self.database_name, "a": application_name}).all()
        if not all(started is not None and is_local_backend(pid, started) for pid, started in rows):
            return []
        return [pid for pid, _ in rows]

    def server_versions(self) -> dict[str, str]:
        with self.engine.connect() as conn:
            pg = conn.execute(text("SHOW server_version")).scalar_one()
            settings = {name: value for name, value in conn.execute(text(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN "
                "('shared_buffers', 'synchronous_commit', 'autovacuum', 'max_wal_size', 'jit')"))}
        info = self.redis.info("server")
        return {"postgresql": str(pg), "redis": str(info.get("redis_version")), "postgresql_settings": settings}

    # --- Redis ------------------------------------------------------------
    @property
    def redis(self) -> redis_lib.Redis:
        if self._redis is None:
            self._redis = redis_lib.Redis.from_url(self.servers.redis_url, decode_responses=True)
        return self._redis

    def clean_redis(self) -> int:
        """Delete every key under the prefix (streams and their `{stream}:outbox-dedupe:…` keys)."""
        client = self.redis
        removed = 0
        for pattern in (f"{self.prefix}*", f"{{{self.prefix}*"):
            keys: list[str] = []
            for key in client.scan_iter(match=pattern, count=2000):
                keys.append(key)
                if len(keys) >= 1000:
                    removed += client.unlink(*keys)
                    keys = []
            if keys:
                removed += client.unlink(*keys)
        return removed

    def stream_names(self) -> list[str]:
        return sorted(k for k in self.redis.scan_iter(match=f"{self.prefix}*", count=2000)
                      if self.redis.type(k) == "stream")

    def stream_entries(self, stream: str) -> Iterator[dict[str, str]]:
        """The fields of every entry of `stream`, in stream order, read in pages."""
        last = "-"
        while True:
            entries = self.redis.xrange(stream, min=last, max="+", count=5000)
            if last != "-":
                entries = entries[1:]
            if not entries:
                return
            yield from (fields for _, fields in entries)
            last = entries[-1][0]

    def stream_message_ids(self) -> list[str]:
        """The `id` field (outbox message id) of every entry of every bench stream."""
        return [fields["id"] for stream in self.stream_names() for fields in self.stream_entries(stream)]

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None


# --- CPU accounting -------------------------------------------------------

def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a local process from /proc (None when not readable,
    e.g. PostgreSQL on another host)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


def is_local_backend(pid: int, backend_start_epoch: float) -> bool:
    """Whether `pid`, a backend pid PostgreSQL reported (`pg_stat_activity`), is
    that backend's process on this host: a process named "postgres" that started
    when the backend did (within 2 s). With the server on another host or in a
    container (its own pid numbers), the same number may belong to an unrelated
    local process, whose CPU must not be reported as the backend's."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "postgres":
                return False
        with open(f"/proc/{pid}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return False
    return abs(boot + start_ticks / _TICKS - backend_start_epoch) < 2.0


def redis_cpu_seconds(client: redis_lib.Redis) -> float | None:
    """CPU seconds the Redis server has used (INFO cpu: user + sys)."""
    try:
        info = client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    except Exception:
        return None


class CpuMeter:
    """CPU used during a block by this process, given PostgreSQL backends and Redis."""

    def __init__(self, backend_pids: Iterable[int], redis_client: redis_lib.Redis) -> None:
        self.pids = list(backend_pids)
        self.redis = redis_client
        self.result: dict[str, float | None] = {}

    def _pg(self) -> float | None:
        values = [process_cpu_seconds(p) for p in self.pids]
        if not values or any(v is None for v in values):
            return None
        return sum(v for v in values if v is not None)

    def __enter__(self) -> "CpuMeter":
        self._client0 = time.process_time()
        self._pg0 = self._pg()
        self._redis0 = redis_cpu_seconds(self.redis)
        return self

    def __exit__(self, *exc: Any) -> None:
        pg1, redis1 = self._pg(), redis_cpu_seconds(self.redis)
        self.result = {
            "client": time.process_time() - self._client0,
            "postgresql": (pg1 - self._pg0) if pg1 is not None and self._pg0 is not None else None,
            "redis": (redis1 - self._redis0) if redis1 is not None and self._redis0 is not None else None,
        }

    def per_message_us(self, n: int) -> dict[str, float | None]:
        """CPU microseconds per message for each process (None where unknown)."""
        return {k: (round(v / n * 1e6, 1) if v is not None and n else None) for k, v in self.result.items()}


# --- the machine ----------------------------------------------------------

def machine_info() -> dict[str, Any]:
    """nproc, CPU model, memory, OS, Python and library versions, and the load
    average when the run started (other work on the machine skews wall-clock figures)."""
    cpu_model = platform.processor() or "unknown"
    mem_total_mb = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_total_mb = int(line.split()[1]) // 1024
                    break
    except OSError:
        pass
    import pg8000
    import redis
    import sqlalchemy

    try:
        load = os.getloadavg()
    except OSError:
        load = None
    try:
        from importlib.metadata import version

        pg8000_version = version("pg8000")
    except Exception:
        pg8000_version = getattr(pg8000, "__version__", "unknown")
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_mb": mem_total_mb,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "sqlalchemy": sqlalchemy.__version__,
        "pg8000": pg8000_version,
        "redis_py": redis.__version__,
        "load_average_at_start": [round(x, 2) for x in load] if load else None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
