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
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from outbox_migrations import upgrade
from outbox_relay import sql
from outbox_relay.config import load_settings
from outbox_relay.db import create_relay_engine
from outbox_relay.models import Outcome, OutcomeKind
from outbox_relay.operations.partitions import MARGIN_DAYS, _sqlstate, manage_days
from outbox_relay.operations.purge import purge
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
#: The bench server's settings: autovacuum on (the shared test server runs with it off), room for the seeding's WAL,
#: and connections for catch-up's and autoscale's pollers, their successors and the warm containers' pools.
SERVER_SETTINGS = {"autovacuum": "on", "shared_buffers": "256MB", "max_wal_size": "4GB", "listen_addresses": "",
                   "max_connections": "100"}

# Each row's time: spread evenly over the `span` seconds before `newest` (epoch seconds; none: a
# second ago by the database's clock), or a minute ago for pending rows.
_ROWS = """
    SELECT g, seq, at, id, outbox_id_day(id) AS day FROM (
        SELECT g, seq, at, (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
                            || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid AS id FROM (
            SELECT g, CAST(:base AS bigint) + g AS seq, md5(g::text || CAST(:salt AS text)) AS h,
                   CASE WHEN CAST(:status AS text) = 'delivered'
                        THEN coalesce(to_timestamp(CAST(:newest AS float8)), now() - interval '1 second')
                             - make_interval(secs => CAST(:span AS float8) * (1 - (g - 0.5) / CAST(:total AS bigint)))
                        ELSE now() - interval '1 minute' END AS at
              FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS g) r) i
"""
# Ids are UUIDv7 (RFC 9562) of each row's millisecond, and each row sits in its id's day
# (`outbox_id_day`: that day's partitions when open, else day 0), as the producers place them.
# Small payloads, or padded to `pad` characters more (the soak's days: as large as the producers').
_PAYLOAD = ("(CASE WHEN CAST(:pad AS int) > 0 THEN json_build_object('order', g, 'total', mod(g, 997), 'pad', "
            "repeat('x', CAST(:pad AS int))) ELSE json_build_object('order', g, 'total', mod(g, 997)) END)")
SEED_BODIES = text(f"""
    INSERT INTO outbox_message_body (seq, message_id, payload, day)
    SELECT seq, id, {_PAYLOAD}, day FROM ({_ROWS}) s
""")
SEED_MESSAGES = text(f"""
    INSERT INTO outbox_message (seq, message_id, channel, destination, type, key, payload_bytes, status, attempts,
                                available_at, created_at, delivered_at, delivery_ref, day)
    SELECT seq, id, 'redis', CAST(:stream AS text), 'order.placed', 'customer-' || mod(g, 10000),
           octet_length({_PAYLOAD}::text),
           CAST(:status AS text), CASE WHEN CAST(:status AS text) = 'delivered' THEN 1 ELSE 0 END, at, at,
           CASE WHEN CAST(:status AS text) = 'delivered' THEN at + interval '1 second' END,
           CASE WHEN CAST(:status AS text) = 'delivered' THEN '1700000000000-' || seq END, day
      FROM ({_ROWS}) s
""")
SEED_HISTORY = text(f"""
    INSERT INTO outbox_message_history (seq, at, event, attempt, error_class, error, next_at, day)
    SELECT seq, at, 'retry', 1, 'transient', 'connection reset', at + interval '1 second', day
      FROM ({_ROWS}) s WHERE mod(g, {HISTORY_EVERY}) = 0
""")
#: Days since the epoch, by the database's clock.
TODAY = text("SELECT floor(extract(epoch FROM now()) / 86400)::int")
OPEN_DAYS = text("SELECT count(*) FILTER (WHERE outbox_open_day(d)) FROM generate_series(CAST(:lo AS int), "
                 "CAST(:hi AS int)) d")
