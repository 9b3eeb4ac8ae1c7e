"""Cost as delivered history grows, on a PostgreSQL of the bench's own with autovacuum on.

For each count of `--delivered` rows (default 10,000 and 10,000,000), on an emptied
outbox: the delivered history is seeded in bulk (INSERT ... SELECT generate_series,
small payloads, spread evenly over the retention window of `DAYS` days, UUIDv7 ids
made from each row's time, a retry in the history of one message in `HISTORY_EVERY`),
then VACUUM ANALYZE (a maintained server's history was vacuumed long ago) and a
CHECKPOINT, and then:

- the size on disk of each table with its indexes;
- claim: `claims` timed `LeaseStore.claim` of `claim_batch` with `pending` rows pending
  (after a tenth as many untimed), each claim's rows recorded delivered and as many
  new ones inserted between claims, untimed; its EXPLAIN is checked;
- enqueue: `enqueues` producer-API enqueues of one ~1 KB event per transaction;
- drain: one drain-mode invocation (this process, batch 1,000) over `drain` messages;
- retention: today's purge (the maintenance function's DELETE path, `operations.purge`)
  of the oldest day of history while a producer enqueues one message per transaction:
  time, WAL bytes (pg_current_wal_lsn before and after), dead rows left in the three
  tables (pg_stat_user_tables.n_dead_tup two seconds after, and whether autovacuum had
  run by then), the longest enqueue during the purge, and then the VACUUM those dead rows
  call for (time, WAL).

Ratios compare the largest count with the smallest, measured in the same run.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any, Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from outbox_migrations import upgrade
from outbox_relay import sql
from outbox_relay.config import load_settings
from outbox_relay.db import create_relay_engine
from outbox_relay.models import Outcome, OutcomeKind
from outbox_relay.operations.purge import count_purge, purge
from outbox_relay.producer import enqueue_events_bulk
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore
from outbox_tools.servers import Servers, _embedded_postgres, create_database, with_database

from . import payloads
from .drain import DRAIN_ENV, checkpoint, warm
from .env import BenchEnv, percentile

DAYS = 7  # the template's default delivered retention
HISTORY_EVERY = 20
TABLES = ("outbox_message", "outbox_message_body", "outbox_message_history")
#: The bench server's settings: autovacuum on (the shared test server runs with it off), room for the seeding's WAL.
SERVER_SETTINGS = {"autovacuum": "on", "shared_buffers": "256MB", "max_wal_size": "4GB", "listen_addresses": "",
                   "max_connections": "40"}

_ROWS = """
    SELECT g, CAST(:base AS bigint) + g AS seq, h,
           CASE WHEN CAST(:status AS text) = 'delivered'
                THEN now() - interval '1 second'
                     - make_interval(secs => CAST(:span AS float8) * (1 - (g - 0.5) / CAST(:total AS bigint)))
                ELSE now() - interval '1 minute' END AS at
      FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS g,
           LATERAL (SELECT md5(g::text || CAST(:salt AS text)) AS h) r
"""
# UUIDv7 (RFC 9562): the row's Unix milliseconds, version 7, random bits with the variant 10.
_ID = ("(lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) "
       "|| '8' || substr(h, 4, 15))::uuid")
SEED_BODIES = text(f"""
    INSERT INTO outbox_message_body (seq, message_id, payload) OVERRIDING SYSTEM VALUE
    SELECT seq, {_ID}, json_build_object('order', g, 'total', mod(g, 997)) FROM ({_ROWS}) s
""")
SEED_MESSAGES = text(f"""
    INSERT INTO outbox_message (seq, message_id, channel, destination, type, key, payload_bytes, status, attempts,
                                available_at, created_at, delivered_at, delivery_ref)
    SELECT seq, {_ID}, 'redis', CAST(:stream AS text), 'order.placed', 'customer-' || mod(g, 10000),
           octet_length(json_build_object('order', g, 'total', mod(g, 997))::text),
           CAST(:status AS text), CASE WHEN CAST(:status AS text) = 'delivered' THEN 1 ELSE 0 END, at, at,
           CASE WHEN CAST(:status AS text) = 'delivered' THEN at + interval '1 second' END,
           CASE WHEN CAST(:status AS text) = 'delivered' THEN '1700000000000-' || seq END
      FROM ({_ROWS}) s
