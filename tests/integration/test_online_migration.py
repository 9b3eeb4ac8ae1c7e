"""Migration 0016 on a running deployment (docs/decisions/0069, docs/operating.md): a database
at 0015 with delivered history and a pending backlog moves to the day partitions while
producers (the Python API and the SQL functions) enqueue and a relay delivers throughout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from typing import Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from outbox_migrations import current_revision, online, upgrade
from outbox_relay import maintenance, runtime
from outbox_relay.models import Outcome
from outbox_relay.producer import enqueue_event
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore
from outbox_tools.cli import main
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from outbox_tools.servers import create_database, drop_database, with_database
from support.sql_functions import call

# A UUIDv7 of `ms` (RFC 9562: 48 bits of Unix milliseconds, version 7, variant 10), random bits from md5.
V7 = ("(lpad(to_hex({ms}), 12, '0') || '7' || substr(md5(g::text || 'a'), 1, 3) || '8' "
      "|| substr(md5(g::text || 'b'), 1, 15))::uuid")

# Delivered history and a pending backlog as 0015 stores them, in bulk: ids spread over the last
# three days (their own day partitions) and a tenth random (day 0); a history line per message.
SEED = """
INSERT INTO outbox_message_body (message_id, payload, headers)
SELECT CASE WHEN mod(g, 10) = 0 THEN gen_random_uuid()
            ELSE {v7} END,
       json_build_object('n', g), NULL
  FROM generate_series(1, :n) g ORDER BY g;
INSERT INTO outbox_message (seq, message_id, channel, destination, type, key, status, attempts, available_at,
                            delivered_at, delivery_ref, payload_bytes)
SELECT seq, message_id, 'redis', :stream, 'seeded', 'p' || mod(seq, 5),
       CASE WHEN seq > :delivered THEN 'pending' ELSE 'delivered' END,
       CASE WHEN seq > :delivered THEN 0 ELSE 1 END, now() - interval '1 hour',
       CASE WHEN seq <= :delivered THEN now() - interval '1 hour' END,
       CASE WHEN seq <= :delivered THEN '1-0' END, octet_length(payload::text)
  FROM outbox_message_body ORDER BY seq;
