"""Everything that talks to PostgreSQL works through PgBouncer in transaction
pooling mode, with fewer server connections than clients: the relay in every
mode, several invocations at once, the producer API, the `outbox` command, the
maintenance function and the migration function. Nothing is lost, delivered
twice or left leased.

Each test starts a PgBouncer of its own (tests/support/pgbouncer.py): two server
connections, handed out round robin, so that a statement whose protocol messages
are not held together by a transaction meets another server connection at once.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from outbox_relay.config import load_settings
from outbox_relay.db import create_relay_engine
from outbox_relay.producer import enqueue_event, enqueue_events_bulk
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LOCKED_HOLD_MAX_SECONDS, LeaseStore, lease_token
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from support.pgbouncer import MissingPgBouncer, PgBouncer, pgbouncer_binary, pgbouncer_version

ROOT = project_root()


@pytest.fixture(scope="session")
def pgbouncer_found() -> tuple[int, ...]:
    try:
        return pgbouncer_version(pgbouncer_binary())
    except MissingPgBouncer as exc:
        pytest.skip(str(exc))


@pytest.fixture
def bouncer(pgbouncer_found, tmp_path_factory, servers, database_url):
    """A PgBouncer of this test's own, two server connections of this test's
    database open and idle, handed out round robin."""
    if not servers.database_url.startswith("postgresql"):
        pytest.skip("needs PostgreSQL")
    pooler = PgBouncer(tmp_path_factory.mktemp("pgbouncer"), servers.database_url).start()
    try:
        pooler.warm(make_url(database_url).database)
        yield pooler
    finally:
        pooler.stop()


@pytest.fixture
def pooled_url(bouncer, database_url) -> str:
    return bouncer.url(database_url)


@pytest.fixture
def pooled_app_engine(pooled_url):
    """An application's engine through the pooler (transactions, for the producer API)."""
    engine = create_engine(pooled_url, poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def pooled_relay_engine(pooled_url):
    engine = create_relay_engine(load_settings(database_url=pooled_url, redis_url="redis://unused:6379/0",
                                               database_pool_size=4))
    yield engine
    engine.dispose()


def _outbox_state(app_engine) -> collections.Counter:
    with app_engine.connect() as conn:
        return collections.Counter(tuple(r) for r in conn.execute(text(
            "SELECT status, attempts FROM outbox_message")))


def _transactions_through(bouncer, database: str) -> int:
    return sum(int(row["total_xact_count"]) for row in bouncer.show("STATS") if row["database"] == database)


def test_the_relay_store_through_pgbouncer_in_transaction_mode(bouncer, pooled_app_engine, pooled_relay_engine,
                                                               app_engine, database_url, redis_prefix, invoke,
                                                               publisher, policy, redis_client):
    # Given messages enqueued through the pooler by the producer API: a bulk call, and single
    # events with an ordering key, each in the application's transaction
    stream = redis_prefix + "pooled"
    with pooled_app_engine.begin() as conn:
        ids = enqueue_events_bulk(conn, [dict(stream=stream, type="t", payload={"n": i}) for i in range(150)])
    for i in range(20):
        with pooled_app_engine.begin() as conn:
            ids.append(enqueue_event(conn, stream=stream, type="k", payload={"k": i}, key="the-key"))

    # When the relay, on its own engine through the pooler, runs invocations in this mode until none claims
    store = LeaseStore(pooled_relay_engine, Channel.REDIS, default_max_attempts=3)
    small = dataclasses.replace(policy, batch_size=40)
    summaries = []
    while True:
        summaries.append(invoke(store, publisher, small, lease_token("pooled")))
        if not summaries[-1].claimed or len(summaries) > 20:
            break

    # Then each message was delivered once, in its key's order, and nothing is left leased
    assert sum(s.delivered for s in summaries) == len(ids)
    assert _outbox_state(app_engine) == {("delivered", 1): len(ids)}
    entries = redis_client.xrange(stream)
    assert sorted(f["id"] for _, f in entries) == sorted(map(str, ids))
    keyed = [json.loads(f["payload"])["k"] for _, f in entries if f.get("key") == "the-key"]
    assert keyed == list(range(20))
    # And it went through the pooler
    assert _transactions_through(bouncer, make_url(database_url).database) > len(summaries)


#: SHOW POOLS columns of the server connections a pool holds (not those opened for a cancel request).
SERVER_STATES = ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")


def _peak_clients(bouncer, database: str, stop: threading.Event, peak: list[int]) -> None:
    """Watch the pooler's clients and server connections of `database` until `stop`."""
    while not stop.wait(0.02):
        for pool in bouncer.show("POOLS"):
            if pool["database"] == database:
                peak[0] = max(peak[0], int(pool["cl_active"]) + int(pool["cl_waiting"]))
                peak[1] = max(peak[1], sum(int(pool.get(k, 0)) for k in SERVER_STATES))


def _poller_registered(app_engine) -> bool:
    with app_engine.connect() as conn:
        return bool(conn.execute(text("SELECT count(*) FROM outbox_poller")).scalar())


def test_several_invocations_at_once_in_every_mode(bouncer, pooled_url, pooled_app_engine, app_engine, servers,
                                                   database_url, redis_prefix, redis_client):
    # Given a backlog enqueued through the pooler
    stream = redis_prefix + "many"
    with pooled_app_engine.begin() as conn:
        ids = enqueue_events_bulk(conn, [dict(stream=stream, type="t", payload={"n": i}) for i in range(1200)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "POWERTOOLS_", "DATABASE_"))}
    env.update(DATABASE_URL=pooled_url, REDIS_URL=servers.redis_url, OUTBOX_BATCH_SIZE="50",
               OUTBOX_DEADLINE_MARGIN_SECONDS="1", OUTBOX_POLL_INTERVAL_SECONDS="0.05",
               POWERTOOLS_TRACE_DISABLED="true", POWERTOOLS_METRICS_NAMESPACE="OutboxRelayTest")
    database = make_url(database_url).database
    stop, peak = threading.Event(), [0, 0]
    watcher = threading.Thread(target=_peak_clients, args=(bouncer, database, stop, peak))
    watcher.start()

    def relay(mode: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "outbox_tools.cli", "relay", "--event",
                                 "events/relay-redis-scheduler.json", "--timeout", "4"],
                                env={**env, "OUTBOX_MODE": mode}, cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    # When three invocations of the real handler run at once, each a process as in Lambda
    # (latency, drain, batch), while the application enqueues more through the pooler once
    # the latency-mode poller has registered
    procs = [relay(mode) for mode in ("latency", "drain", "batch")]
    give_up = time.monotonic() + 60
    while not _poller_registered(app_engine):
        assert time.monotonic() < give_up and procs[0].poll() is None, procs[0].communicate()[1][-3000:]
        time.sleep(0.02)
    for i in range(30):
        with pooled_app_engine.begin() as conn:
            ids.append(enqueue_event(conn, stream=stream, type="k", payload={"k": i}, key="late"))
        time.sleep(0.02)
    outs = [p.communicate(timeout=90) for p in procs]
    # and the next scheduled runs, for what a loaded machine committed after the poller's last
    # claim, and for a key's rows a claim moved ahead behind a first row another claim held
    # locked for long (a loaded machine's slow claim; moved by at most LOCKED_HOLD_MAX_SECONDS)
    give_up = time.monotonic() + 3 * LOCKED_HOLD_MAX_SECONDS
    while True:
        procs.append(relay("drain"))
        outs.append(procs[-1].communicate(timeout=90))
        state = _outbox_state(app_engine)
        if state == {("delivered", 1): len(ids)} or time.monotonic() > give_up:
            break
        time.sleep(1)
    stop.set()
    watcher.join()

    # Then every invocation ended well, and together they delivered each message once,
    # the keyed ones in order; nothing is pending or leased
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-3000:]
    summaries = [json.loads(out) for out, _ in outs]
    assert _outbox_state(app_engine) == {("delivered", 1): len(ids)}, [
        {k: s[k] for k in ("mode", "claimed", "delivered", "released", "stopped", "skipped")} for s in summaries]
    assert sum(s["delivered"] for s in summaries) == len(ids)
    entries = redis_client.xrange(stream)
    assert len(entries) == len(ids) and {f["id"] for _, f in entries} == set(map(str, ids))
    assert [json.loads(f["payload"])["k"] for _, f in entries if f.get("key") == "late"] == list(range(30))
    # And more clients shared the pooler's two server connections
    assert peak[0] > 2 >= peak[1] > 0, peak