""")
SEED_HISTORY = text(f"""
    INSERT INTO outbox_message_history (seq, at, event, attempt, error_class, error, next_at)
    SELECT seq, at, 'retry', 1, 'transient', 'connection reset', at + interval '1 second'
      FROM ({_ROWS}) s WHERE mod(g, {HISTORY_EVERY}) = 0
""")
NEXT_SEQ = text("SELECT coalesce(max(seq), 0) FROM outbox_message_body")
SET_SEQ = text("SELECT setval(pg_get_serial_sequence('outbox_message_body', 'seq'), :seq)")
SIZES = text("SELECT relname, pg_table_size(relid), pg_indexes_size(relid) FROM pg_stat_user_tables "
              "WHERE relname = ANY(:tables) ORDER BY relname")
INDEX_SIZES = text("SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes "
                   "WHERE relname = ANY(:tables) ORDER BY indexrelname")
DEAD = text("SELECT relname, n_dead_tup, autovacuum_count FROM pg_stat_user_tables WHERE relname = ANY(:tables)")
WAL_LSN = text("SELECT pg_current_wal_lsn()::text")
WAL_BYTES = text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:lsn AS pg_lsn))::bigint")


# ------------------------------------------------------------------ the server

def _bindir() -> str | None:
    """The machine's PostgreSQL binaries (`pg_config --bindir`), when they include a server."""
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip()
    have = all(os.access(os.path.join(found, b), os.X_OK) for b in ("initdb", "postgres"))
    return found if have else None