NEXT_SEQ = text("SELECT coalesce(max(seq), 0) FROM outbox_message_body")
SET_SEQ = text("SELECT setval(pg_get_serial_sequence('outbox_message_body', 'seq'), :seq)")
# Each table is the sum of its partitions (pg_partition_tree); an index of a partitioned table
# is named by its root index.
SIZES = text("SELECT t, sum(pg_table_size(p.relid)), sum(pg_indexes_size(p.relid)) "
             "FROM unnest(CAST(:tables AS text[])) t, pg_partition_tree(t::regclass) p WHERE p.isleaf "
             "GROUP BY t ORDER BY t")
INDEX_SIZES = text("SELECT coalesce(pg_partition_root(i.indexrelid)::regclass::text, i.indexrelname), "
                   "sum(pg_relation_size(i.indexrelid)) "
                   "FROM unnest(CAST(:tables AS text[])) t, pg_partition_tree(t::regclass) p "
                   "JOIN pg_stat_user_indexes i ON i.relid = p.relid WHERE p.isleaf GROUP BY 1 ORDER BY 1")
DEAD = text("SELECT t, coalesce(sum(s.n_dead_tup), 0), coalesce(sum(s.autovacuum_count), 0) "
            "FROM unnest(CAST(:tables AS text[])) t, pg_partition_tree(t::regclass) p "
            "JOIN pg_stat_user_tables s ON s.relid = p.relid WHERE p.isleaf GROUP BY t")
#: Bytes of the three tables with their indexes and TOAST, and their partitions (leaves).
TOTAL = text("SELECT sum(pg_total_relation_size(p.relid)), count(*) "
             "FROM unnest(CAST(:tables AS text[])) t, pg_partition_tree(t::regclass) p WHERE p.isleaf")
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