INSERT INTO outbox_message_history (seq, event, attempt, error_class, actor)
SELECT seq, 'retry', 1, 'seeded', 'relay' FROM outbox_message ORDER BY seq;
""".format(v7=V7.format(ms="(extract(epoch FROM now() - interval '3 days') * 1000)::bigint "
                             "+ mod(g * 86413::bigint, 259200000)"))

CATALOG = [
    """SELECT c.relname, c.relkind::text, coalesce(pg_get_expr(c.relpartbound, c.oid), ''),
              coalesce(pg_get_partkeydef(c.oid), ''), coalesce(c.relacl::text, ''),
              coalesce(c.reloptions::text, ''),
              coalesce((SELECT string_agg(i.inhparent::regclass::text, ',') FROM pg_inherits i
                         WHERE i.inhrelid = c.oid), '')
         FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace""",
    """SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
              a.attidentity::text, coalesce(pg_get_expr(d.adbin, d.adrelid), '')
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
         LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped""",
    """SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index i
         JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = 'public'::regnamespace""",
    """SELECT conname, conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE connamespace = 'public'::regnamespace""",
    """SELECT tgname, tgrelid::regclass::text, pg_get_triggerdef(oid) FROM pg_trigger
        WHERE NOT tgisinternal AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)""",
    """SELECT proname, pg_get_function_identity_arguments(oid), pg_get_functiondef(oid), coalesce(proacl::text, '')
         FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND prokind <> 'a'""",
    """SELECT s.seqrelid::regclass::text, d.refobjid::regclass::text, d.refobjsubid, s.seqincrement
         FROM pg_sequence s LEFT JOIN pg_depend d ON d.objid = s.seqrelid AND d.deptype IN ('a', 'i')
        WHERE s.seqrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)""",
    "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'",
    "SELECT day FROM outbox_day",
]


def catalog(engine: Engine, queries: list[str] = CATALOG) -> list[list[tuple]]:
    """What the schema is, in names and definitions (no oids): tables, partitions, columns,
    indexes, constraints, triggers, functions, sequences, rights, the open days."""
    with engine.connect() as conn:
        return [sorted(tuple(r) for r in conn.execute(text(q)).all()) for q in queries]


def seed_rows(conn, *, n: int, delivered: int, stream: str) -> None:
    """`n` messages as 0015 stores them (SEED), the first `delivered` of them delivered."""
    for q in SEED.split(";\n"):
        if q.strip():
            conn.execute(text(q), {"n": n, "delivered": delivered, "stream": stream})


def seed(engine: Engine, monkeypatch) -> None:
    """Fifty messages at 0015, forty delivered; `outbox` runs on them."""
    with engine.begin() as conn:
        seed_rows(conn, n=50, delivered=40, stream="orders")
    monkeypatch.setenv("DATABASE_URL", engine.url.render_as_string(hide_password=False))


def outbox(*args: str, status: int = 0) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == status, result.output
    return result.output


@pytest.fixture
def fresh_db(servers) -> Iterator:
    made: list[str] = []

    def make() -> Engine:
        name = f"outbox_test_{uuid.uuid4().hex[:8]}_online"
        drop_database(servers.database_url, name)
        create_database(servers.database_url, name)
        made.append(name)
        return create_engine(with_database(servers.database_url, name), poolclass=NullPool)

    yield make
    for name in made:
        drop_database(servers.database_url, name)


def migrate_under_load(fresh_db, monkeypatch, relay_env, redis_client, redis_prefix, *, seeded: int,
                       backlog: int, batch: int) -> None:
    engine = fresh_db()
    stream = redis_prefix + "orders"
    # Given a deployment at 0015 with delivered history and a pending backlog
    upgrade(engine, "0015")
    with engine.begin() as conn:
        seed_rows(conn, n=seeded, delivered=seeded - backlog, stream=stream)
        history_before = conn.execute(text("SELECT count(*) FROM outbox_message_history")).scalar_one()
        backlog_ids = conn.execute(text("SELECT message_id, key FROM outbox_message WHERE status = 'pending' "
                                        "ORDER BY seq")).all()

    # When the online path is prepared (the new library runs on the old tables from then on)
    online.prepare(engine)
    monkeypatch.setenv("DATABASE_URL", engine.url.render_as_string(hide_password=False))
    monkeypatch.setenv("OUTBOX_BATCH_SIZE", "200")
    runtime.reset()
    stop = threading.Event()
    produced: dict[str, list[uuid.UUID]] = defaultdict(list)
    stalls: list[float] = []
    errors: list[BaseException] = []

    def producer(name: str, enqueue) -> None:
        i = 0
        own = create_engine(engine.url, pool_size=1)  # a connection kept, as an application's pool does
        try:
            while not stop.is_set():
                started = time.monotonic()
                with own.begin() as conn:
                    produced[f"{name}{i % 4}"].append(enqueue(conn, key=f"{name}{i % 4}", payload={"i": i}))
                stalls.append((time.monotonic() - started, started))
                i += 1
                time.sleep(0.005)
        except BaseException as exc:  # the assertions below name it
            errors.append(exc)
        finally:
            own.dispose()

    def relay() -> None:
        handler = load_handler("relay")
        try:
            while not stop.is_set() or pending():
                handler({"source": "outbox.scheduler", "channel": "redis"}, LocalContext(10.0))
                time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    def pending() -> int:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM outbox_message WHERE status <> 'delivered'")).scalar_one()

    threads = [
        threading.Thread(target=producer, args=("py", lambda conn, **kw: enqueue_event(
            conn, stream=stream, type="live", **kw))),
        threading.Thread(target=producer, args=("sql", lambda conn, **kw: call(
            conn, "event", stream=stream, type="live", **kw))),
        threading.Thread(target=relay),
    ]
    for t in threads:
        t.start()
    try:
        # ... copied in batches, resumably (a budget that stops it part way first), and swapped in
        time.sleep(1.0)
        partial = online.copy(engine, 0.001, batch=batch)
        assert partial[0] < partial[1]
        started = time.monotonic()
        assert online.copy(engine, 3600, batch=batch)[0] == partial[1]
        copied = time.monotonic()
        upgrade(engine)
        swapped = time.monotonic()
        print(f"online migration of {seeded} rows: copy {copied - started:.1f} s, swap {swapped - copied:.2f} s")
        assert current_revision(engine) == "0018"
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    # Then every message enqueued, before and during the migration, was delivered once, each key in order
    entries = [f for _, f in redis_client.xrange(stream)]
    delivered = [uuid.UUID(f["id"]) for f in entries]
    wanted = [m for m, _ in backlog_ids] + [m for ids in produced.values() for m in ids]
    assert len(produced["py0"]) > 3 and len(produced["sql0"]) > 3
    assert sorted(delivered) == sorted(wanted)
    position = {m: i for i, m in enumerate(delivered)}
    keys = dict(produced)
    for m, key in backlog_ids:
        keys.setdefault(key, []).append(m)
    for key, ids in keys.items():
        assert [position[m] for m in ids] == sorted(position[m] for m in ids), key
    # And PostgreSQL holds each message once, with its body and its history, all delivered
    with engine.connect() as conn:
        total, ids, bodies, statuses, history = conn.execute(text(
            "SELECT count(*), count(DISTINCT message_id), (SELECT count(*) FROM outbox_message_body), "
            "array_agg(DISTINCT status), (SELECT count(*) FROM outbox_message_history WHERE error_class = 'seeded') "
            "FROM outbox_message")).one()
        assert (total, ids, bodies, statuses) == (seeded + len(wanted) - len(backlog_ids),) * 3 + (["delivered"],)
        assert history == history_before
        # each row in the day its id names, as a plain upgrade places it
        assert conn.execute(text("SELECT count(*) FROM outbox_message o JOIN outbox_message_body b "
                                 "ON b.seq = o.seq AND b.day = o.day WHERE o.day = outbox_id_day(o.message_id)")
                            ).scalar_one() == total
        assert conn.execute(text("SELECT count(DISTINCT day) FROM outbox_message")).scalar_one() >= 4
    # And no enqueue waited a second, the swap included
    longest = sorted(stalls)[-5:]
    print(f"enqueues: {len(stalls)}, longest (s, seconds after the copy began): "
          f"{[(round(d, 3), round(t - started, 1)) for d, t in longest]}; the swap from {copied - started:.1f} s "
          f"to {swapped - started:.1f} s")
    assert longest[-1][0] < 1.0
    # And the schema is the one a plain upgrade makes
    plain = fresh_db()
    upgrade(plain)
    schema = catalog(engine)
    assert schema == catalog(plain)
    assert len(schema[0]) > 60 and len(schema[5]) > 10  # the partitions, the functions


def test_a_running_deployment_moves_to_day_partitions_online(fresh_db, monkeypatch, relay_env, redis_client,
                                                             redis_prefix):
    migrate_under_load(fresh_db, monkeypatch, relay_env, redis_client, redis_prefix, seeded=3000, backlog=300,
                       batch=500)


@pytest.mark.slow
def test_a_million_rows_move_online_under_load(fresh_db, monkeypatch, relay_env, redis_client, redis_prefix):
    migrate_under_load(fresh_db, monkeypatch, relay_env, redis_client, redis_prefix, seeded=1_000_000,
                       backlog=20_000, batch=5000)


# The previous version's enqueue statement (0015): its conflict target is the old unique key.
PREVIOUS_ENQUEUE = text("""
WITH body AS (
    INSERT INTO outbox_message_body (message_id, payload, headers)
    VALUES (CAST(:id AS uuid), CAST('{"n": 1}' AS json), NULL)
    ON CONFLICT (message_id) DO NOTHING
    RETURNING seq, message_id, payload
)
INSERT INTO outbox_message (seq, message_id, channel, destination, type, payload_bytes)
SELECT seq, message_id, 'redis', 'orders', 'previous', octet_length(payload::text) FROM body
""")


def test_leases_taken_before_the_swap_are_fenced_after_it_and_the_previous_enqueue_lasts_until_it(fresh_db):
    engine = fresh_db()
    upgrade(engine, "0015")
    ids = [uuid.uuid4() for _ in range(3)]
    gone = uuid.uuid4()
    with engine.begin() as conn:
        for m in [*ids, gone]:
            conn.execute(PREVIOUS_ENQUEUE, {"id": m})
    online.prepare(engine)
    # (a message deleted once the triggers are there: its copy and its body go too)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM outbox_message WHERE message_id = :id"), {"id": gone})
    # Given the previous library's enqueue, which still works on the prepared tables
    late = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(PREVIOUS_ENQUEUE, {"id": late})
    # And two messages leased by a relay before the swap
    store = LeaseStore(create_engine(engine.url, isolation_level="AUTOCOMMIT", poolclass=NullPool),
                       Channel.REDIS, default_max_attempts=5)
    claimed = store.claim("owner-a", 2, 300).messages
    assert [m.message_id for m in claimed] == [str(m) for m in ids[:2]]
    online.copy(engine, 60)

    # When the new tables are swapped in
    upgrade(engine)

    # Then the owner's outcome finds its rows and its fence: a stranger's is refused, the owner's written
    assert store.record("owner-b", [Outcome.delivered(claimed[0].seq, "1-0")]).lease_lost == 1
    assert store.record("owner-a", [Outcome.delivered(m.seq, "1-0") for m in claimed]).delivered == 2
    # And the rest is claimed as usual, the previous library's message included
    assert [m.message_id for m in store.claim("owner-c", 10, 30).messages] == [str(ids[2]), str(late)]
    store.engine.dispose()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT (SELECT count(*) FROM outbox_message), "
                                 "(SELECT count(*) FROM outbox_message_body)")).one() == (4, 4)
    # And the previous library's enqueue fails on the new tables: it must be replaced before the swap
    with pytest.raises(DBAPIError, match="ON CONFLICT"), engine.begin() as conn:
        conn.execute(PREVIOUS_ENQUEUE, {"id": uuid.uuid4()})


def test_maintenance_purges_between_the_prepare_and_the_swap_and_manages_days_after_it(fresh_db, monkeypatch,
                                                                                      relay_env):
    engine = fresh_db()
    upgrade(engine, "0015")
    seed(engine, monkeypatch)
    online.prepare(engine)
    online.copy(engine, 60)
    # Given this version's maintenance function on the prepared deployment, its window past the deliveries
    monkeypatch.setenv("OUTBOX_RETAIN_DELIVERED_SECONDS", "60")
    maintenance.reset()
    handler = load_handler("maintenance")
    scheduled = json.loads((project_root() / "events" / "maintenance-scheduled.json").read_text())

    def counts() -> list[tuple]:
        with engine.connect() as conn:
            return conn.execute(text(f"SELECT status, count(*) FROM outbox_message GROUP BY 1 UNION ALL "
                                     f"SELECT 'copy ' || status, count(*) FROM {online.migration().STAGING}"
                                     f".outbox_message GROUP BY 1 ORDER BY 1")).all()

    before = dict(counts())
    # When it runs before the swap: no day to manage yet, and the delivered rows are purged on both sides
    summary = handler(scheduled, LocalContext(900))
    assert summary["days"] == {"opened": 0, "dropped": [], "kept": 0, "skipped": [], "swap_pending": True}
    assert summary["purged"]["delivered"] == before["delivered"] > 0
    assert counts() == [("copy pending", before["pending"]), ("pending", before["pending"])]
    # Then after the swap it opens and drops days as usual
    upgrade(engine)
    maintenance.reset()
    summary = handler(scheduled, LocalContext(900))
    assert summary["days"]["swap_pending"] is False and summary["days"]["dropped"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT status, count(*) FROM outbox_message GROUP BY 1")).all() == [
            ("pending", before["pending"])]
    maintenance.reset()


def test_outbox_migrate_online_copies_in_runs_and_the_next_migrate_swaps(fresh_db, monkeypatch):
    engine = fresh_db()
    upgrade(engine, "0015")
    seed(engine, monkeypatch)

    # When `outbox migrate --online` runs until it says copied, the schema stays at 0015
    assert "copied and kept in step" in outbox("migrate", "--online")
    assert "copied and kept in step" in outbox("migrate", "--online")  # again: nothing more to do
    assert current_revision(engine) == "0015"
    # Then `outbox migrate` swaps the tables in, every row kept
    assert "upgraded from 0015" in outbox("migrate")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message JOIN outbox_message_body USING (seq, day)")
                            ).scalar_one() == 50
    # And --online on the new schema is refused in one line
    assert "--online: the schema is at 0018" in outbox("migrate", "--online", status=2)


def test_outbox_migrate_online_abandon_goes_back_to_0015_exactly_and_a_later_prepare_starts_afresh(
        fresh_db, monkeypatch):
    engine, plain = fresh_db(), fresh_db()
    upgrade(engine, "0015")
    upgrade(plain, "0015")
    seed(engine, monkeypatch)
    # Nothing prepared: nothing to abandon, said in one line; --abandon alone is refused
    assert "nothing to abandon" in outbox("migrate", "--online", "--abandon", status=2)
    assert "--abandon: only with --online" in outbox("migrate", "--abandon", status=2)
    # Given a prepared and copied migration, written through meanwhile by both libraries and the
    # SQL functions, the previous library on a connection it keeps (its statements run before)
    assert "copied and kept in step" in outbox("migrate", "--online")
    previous = create_engine(engine.url, pool_size=1)
    for _ in range(6):
        with previous.begin() as conn:
            conn.execute(PREVIOUS_ENQUEUE, {"id": uuid.uuid4()})
    with engine.begin() as conn:
        enqueue_event(conn, stream="orders", type="this-version", key="k", payload={"n": 0})
        call(conn, "event", stream="orders", type="sql", key="k", payload={"n": 1})

    # When it is abandoned
    assert "abandoned" in outbox("migrate", "--online", "--abandon")

    # Then the schema is a plain 0015's, catalog for catalog, and every row is kept
    assert current_revision(engine) == "0015"
    assert catalog(engine, CATALOG[:-1]) == catalog(plain, CATALOG[:-1])
    count = "SELECT count(*) FROM outbox_message JOIN outbox_message_body USING (seq, message_id)"
    with engine.connect() as conn:
        assert conn.execute(text(count)).scalar_one() == 58
    # And the previous library's enqueue, on its connection, the SQL functions and a relay's writes
    # and deletes (0015's own triggers take the bodies and the history) work as on 0015
    with previous.begin() as conn:
        conn.execute(PREVIOUS_ENQUEUE, {"id": uuid.uuid4()})
    previous.dispose()
    with engine.begin() as conn:
        call(conn, "event", stream="orders", type="sql", key="k", payload={"n": 2})
        conn.execute(text("UPDATE outbox_message SET status = 'delivered', delivered_at = now() "
                          "WHERE status = 'pending'"))
        conn.execute(text("INSERT INTO outbox_message_history (seq, event, attempt, actor) "
                          "SELECT seq, 'settled', 1, 'relay' FROM outbox_message WHERE type = 'sql'"))
        conn.execute(text("DELETE FROM outbox_message WHERE seq IN "
                          "(SELECT seq FROM outbox_message WHERE type = 'seeded' ORDER BY seq LIMIT 10)"))
        assert conn.execute(text(count)).scalar_one() == 50
        assert conn.execute(text("SELECT (SELECT count(*) FROM outbox_message_body), "
                                 "(SELECT count(*) FROM outbox_message_history), "
                                 "(SELECT count(*) FROM outbox_message WHERE status <> 'delivered')")
                            ).one() == (50, 42, 0)
    # And nothing is left to abandon
    assert "nothing to abandon" in outbox("migrate", "--online", "--abandon", status=2)

    # And a later --online starts from scratch, and its swap is the plain upgrade's schema, every row kept
    assert "seqs up to 61 of 61 copied" in outbox("migrate", "--online")
    assert "upgraded from 0015" in outbox("migrate")
    upgrade(plain)
    assert catalog(engine) == catalog(plain)
    with engine.connect() as conn:
        assert conn.execute(text(count.replace("message_id", "message_id, day"))).scalar_one() == 50
    # And once swapped, there is nothing to abandon
    assert "the schema is at 0018" in outbox("migrate", "--online", "--abandon", status=2)


def test_abandoning_gives_way_to_producers_and_goes_on_when_they_let_go(fresh_db):
    engine = fresh_db()
    upgrade(engine, "0015")
    online.prepare(engine)
    # Given a producer's transaction open on the prepared tables
    holder = engine.connect()
    holding = holder.begin()
    holder.execute(PREVIOUS_ENQUEUE, {"id": uuid.uuid4()})
    # When the prepare is abandoned meanwhile
    abandoning = threading.Thread(target=online.abandon, args=(engine,))
    abandoning.start()
    # Then other producers wait at most a short try for its lock
    waits = []
    for _ in range(8):
        started = time.monotonic()
        with engine.begin() as conn:
            conn.execute(PREVIOUS_ENQUEUE, {"id": uuid.uuid4()})
        waits.append(time.monotonic() - started)
        time.sleep(0.25)
    assert abandoning.is_alive()
    holding.commit()
    holder.close()
    # And once the producer commits, it is done, every row kept
    abandoning.join(60)
    assert not abandoning.is_alive()
    assert max(waits) < 1.0, waits
    with engine.connect() as conn:
        assert conn.execute(text("SELECT to_regnamespace('outbox_online') IS NULL AND to_regclass('outbox_day') IS NULL, "
                                 "(SELECT count(*) FROM outbox_message_body)")).one() == (True, 9)


def test_a_half_done_prepare_is_abandoned_too(fresh_db, monkeypatch):
    engine, plain = fresh_db(), fresh_db()
    upgrade(engine, "0015")
    upgrade(plain, "0015")
    # Given a prepare that built the new tables but could not lock the old ones for its triggers
    monkeypatch.setattr(online, "TRIES", 1)
    with engine.connect() as holder, holder.begin():
        holder.execute(PREVIOUS_ENQUEUE, {"id": uuid.uuid4()})
        with pytest.raises(DBAPIError, match="lock timeout"):
            online.prepare(engine)
    assert online.state(engine) is None
    # When it is abandoned, then the schema is a plain 0015's
    assert online.abandon(engine)
    assert catalog(engine, CATALOG[:-1]) == catalog(plain, CATALOG[:-1])


# The previous version's relay, run as a scheduled invocation after invocation until told to stop:
# its own `outbox_relay` (first on the path) on the tables as they are, whatever the step.
PREVIOUS_RELAY = """
import json, os, sys, time
import outbox_relay
from outbox_tools.lambda_local import LocalContext, load_handler
handler = load_handler("relay")
ran = failed = 0
while not os.path.exists(sys.argv[1]):
    try:
        handler({"source": "outbox.scheduler", "channel": "redis"}, LocalContext(60.0))
        ran += 1
    except Exception as exc:
        failed += 1
        print(type(exc).__name__, str(exc).splitlines()[0][:200], file=sys.stderr)
    time.sleep(0.05)