@contextlib.contextmanager
def own_postgres() -> Iterator[str]:
    """A PostgreSQL of the bench's own in a temporary directory, reached over its socket
    there: the machine's binaries, else the embedded server (`outbox_tools.servers`).
    Yields the admin URL; the server is stopped and its directory removed afterwards."""
    bindir = _bindir()
    if bindir is None:
        cleanup: list[Any] = []
        try:
            url = _embedded_postgres(cleanup)
            _apply_settings(url)
            yield url
        finally:
            Servers("", "", "", "", cleanup).close()
        return
    workdir = tempfile.mkdtemp(prefix="outbox-growth-")
    owner: dict[str, int] = {}
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        nobody = pwd.getpwnam("nobody")
        os.chown(workdir, nobody.pw_uid, nobody.pw_gid)
        owner = {"user": nobody.pw_uid, "group": nobody.pw_gid}
    data = os.path.join(workdir, "data")
    server = None
    try:
        subprocess.run([os.path.join(bindir, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8"],
                       check=True, capture_output=True, **owner)
        options = [a for k, v in SERVER_SETTINGS.items() for a in ("-c", f"{k}={v}")]
        with open(os.path.join(workdir, "log"), "wb") as log:
            server = subprocess.Popen([os.path.join(bindir, "postgres"), "-D", data, "-k", workdir, *options],
                                      stdout=log, stderr=log, **owner)
        url = f"postgresql+pg8000://postgres@/postgres?unix_sock={workdir}/.s.PGSQL.5432"
        _wait_ready(url, server)
        yield url
    finally:
        if server is not None:
            server.send_signal(2)  # SIGINT: fast shutdown
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_ready(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            engine = create_engine(url, poolclass=NullPool)
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            engine.dispose()
            return
        except Exception:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the growth bench's PostgreSQL did not start") from None
            time.sleep(0.2)


def _apply_settings(url: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as conn:
        for name in ("autovacuum", "max_wal_size"):
            conn.execute(text(f"ALTER SYSTEM SET {name} = '{SERVER_SETTINGS[name]}'"))
        conn.execute(text("SELECT pg_reload_conf()"))
    engine.dispose()


@contextlib.contextmanager
def growth_env(env: BenchEnv) -> Iterator[BenchEnv]:
    """A `BenchEnv` on the bench's own PostgreSQL (its database migrated) and `env`'s Redis and prefix."""
    with own_postgres() as admin_url:
        create_database(admin_url, env.database_name)
        own = BenchEnv(Servers(admin_url, env.servers.redis_url, "bench", env.servers.redis_source),
                       env.database_name, env.prefix, admin_url=admin_url,
                       database_url=with_database(admin_url, env.database_name))
        engine = create_engine(own.database_url, poolclass=NullPool)
        upgrade(engine)
        engine.dispose()
        try:
            yield own
        finally:
            own.close()


# ------------------------------------------------------------------ seeding

def _insert(conn: Any, *, status: str, n: int, stream: str, chunk: int = 1_000_000) -> None:
    """`n` rows of `status` with their bodies (and some history), in statements of `chunk`."""
    base = conn.execute(NEXT_SEQ).scalar_one()
    salt = str(time.time_ns())
    for lo in range(1, n + 1, chunk):
        params = {"base": base, "lo": lo, "hi": min(n, lo + chunk - 1), "total": n, "span": DAYS * 86400.0,
                  "status": status, "salt": salt, "stream": stream}
        conn.execute(SEED_BODIES, params)
        conn.execute(SEED_MESSAGES, params)
        if status == "delivered":
            conn.execute(SEED_HISTORY, params)
    conn.execute(SET_SEQ, {"seq": base + n})


def _seed(env: BenchEnv, *, delivered: int, pending: int, stream: str) -> float:
    """Empty the outbox, seed `delivered` rows over the last `DAYS` days and `pending` due ones,
    VACUUM ANALYZE; the seconds it took."""
    started = time.perf_counter()
    env.reset_table()
    with env.engine.connect() as conn:
        if delivered:
            _insert(conn, status="delivered", n=delivered, stream=stream)
        if pending:
            _insert(conn, status="pending", n=pending, stream=stream)
        conn.execute(text("VACUUM ANALYZE " + ", ".join(TABLES)))
    return time.perf_counter() - started


def sizes(env: BenchEnv) -> dict[str, Any]:
    """Bytes on disk of each table (heap and TOAST) and of its indexes, and the database's."""
    with env.engine.connect() as conn:
        rows = conn.execute(SIZES, {"tables": list(TABLES)}).all()
        indexes = dict(conn.execute(INDEX_SIZES, {"tables": list(TABLES)}).all())
        database = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    tables = {name: {"table_bytes": t, "index_bytes": i} for name, t, i in rows}
    return {"tables": tables, "indexes": indexes, "total_bytes": sum(t + i for _, t, i in rows),
            "database_bytes": database}


# ------------------------------------------------------------------ measurements

def _plan_nodes(plan: dict) -> list[dict]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _plan_nodes(child)
    return nodes


def claim_plan(env: BenchEnv, limit: int) -> dict[str, Any]:
    """EXPLAIN (not executed) of the claim: indexes used per scan, and no Seq Scan of the outbox."""
    params = LeaseStore(env.engine, Channel.REDIS, default_max_attempts=10).claim_parameters("explain", limit, 120.0)
    with env.engine.connect() as conn:
        (raw,) = conn.execute(text("EXPLAIN (FORMAT JSON) " + sql.relay.claim.text), params).one()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    scans = [n for n in _plan_nodes(plan) if n.get("Relation Name") == "outbox_message"]
    indexes = sorted({n.get("Index Name") for n in scans if n.get("Index Name")})
    seq_scans = [n for n in scans if n["Node Type"] == "Seq Scan"]
    needed = {"outbox_message_pending_due_idx", "outbox_message_lease_expiry_idx"}
    return {"scans": [f"{n['Node Type']} {n.get('Index Name') or ''}".strip() for n in scans],
            "indexes": indexes, "ok": needed <= set(indexes) and not seq_scans}


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _spread(latencies: list[float]) -> dict[str, float]:
    return {"median_ms": round(percentile(latencies, 50), 3), "p99_ms": round(percentile(latencies, 99), 3),
            "max_ms": round(max(latencies), 3)}


def measure_claims(env: BenchEnv, *, claims: int, claim_batch: int, stream: str) -> dict[str, Any]:
    settings = load_settings(database_url=env.database_url, redis_url=env.servers.redis_url)
    engine = create_relay_engine(settings)
    store = LeaseStore(engine, Channel.REDIS, default_max_attempts=settings.max_attempts)
    latencies: list[float] = []
    warmup = max(1, claims // 10)  # untimed first claims: connection and caches warm, as in a live relay
    try:
        store.oldest_pending_age_seconds()  # connect before timing
        for i in range(warmup + claims):
            owner = f"bench-growth-{i}"
            started = time.perf_counter()
            claimed = store.claim(owner, claim_batch, 120.0).messages
            if i >= warmup:
                latencies.append(_ms(started))
            if not claimed:
                raise RuntimeError(f"growth: claim {i} found nothing to claim")
            store.record(owner, [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1-0") for m in claimed])
            with env.engine.connect() as conn:
                _insert(conn, status="pending", n=len(claimed), stream=stream)
    finally:
        engine.dispose()
    return _spread(latencies)


class Producer:
    """Enqueues one ~1 KB event per transaction through the producer API, timing each,
    `count` times or, as a thread, until stopped."""

    def __init__(self, env: BenchEnv, *, count: int | None = None, seed: int = 65) -> None:
        self.engine = create_engine(env.database_url, pool_size=1)
        self.events = payloads.events(count or 10_000_000, seed=seed, prefix=env.prefix)
        self.count, self.latencies = count, []  # type: list[float]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.engine.begin() as conn:  # connect before timing
                conn.execute(text("SELECT 1"))
            for i, event in enumerate(self.events):
                if self.stop.is_set() or (self.count is not None and i >= self.count):
                    break
                started = time.perf_counter()
                with self.engine.begin() as conn:
                    enqueue_events_bulk(conn, [event])
                self.latencies.append(_ms(started))
        except BaseException as exc:  # reported by `finish`, never lost in the thread
            self.error = exc
        finally:
            self.engine.dispose()

    def finish(self) -> list[float]:
        """Stop the thread (when started) and return the latencies."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"growth producer failed: {self.error}")
        return self.latencies


def measure_drain(env: BenchEnv, *, n: int, batch_size: int = 1000) -> dict[str, Any]:
    from .handler import relay

    with relay(env, batch_size, timeout_seconds=600, extra_env=DRAIN_ENV) as r:
        before = env.counts().get("delivered", 0)
        env.enqueue(n, seed=64)
        warm(r)
        started = time.perf_counter()
        result = r.invoke()
        wall = time.perf_counter() - started
    delivered_rows = env.counts().get("delivered", 0) - before
    return {"messages": n, "delivered": result["delivered"], "wall_seconds": round(wall, 3),
            "messages_per_second": round(result["delivered"] / wall, 1),
            "ok": result["delivered"] == n == delivered_rows}


def _dead(env: BenchEnv) -> dict[str, tuple[int, int]]:
    with env.engine.connect() as conn:
        return {name: (dead, runs) for name, dead, runs in conn.execute(DEAD, {"tables": list(TABLES)})}


def measure_retention(env: BenchEnv) -> dict[str, Any]:
    """Today's purge of the oldest day of history, a producer enqueuing throughout."""
    window = (DAYS - 1) * 86400.0
    settings = load_settings(database_url=env.database_url, redis_url=env.servers.redis_url)
    engine = create_relay_engine(settings)
    try:
        due = count_purge(engine, delivered_older_than_seconds=window)["delivered"]
        with env.engine.connect() as conn:
            before = conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one()
            lsn = conn.execute(WAL_LSN).scalar_one()
        dead_before = _dead(env)
        producer = Producer(env)
        producer.thread.start()
        time.sleep(0.5)  # the producer is enqueuing before the purge starts
        started = time.perf_counter()
        result = purge(engine, delivered_older_than_seconds=window)
        seconds = time.perf_counter() - started
        during = producer.finish()
        with env.engine.connect() as conn:
            wal = conn.execute(WAL_BYTES, {"lsn": lsn}).scalar_one()
            after = conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one()
    finally:
        engine.dispose()
    time.sleep(2.0)  # backends report their statistics within a second of going idle
    dead_after = _dead(env)
    with env.engine.connect() as conn:  # the vacuum those dead rows call for, now rather than at autovacuum's pace
        lsn = conn.execute(WAL_LSN).scalar_one()
        started = time.perf_counter()
        conn.execute(text("VACUUM " + ", ".join(TABLES)))
        vacuum_seconds = time.perf_counter() - started
        vacuum_wal = conn.execute(WAL_BYTES, {"lsn": lsn}).scalar_one()
    return {
        "window_days": DAYS, "due": due, "purged": result.delivered, "batches": result.batches,
        "rows_before": before, "rows_after": after, "seconds": round(seconds, 2), "wal_bytes": wal,
        "wal_bytes_per_row": round(wal / result.delivered, 1) if result.delivered else None,
        "dead_rows": {t: dead_after[t][0] for t in TABLES},
        "dead_rows_before": {t: dead_before[t][0] for t in TABLES},
        "autovacuum_ran": {t: dead_after[t][1] > dead_before[t][1] for t in TABLES},
        "vacuum_seconds": round(vacuum_seconds, 2), "vacuum_wal_bytes": vacuum_wal,
        "producer": {"enqueues": len(during), **(_spread(during) if during else {})},
        # rows keep ageing past the window while the purge runs
        "ok": result.delivered >= due > 0 and result.complete and after == before + len(during) - result.delivered,
    }


def measure_case(env: BenchEnv, *, delivered: int, pending: int, claims: int, claim_batch: int, enqueues: int,
                 drain: int, stream: str) -> dict[str, Any]:
    seed_seconds = _seed(env, delivered=delivered, pending=pending, stream=stream)
    plan = claim_plan(env, claim_batch)
    checkpoint(env)  # every case starts right after a checkpoint, not in one the seeding set off
    with env.engine.connect() as conn:
        present = conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one()
        history = conn.execute(text("SELECT count(*) FROM outbox_message_history")).scalar_one()
    case = {"case": f"{delivered:,} delivered", "delivered": delivered, "rows": present, "pending": pending,
            "history_rows": history, "seed_seconds": round(seed_seconds, 1), "size": sizes(env), "plan": plan}
    case |= measure_claims(env, claims=claims, claim_batch=claim_batch, stream=stream)
    producer = Producer(env, count=enqueues)
    producer.run()
    case["enqueue"] = _spread(producer.finish())
    case["drain"] = measure_drain(env, n=drain)
    case["retention"] = measure_retention(env)
    case["size_after_purge"] = sizes(env)
    return case


def run_growth(env: BenchEnv, *, delivered: list[int], pending: int, claims: int, claim_batch: int,
               enqueues: int, drain: int) -> dict[str, Any]:
    """One case per count of `delivered` rows, smallest first, on the bench's own PostgreSQL."""
    stream = env.prefix + "growth"
    counts = sorted(set(delivered))
    started_load = os.getloadavg()
    with growth_env(env) as own:
        with own.engine.connect() as conn:
            settings = {k: v for k, v in conn.execute(text(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name IN "
                "('autovacuum', 'shared_buffers', 'max_wal_size', 'server_version')"))}
        cases = [measure_case(own, delivered=d, pending=pending, claims=claims, claim_batch=claim_batch,
                              enqueues=enqueues, drain=drain, stream=stream) for d in counts]
        own.clean_redis()
    small, large = cases[0], cases[-1]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    return {
        "server": settings, "load_average": [round(x, 2) for x in started_load], "days": DAYS,
        "claims": claims, "claim_batch": claim_batch, "enqueues": enqueues, "drain_messages": drain,
        "cases": cases, "plans_ok": all(c["plan"]["ok"] for c in cases),
        "claim_p99_ratio": ratio(large["p99_ms"], small["p99_ms"]),
        "enqueue_p99_ratio": ratio(large["enqueue"]["p99_ms"], small["enqueue"]["p99_ms"]),
        "drain_ratio": ratio(large["drain"]["messages_per_second"], small["drain"]["messages_per_second"]),
        "check": {"ok": all(c["drain"]["ok"] and c["retention"]["ok"] for c in cases)},
    }