def _insert(conn: Any, *, status: str, n: int, stream: str, chunk: int = 1_000_000, span: float = DAYS * 86400.0,
            newest: float | None = None, pad: int = 0) -> None:
    """`n` rows of `status` with their bodies (and some history), in statements of `chunk`;
    delivered ones spread over the `span` seconds before `newest` (epoch seconds; none: now).
    Seeding is PostgreSQL's CPU, one statement a core: with more chunks than one, each core's
    connection takes a contiguous run of them in time order, as producers append."""
    base = conn.execute(NEXT_SEQ).scalar_one()
    salt = str(time.time_ns())
    chunks = [(lo, min(n, lo + chunk - 1)) for lo in range(1, n + 1, chunk)]

    stop = threading.Event()  # set when the caller stops (Ctrl-C): the other connections stop after their chunk

    def seed(c: Any, part: list[tuple[int, int]]) -> None:
        for lo, hi in part:
            if stop.is_set():
                return
            params = {"base": base, "lo": lo, "hi": hi, "total": n, "span": span, "newest": newest,
                      "status": status, "salt": salt, "stream": stream, "pad": pad}
            c.execute(SEED_BODIES, params)
            c.execute(SEED_MESSAGES, params)
            if status == "delivered":
                c.execute(SEED_HISTORY, params)

    def seed_apart(part: list[tuple[int, int]]) -> None:
        with conn.engine.connect() as c:  # the bench's engine commits each statement
            seed(c, part)

    workers = min(os.cpu_count() or 1, len(chunks))
    if workers < 2:
        seed(conn, chunks)
    else:
        size = -(-len(chunks) // workers)
        with ThreadPoolExecutor(workers) as pool:
            try:
                list(pool.map(seed_apart, [chunks[i:i + size] for i in range(0, len(chunks), size)]))
            except BaseException:
                stop.set()
                raise
    conn.execute(SET_SEQ, {"seq": base + n})


def open_days(conn: Any, lo: int, hi: int) -> None:
    """Days `lo` through `hi` (days since the epoch) open, with their partitions, as a
    deployment that ran through them has them."""
    conn.execute(OPEN_DAYS, {"lo": lo, "hi": hi})


def _seed(env: BenchEnv, *, delivered: int, pending: int, stream: str, chunk: int = 1_000_000) -> float:
    """Empty the outbox, seed `delivered` rows over the last `DAYS` days (their days open) and
    `pending` due ones, VACUUM ANALYZE; the seconds it took."""
    started = time.perf_counter()
    env.reset_table()
    with env.engine.connect() as conn:
        today = conn.execute(TODAY).scalar_one()
        open_days(conn, today - DAYS, today + 1)
        if delivered:
            _insert(conn, status="delivered", n=delivered, stream=stream, chunk=chunk)
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
    tables = {name: {"table_bytes": int(t), "index_bytes": int(i)} for name, t, i in rows}
    return {"tables": tables, "indexes": {k: int(v) for k, v in indexes.items()},
            "total_bytes": sum(int(t + i) for _, t, i in rows),
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
    scans = [n for n in _plan_nodes(plan) if n.get("Relation Name") in ("outbox_message", "outbox_message_live")]
    indexes = sorted({n.get("Index Name") for n in scans if n.get("Index Name")})
    seq_scans = [n for n in scans if n["Node Type"] == "Seq Scan"]
    needed = {"outbox_message_pending_due_idx", "outbox_message_lease_expiry_idx"}
    # Delivered history (outbox_message_done's days) is pruned from every scan of the claim.
    done = [n for n in _plan_nodes(plan) if (n.get("Relation Name") or "").startswith("outbox_message_done")]
    return {"scans": [f"{n['Node Type']} {n.get('Index Name') or ''}".strip() for n in scans],
            "indexes": indexes, "ok": needed <= set(indexes) and not seq_scans, "history_scans": len(done)}


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

    def __init__(self, env: BenchEnv, *, count: int | None = None, seed: int = 65, tolerate: bool = False) -> None:
        self.tolerate, self.failed = tolerate, {}  # type: bool, dict[str, int]
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
                try:
                    with self.engine.begin() as conn:
                        enqueue_events_bulk(conn, [event])
                except DBAPIError as exc:  # counted by SQLSTATE, not lost: the runs report any failure
                    if not self.tolerate:
                        raise
                    state = _sqlstate(exc) or type(exc.orig).__name__
                    self.failed[state] = self.failed.get(state, 0) + 1
                    continue
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
        return {name: (int(dead), int(runs)) for name, dead, runs in conn.execute(DEAD, {"tables": list(TABLES)})}


def _during(env: BenchEnv, work: Callable[[], Any]) -> dict[str, Any]:
    """`work()` right after a CHECKPOINT while a producer enqueues throughout: its time, WAL
    bytes, the producer's enqueues meanwhile, and the dead rows it left in the three tables
    (read two seconds after: backends report their statistics within a second of going idle)."""
    checkpoint(env)
    dead_before = _dead(env)
    with env.engine.connect() as conn:
        lsn = conn.execute(WAL_LSN).scalar_one()
    producer = Producer(env, tolerate=True)
    producer.thread.start()
    time.sleep(0.5)  # the producer is enqueuing before the work starts
    began = len(producer.latencies)
    started = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - started
    everything = producer.finish()
    during = everything[began:]
    with env.engine.connect() as conn:
        wal = conn.execute(WAL_BYTES, {"lsn": lsn}).scalar_one()
    time.sleep(2.0)
    dead_after = _dead(env)
    return {"result": result, "seconds": round(seconds, 3), "wal_bytes": int(wal),
            "dead_rows": {t: max(0, dead_after[t][0] - dead_before[t][0]) for t in TABLES},
            "autovacuum_ran": {t: dead_after[t][1] > dead_before[t][1] for t in TABLES},
            "producer": {"enqueues": len(during), **(_spread(during) if during else {})},
            "producer_failed": producer.failed, "enqueued": len(everything)}


def _rows_of_day(env: BenchEnv, day: int) -> dict[str, int]:
    with env.engine.connect() as conn:
        return {t: conn.execute(text(f"SELECT count(*) FROM {t} WHERE day = :d"), {"d": day}).scalar_one()
                for t in TABLES}


def measure_retention(env: BenchEnv, *, stream: str) -> dict[str, Any]:
    """One day's retention both ways on the same server in the same run: the oldest day of history
    dropped by the maintenance function's path (`manage_days`), and as many rows seeded into day 0
    deleted by today's purge (`purge`, batches of DELETE, the path day 0 still takes), each while
    a producer enqueues one message per transaction; then the VACUUM the DELETE's dead rows call for."""
    window = (DAYS - 1) * 86400.0
    settings = load_settings(database_url=env.database_url, redis_url=env.servers.redis_url)
    engine = create_relay_engine(settings)
    try:
        with env.engine.connect() as conn:
            today = conn.execute(TODAY).scalar_one()
            expired = [r[0] for r in conn.execute(sql.operations.expired_days, {"older_than_seconds": window})]
        day = expired[0]
        rows = _rows_of_day(env, day)
        with env.engine.connect() as conn:  # as many delivered rows in day 0: times of a day not open
            oldest = conn.execute(text("SELECT min(day) FROM outbox_day")).scalar_one()
            _insert(conn, status="delivered", n=rows["outbox_message"], stream=stream, span=86000.0,
                    newest=(oldest - 1) * 86400.0 + 86300.0)
            conn.execute(text("VACUUM ANALYZE " + ", ".join(TABLES)))
        day_zero = _rows_of_day(env, 0)
        with env.engine.connect() as conn:
            before = conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one()
        drop = _during(env, lambda: manage_days(engine, delivered_older_than_seconds=window))
        days = drop.pop("result")
        with env.engine.connect() as conn:
            open_after = [r[0] for r in conn.execute(text("SELECT day FROM outbox_day ORDER BY day"))]
        delete = _during(env, lambda: purge(engine, delivered_older_than_seconds=window, day_zero=True))
        purged = delete.pop("result")
        with env.engine.connect() as conn:
            after = conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one()
            lsn = conn.execute(WAL_LSN).scalar_one()
            started = time.perf_counter()  # the vacuum the DELETE's dead rows call for, now
            conn.execute(text("VACUUM " + ", ".join(TABLES)))
            delete["vacuum_seconds"] = round(time.perf_counter() - started, 2)
            delete["vacuum_wal_bytes"] = int(conn.execute(WAL_BYTES, {"lsn": lsn}).scalar_one())
    finally:
        engine.dispose()
    enqueued = drop.pop("enqueued") + delete.pop("enqueued")
    removed = rows["outbox_message"] + purged.delivered
    drop |= {"day": day, "rows": rows, "dropped": days.dropped == [day] and day not in open_after,
             "kept": days.kept, "skipped": len(days.skipped)}
    delete |= {"rows": day_zero, "purged": purged.delivered, "batches": purged.batches}

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 4) if b else None

    return {
        "window_days": DAYS, "today": today, "drop": drop, "delete": delete, "rows_before": before,
        "rows_after": after, "wal_ratio": ratio(drop["wal_bytes"], delete["wal_bytes"]),
        "seconds_ratio": ratio(drop["seconds"], delete["seconds"]),
        # drop and DELETE removed the same count; the producers' rows are all still there
        "ok": drop["dropped"] and days.kept == 0 and purged.delivered == rows["outbox_message"] > 0
        and purged.complete and after == before - removed + enqueued and sum(drop["dead_rows"].values()) == 0,
    }


def claim_planning(env: BenchEnv, *, limit: int, repetitions: int) -> dict[str, Any]:
    """The claim's planning time (EXPLAIN ANALYZE's, each run rolled back), p50 and p99 over
    `repetitions`, after a tenth as many untimed."""
    params = LeaseStore(env.engine, Channel.REDIS, default_max_attempts=10).claim_parameters("explain", limit, 120.0)
    engine = create_engine(env.database_url, poolclass=NullPool)
    planning: list[float] = []
    try:
        with engine.connect() as conn:
            for i in range(repetitions + max(1, repetitions // 10)):
                with conn.begin() as tx:
                    (raw,) = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.relay.claim.text),
                                          params).one()
                    tx.rollback()
                planning.append((json.loads(raw) if isinstance(raw, str) else raw)[0]["Planning Time"])
    finally:
        engine.dispose()
    planning = planning[-repetitions:]
    return {"repetitions": len(planning), "median_ms": round(percentile(planning, 50), 3),
            "p99_ms": round(percentile(planning, 99), 3)}


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
    case["planning"] = claim_planning(env, limit=claim_batch, repetitions=claims)
    case["retention"] = measure_retention(env, stream=stream)
    case["size_after_purge"] = sizes(env)
    return case


def run_growth(env: BenchEnv, *, delivered: list[int], pending: int, claims: int, claim_batch: int,
               enqueues: int, drain: int, soak_minutes: float | None = None, rate: int = 1000) -> dict[str, Any]:
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
        soak = run_soak(own, minutes=soak_minutes, rate=rate) if soak_minutes else None
        own.clean_redis()
    small, large = cases[0], cases[-1]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    return {
        "server": settings, "load_average": [round(x, 2) for x in started_load], "days": DAYS,
        "claims": claims, "claim_batch": claim_batch, "enqueues": enqueues, "drain_messages": drain,
        "cases": cases, "plans_ok": all(c["plan"]["ok"] for c in cases),
        "plans_prune_history": all(c["plan"]["history_scans"] == 0 for c in cases),
        "claim_p99_ratio": ratio(large["p99_ms"], small["p99_ms"]),
        "enqueue_p99_ratio": ratio(large["enqueue"]["p99_ms"], small["enqueue"]["p99_ms"]),
        "drain_ratio": ratio(large["drain"]["messages_per_second"], small["drain"]["messages_per_second"]),
        "planning_p99_ratio": ratio(large["planning"]["p99_ms"], small["planning"]["p99_ms"]),
        "soak": soak,
        "check": {"ok": section_ok(cases, soak)},
    }


def run_soak_alone(env: BenchEnv, *, minutes: float, rate: int = 1000) -> dict[str, Any]:
    """The soak without the cases (`--soak-only`), on a PostgreSQL of the bench's own."""
    with growth_env(env) as own:
        soak = run_soak(own, minutes=minutes, rate=rate)
        own.clean_redis()
    return soak


def section_ok(cases: list[dict[str, Any]], soak: dict[str, Any] | None) -> bool:
    return all(c["drain"]["ok"] and c["retention"]["ok"] for c in cases) and (soak is None or soak["ok"])


# ------------------------------------------------------------------ the soak

#: Seconds per sample of the soak's timeline.
SOAK_WINDOW = 10.0
#: Maintenance runs (each drops a day) over the soak, the first one run in.
SOAK_DROPS = 10
#: Seconds each relay invocation may run, and the schedule's period when the last one left nothing behind.
SOAK_TIMEOUT, SOAK_PERIOD = 10.0, 1.0


def _soak_relay(database_url: str, redis_url: str, batch_size: int, ready: Any, stop: Any, out: Any) -> None:
    """A relay container held to Lambda's CPU: drain-mode invocations of the real handler on a
    `SOAK_PERIOD` schedule (at once after a full one), each claim timed; puts one report per invocation."""
    import io

    from outbox_relay import observability as obs
    from outbox_relay import runtime
    from outbox_relay import store as store_module
    from outbox_tools.lambda_local import LocalContext, environment, load_handler

    from .handler import probe_environment, schedule_event

    claims: list[tuple[float, float, int]] = []
    original = store_module.LeaseStore.claim

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = original(self, *args, **kwargs)
        claims.append((time.time(), _ms(started), len(result.messages)))
        return result

    store_module.LeaseStore.claim = timed  # type: ignore[method-assign]
    values = probe_environment(database_url, redis_url, batch_size) | DRAIN_ENV | {
        "OUTBOX_FUNCTION_TIMEOUT_SECONDS": f"{SOAK_TIMEOUT:g}", "OUTBOX_LEASE_SECONDS": f"{SOAK_TIMEOUT + 30:g}"}
    sink = io.StringIO()
    try:
        obs.logger.registered_handler.setStream(sink)
        with contextlib.redirect_stdout(sink), environment(**values):
            runtime.reset()
            handler = load_handler("relay")
            event = schedule_event("redis")
            handler(event, LocalContext(SOAK_TIMEOUT, function_name="outbox-relay-bench"))
            claims.clear()
            ready.release()
            while not stop.is_set():
                sink.seek(0)
                sink.truncate()
                began = time.monotonic()
                try:
                    summary, error = handler(event, LocalContext(SOAK_TIMEOUT, function_name="outbox-relay-bench")), None
                except Exception as exc:  # the invocation failed (as on Lambda); the next one runs
                    summary, error = {}, f"{type(exc).__name__}: {str(exc)[:300]}"
                out.put({"claims": claims[:], "delivered": summary.get("delivered", 0), "error": error})
                claims.clear()
                if summary.get("delivered", 0) < batch_size:
                    stop.wait(max(0.0, SOAK_PERIOD - (time.monotonic() - began)))
    except BaseException as exc:  # report, never hang the parent
        ready.release()
        out.put({"claims": [], "delivered": 0, "error": f"{type(exc).__name__}: {exc}"})


def _soak_producer(database_url: str, rate: float, seconds: float, prefix: str, stream: str, seed: int,
                   ready: Any, go: Any, out: Any) -> None:
    """Commit messages at `rate` per second for `seconds`, up to 100 per transaction; a
    transaction that fails is counted by SQLSTATE and its messages offered again."""
    from outbox_relay.ids import uuid7

    failed: dict[str, int] = {}
    try:
        pool = list(payloads.events(2000, seed=seed, streams=(stream,), prefix=prefix))
        engine = create_engine(database_url, poolclass=NullPool)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            conn.commit()
            ready.release()
            go.wait()
            started = time.perf_counter()
            sent = 0
            while (elapsed := time.perf_counter() - started) < seconds:
                due = min(100, int(rate * elapsed) + 1 - sent)
                if due > 0:
                    batch = [dict(pool[(sent + i) % len(pool)], message_id=uuid7()) for i in range(due)]
                    try:
                        with conn.begin():
                            enqueue_events_bulk(conn, batch)
                        sent += due
                    except DBAPIError as exc:
                        state = _sqlstate(exc) or type(exc.orig).__name__
                        failed[state] = failed.get(state, 0) + 1
                time.sleep(max(0.0, min(0.05, started + sent / rate - time.perf_counter())))
        engine.dispose()
        out.put({"sent": sent, "failed": failed, "error": None})
    except BaseException as exc:  # report, never hang the parent
        ready.release()
        out.put({"sent": 0, "failed": failed, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})


def _total(env: BenchEnv) -> tuple[int, int]:
    with env.engine.connect() as conn:
        size, leaves = conn.execute(TOTAL, {"tables": list(TABLES)}).one()
    return int(size), int(leaves)


def _edge_ratio(values: list[tuple[float, float]], edge: float, end: float) -> Any:
    """p99 of `values` (time, value) in the last `edge` seconds over the first `edge`."""
    first = [v for t, v in values if t < edge]
    last = [v for t, v in values if t >= end - edge]
    if not first or not last:
        return None, None, None
    a, b = percentile(first, 99), percentile(last, 99)
    return round(a, 3), round(b, 3), (round(b / a, 2) if a else None)


def run_soak(env: BenchEnv, *, minutes: float, rate: int, batch_size: int = 1000) -> dict[str, Any]:
    """Producers at `rate` and a relay for `minutes` with the delivered window compressed: the
    day's length is the product's (a real day), so past days are seeded, each with what the
    producers offer between two maintenance runs (payloads as large), and `SOAK_DROPS` maintenance runs through its
    own path (`manage_days`, then the day-0 purge) each drop the oldest (a window ending just
    after it) and open one more day ahead. Sampled every `SOAK_WINDOW` seconds: claim p99
    (the relay's claims), lag p99 (created to delivered), the three tables' bytes and partitions."""
    from multiprocessing import get_context

    from . import lambda_model
    from .latency import producers_for

    stamps = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    seconds = minutes * 60.0
    interval = seconds / SOAK_DROPS
    per_day = max(1, round(rate * interval))
    offered = list(payloads.events(50, seed=70, streams=(payloads.STREAMS[0],), prefix=env.prefix))
    pad = max(0, round(sum(len(json.dumps(e["payload"])) for e in offered) / len(offered)) - 30)
    stream = payloads.STREAMS[0]
    env.reset_table()
    env.clean_redis()
    started_seed = time.perf_counter()
    with env.engine.connect() as conn:
        today = conn.execute(TODAY).scalar_one()
        days = list(range(today - SOAK_DROPS - 1, today))  # each dropped in turn but the newest
        open_days(conn, days[0], today + 1)
        for d in days:
            _insert(conn, status="delivered", n=per_day, stream=env.prefix + stream, span=86000.0,
                    newest=d * 86400.0 + 86300.0, pad=pad)
        conn.execute(text("VACUUM ANALYZE " + ", ".join(TABLES)))
    seeded = SOAK_DROPS + 1
    seed_seconds = time.perf_counter() - started_seed
    settings = load_settings(database_url=env.database_url, redis_url=env.servers.redis_url)
    maint = create_relay_engine(settings)
    ctx = get_context("spawn")
    n_producers = producers_for(rate)
    ready, go, stop, produced, reports = ctx.Semaphore(0), ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    relay = ctx.Process(target=_soak_relay, args=(env.database_url, env.servers.redis_url, batch_size, ready, stop,
                                                  reports), daemon=True)
    producers = [ctx.Process(target=_soak_producer, args=(env.database_url, rate / n_producers, seconds, env.prefix,
                                                          stream, 70 + i, ready, go, produced), daemon=True)
                 for i in range(n_producers)]
    samples: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    sampling = threading.Event()
    sampler_errors: list[str] = []
    lambda_model.start(relay)
    for p in producers:
        p.start()
    for _ in range(1 + n_producers):
        ready.acquire()
    t0 = time.time()
    go.set()

    def sample() -> None:
        try:
            _sample()
        except Exception as exc:  # reported with the results, not lost with the thread
            sampler_errors.append(f"{type(exc).__name__}: {exc}")

    def _sample() -> None:
        while True:
            size, leaves = _total(env)
            samples.append({"t": round(time.time() - t0, 1), "bytes": size, "partitions": leaves})
            env.redis.xtrim(destination, maxlen=1000, approximate=True)  # the shared Redis stays small
            if sampling.wait(SOAK_WINDOW):
                return

    invocations: list[dict[str, Any]] = []
    collected = threading.Event()

    def collect() -> None:  # read as they come: a full pipe would block the relay's exit and lose its last reports
        while not (collected.is_set() and reports.empty()):
            try:
                invocations.append(reports.get(timeout=1.0))
            except queue.Empty:
                pass

    destination = next(iter(payloads.events(1, seed=70, streams=(stream,), prefix=env.prefix)))["stream"]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    try:
        for i in range(SOAK_DROPS):
            time.sleep(max(0.0, t0 + (i + 1) * interval - time.time()))
            with env.engine.connect() as conn:  # the window ends just after the oldest open seeded day
                now = conn.execute(text("SELECT extract(epoch FROM now())::float8")).scalar_one()
            window = now - (days[i] + 1) * 86400.0 - 1.0
            began = time.time()
            result = manage_days(maint, delivered_older_than_seconds=window,
                                             margin_days=MARGIN_DAYS + 1 + i)
            purged = purge(maint, delivered_older_than_seconds=window, day_zero=True)
            runs.append({"t": round(began - t0, 1), "seconds": round(time.time() - began, 3),
                         "opened": result.opened, "dropped": len(result.dropped), "skipped": len(result.skipped),
                         "kept": result.kept, "day_zero_purged": purged.delivered})
        for p in producers:
            p.join(timeout=max(60.0, seconds))
        sent = [produced.get(timeout=60) for _ in producers]
        deadline = time.monotonic() + 120
        while env.counts().get("pending", 0) + env.counts().get("leased", 0) and time.monotonic() < deadline:
            time.sleep(1.0)
    finally:
        stop.set()
        sampling.set()
        sampler.join()
        relay.join(timeout=SOAK_TIMEOUT + 60)
        if relay.is_alive():
            relay.kill()
        lambda_model.release(relay)
        maint.dispose()
        collected.set()
        collector.join()
    errors = [s["error"] for s in sent if s.get("error")] + sampler_errors
    failed_invocations = [i["error"] for i in invocations if i.get("error")]
    producer_failed: dict[str, int] = {}
    for s in sent:
        for state, count in s["failed"].items():
            producer_failed[state] = producer_failed.get(state, 0) + count
    claims = [(t - t0, ms) for inv in invocations for t, ms, n in inv["claims"] if n]
    with env.engine.connect() as conn:
        lags = [(float(t) - t0, float(ms)) for t, ms in conn.execute(text(
            "SELECT extract(epoch FROM delivered_at)::float8, "
            "extract(epoch FROM delivered_at - created_at)::float8 * 1000 FROM outbox_message "
            "WHERE created_at >= to_timestamp(:t0) AND status = 'delivered'"), {"t0": t0 - 1.0})]
        present = conn.execute(text("SELECT count(*) FROM outbox_message WHERE created_at >= to_timestamp(:t0)"),
                               {"t0": t0 - 1.0}).scalar_one()
        left = conn.execute(text("SELECT count(*) FROM outbox_message WHERE day = ANY(:d)"),
                            {"d": days[:SOAK_DROPS]}).scalar_one()
        ahead = conn.execute(text("SELECT max(day) FROM outbox_day")).scalar_one() - conn.execute(TODAY).scalar_one()
    end = max([s["t"] for s in samples] + [seconds])
    windows = []
    for k in range(int(end // SOAK_WINDOW) + 1):
        lo, hi = k * SOAK_WINDOW, (k + 1) * SOAK_WINDOW
        c = [v for t, v in claims if lo <= t < hi]
        lag = [v for t, v in lags if lo <= t < hi]
        s = [x for x in samples if lo <= x["t"] < hi]
        windows.append({"t": lo, "claims": len(c), "claim_p99_ms": round(percentile(c, 99), 3) if c else None,
                        "delivered": len(lag), "lag_p99_ms": round(percentile(lag, 99), 1) if lag else None,
                        "bytes": s[0]["bytes"] if s else None, "partitions": s[0]["partitions"] if s else None})
    edge = min(300.0, seconds / 3)
    claim_first, claim_last, claim_ratio = _edge_ratio(claims, edge, seconds)
    lag_first, lag_last, lag_ratio = _edge_ratio([(t, v) for t, v in lags if t < seconds], edge, seconds)
    first_drop = runs[0]["t"] if runs else seconds
    after = [x["bytes"] for x in samples if x["t"] >= first_drop]
    sent_total = sum(s["sent"] for s in sent)
    return stamps | {
        "minutes": minutes, "rate": rate, "producers": n_producers, "batch_size": batch_size,
        "relay_cpu": lambda_model.CPU.label(),
        "seconds_per_day": interval, "seeded_days": seeded, "rows_per_seeded_day": per_day,
        "seed_seconds": round(seed_seconds, 1), "edge_seconds": edge,
        "sent": sent_total, "offered_per_second": round(sent_total / seconds, 1), "rows_present": present,
        "rows_lost": sent_total - present, "delivered": len(lags), "invocations": len(invocations),
        "maintenance": runs, "windows": windows,
        "claim_p99_first_ms": claim_first, "claim_p99_last_ms": claim_last, "claim_p99_ratio": claim_ratio,
        "lag_p99_first_ms": lag_first, "lag_p99_last_ms": lag_last, "lag_p99_ratio": lag_ratio,
        "bytes_at_first_drop": after[0] if after else None, "bytes_at_end": after[-1] if after else None,
        "bytes_after_drops_max_over_min": round(max(after) / min(after), 3) if after else None,
        "partitions_min_max": [min(x["partitions"] for x in samples), max(x["partitions"] for x in samples)],
        "days_open_ahead": ahead,
        "errors": errors, "producer_failed": producer_failed, "invocations_failed": len(failed_invocations),
        "invocation_errors": sorted({e.split(":")[0] + ": " + (e.split("'C': '")[1][:5] if "'C': '" in e else "")
                                     for e in failed_invocations}),
        "ok": not errors and sent_total == present == len(lags) > 0 and left == 0
        and sum(r["dropped"] for r in runs) == SOAK_DROPS,
    }