print(json.dumps({"ran": ran, "failed": failed, "library": outbox_relay.__file__}))
"""


def previous_version(tmp_path) -> str:
    """The last commit whose schema head was 0015, extracted (shared, tools, the relay function)."""
    root = str(project_root())
    added = subprocess.run(["git", "-C", root, "log", "-1", "--format=%H", "--diff-filter=A", "--",
                            "migrations/outbox_migrations/versions/0016_day_partitions.py"],
                           capture_output=True, text=True)
    if added.returncode or not added.stdout.strip():
        pytest.skip("the previous version comes from this checkout's git history, which is not here")
    rev = added.stdout.strip() + "^"
    archive = subprocess.run(["git", "-C", root, "archive", "--format=tar", rev, "pyproject.toml", "shared", "tools",
                              "functions/relay"],
                             capture_output=True)
    if archive.returncode:
        pytest.skip(f"git archive {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive.stdout, check=True)
    return str(tmp_path)


def test_the_previous_relay_delivers_on_prepared_tables_and_through_the_swap(fresh_db, monkeypatch, relay_env,
                                                                            redis_client, redis_prefix, tmp_path):
    old = previous_version(tmp_path)
    engine = fresh_db()
    stream = redis_prefix + "orders"
    # Given a deployment at 0015 with a backlog, prepared online, its relay still the previous version's
    upgrade(engine, "0015")
    with engine.begin() as conn:
        seed_rows(conn, n=600, delivered=300, stream=stream)
        backlog = conn.execute(text("SELECT message_id, key FROM outbox_message WHERE status = 'pending' "
                                    "ORDER BY seq")).all()
    online.prepare(engine)
    monkeypatch.setenv("DATABASE_URL", engine.url.render_as_string(hide_password=False))
    monkeypatch.setenv("OUTBOX_BATCH_SIZE", "50")
    stop = tmp_path / "stop"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([f"{old}/shared", f"{old}/tools"]))
    previous = subprocess.Popen([sys.executable, "-c", PREVIOUS_RELAY, str(stop)], cwd=old, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    produced: dict[str, list[uuid.UUID]] = defaultdict(list)

    def produce(n: int) -> None:  # this version's library, as step 2 deploys it
        with engine.begin() as conn:
            for i in range(n):
                key = f"live{i % 3}"
                produced[key].append(enqueue_event(conn, stream=stream, type="live", key=key, payload={"i": i}))

    def delivered_rows() -> int:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM outbox_message WHERE status = 'delivered'")).scalar_one()

    try:
        # When the previous relay delivers while the copy is made and producers enqueue
        produce(30)
        online.copy(engine, 600, batch=100)
        produce(30)
        deadline = time.monotonic() + 120
        while delivered_rows() < 600 + 60 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert delivered_rows() == 600 + 60
        produce(30)
        # ... and goes on running through the swap and after it, as a stack deploy may leave it for a while
        upgrade(engine)
        assert current_revision(engine) == "0018"
        produce(30)
        deadline = time.monotonic() + 120
        while delivered_rows() < 600 + 120 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.touch()
        out, err = previous.communicate(timeout=120)
    ran = json.loads(out.strip().splitlines()[-1])
    assert ran["failed"] == 0, err
    assert ran["library"].startswith(old), ran  # the previous version's, not this one's
    # Then every message is delivered once, each key's in order, each recorded once with its body
    entries = [uuid.UUID(f["id"]) for _, f in redis_client.xrange(stream)]
    wanted = [m for m, _ in backlog] + [m for ids in produced.values() for m in ids]
    assert sorted(entries) == sorted(wanted)
    first = {}
    for i, m in enumerate(entries):
        first.setdefault(m, i)
    keys = dict(produced)
    for m, key in backlog:
        keys.setdefault(key, []).append(m)
    for key, ids in keys.items():
        assert [first[m] for m in ids] == sorted(first[m] for m in ids), key
    with engine.connect() as conn:
        total, ids, bodies, statuses = conn.execute(text(
            "SELECT count(*), count(DISTINCT message_id), (SELECT count(*) FROM outbox_message_body), "
            "array_agg(DISTINCT status) FROM outbox_message")).one()
    assert (total, ids, bodies, statuses) == (600 + 120,) * 3 + (["delivered"],)