def test_the_command_line_maintenance_and_migrations_through_pgbouncer(bouncer, pooled_url, app_engine, monkeypatch,
                                                                       empty_database_url):
    from outbox_migrations import custom_resource, head_revision
    from outbox_relay import maintenance
    from outbox_tools.cli import main
    from support.events import seed_rows

    def outbox(*args: str) -> str:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    # Given old delivered messages and dead letters
    seed_rows(app_engine, 3, "delivered", ago=10 * 86400)
    seed_rows(app_engine, 2, "dead", ago=40 * 86400, error_class="permanent")
    seed_rows(app_engine, 2, "dead", ago=60, error_class="transient")
    for key in [k for k in os.environ if k.startswith(("OUTBOX_", "DATABASE_", "REDIS_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("DATABASE_URL", pooled_url)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")

    # When the `outbox` command enqueues, reads and redrives through the pooler
    mid = outbox("enqueue-event", "--stream", "s", "--type", "t", "--payload", '{"a": 1}').strip()
    assert json.loads(outbox("stats", "--json"))["totals"]["dead"] == 4
    assert json.loads(outbox("dead", "list", "--json", "--error-class", "transient"))["count"] == 2
    assert json.loads(outbox("redrive", "--error-class", "transient", "--json"))["moved"] == 2
    # and the maintenance function purges and reports the backlog through it
    monkeypatch.setenv("OUTBOX_FUNCTION_TIMEOUT_SECONDS", "900")
    maintenance.reset()
    try:
        summary = load_handler("maintenance")(json.loads((ROOT / "events/maintenance-scheduled.json").read_text()),
                                              LocalContext(900))
    finally:
        maintenance.reset()

    # Then the rows say so
    assert (summary["purged"]["delivered"], summary["purged"]["dead"]) == (3, 2)
    assert {b["channel"]: b["pending_depth"] for b in summary["backlog"]}["redis"] == 3
    with app_engine.connect() as conn:
        assert collections.Counter(r.status for r in conn.execute(text("SELECT status FROM outbox_message"))) \
            == {"pending": 3}
        assert conn.execute(text("SELECT count(*) FROM outbox_message WHERE message_id = :m"), {"m": mid}).scalar() == 1

    # And the migration function and `outbox migrate` create a schema through it
    bouncer.warm(make_url(empty_database_url).database)
    monkeypatch.setenv("DATABASE_URL", bouncer.url(empty_database_url))
    custom_resource.reset()
    try:
        assert custom_resource.migrate(custom_resource.get_dependencies().engine) == (None, head_revision())
    finally:
        custom_resource.reset()
    assert "nothing to do" in outbox("migrate")


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_a_pooler_in_statement_mode_is_refused_in_one_line(pgbouncer_found, tmp_path_factory, servers, database_url,
                                                           relay_env, monkeypatch, app_engine, enqueue):
    from outbox_tools.cli import main

    # Given a PgBouncer in statement mode, which cuts a client at its first transaction block
    pooler = PgBouncer(tmp_path_factory.mktemp("pgbouncer"), servers.database_url, pool_mode="statement").start()
    try:
        enqueue(3)
        monkeypatch.setenv("DATABASE_URL", pooler.url(database_url))

        # When the relay and the `outbox` command start through it
        with pytest.raises(Exception) as refused:
            load_handler("relay")({"source": "outbox.scheduler"}, LocalContext(60))
        result = CliRunner().invoke(main, ["stats"])
    finally:
        pooler.stop()

    # Then each refuses in one line naming the setting, and nothing was claimed
    assert type(refused.value).__name__ == "ConfigurationError" and "DATABASE_URL" in str(refused.value)
    assert "statement mode" in str(refused.value)
    assert result.exit_code == 1 and result.output.startswith("Error: configuration error: DATABASE_URL")
    assert len(result.output.strip().splitlines()) == 1
    assert _outbox_state(app_engine) == {("pending", 0): 3}
