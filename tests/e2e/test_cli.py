"""The `outbox` command line, run as a user would run it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from outbox_tools.lambda_local import project_root
from outbox_tools.servers import create_database, drop_database, with_database
from support.interrupt import sigint_default, sigint_ignored
from support.leftovers import assert_nothing_left

ROOT = project_root()


def outbox(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "POWERTOOLS_"))}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-m", "outbox_tools.cli", *args], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def cli_env(database_url, servers):
    return {"DATABASE_URL": database_url, "REDIS_URL": servers.redis_url, "POWERTOOLS_TRACE_DISABLED": "true"}


@pytest.mark.slow
def test_migrate_is_harmless_twice(cli_env):
    # The test database is migrated already: nothing to do, twice
    for _ in range(2):
        assert "latest revision" in (out := outbox("migrate", env=cli_env).stdout) and "nothing to do" in out


@pytest.mark.slow  # processes; the commands run in process in tests/integration/test_ops_cli.py
def test_enqueue_relay_and_stats(cli_env, app_engine, redis_client, redis_prefix):
    stream = redis_prefix + "cli"
    mid = outbox("enqueue-event", "--stream", stream, "--type", "note.added", "--payload", '{"text": "안녕 👋"}',
                 env=cli_env).stdout.strip()
    stats = json.loads(outbox("stats", "--json", env=cli_env).stdout)
    assert stats["totals"]["pending"] == 1 and stats["totals"]["due_now"] == 1

    out = outbox("relay", "--event", "events/relay-redis-scheduler.json", env=cli_env).stdout
    summary = json.loads(out)  # standard output is the summary alone; logs and EMF go to stderr
    assert (summary["claimed"], summary["delivered"]) == (1, 1)
    ((entry_id, fields),) = redis_client.xrange(stream)
    assert fields["id"] == mid and json.loads(fields["payload"]) == {"text": "안녕 👋"}
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT status, delivery_ref FROM outbox_message")).one() == ("delivered", entry_id)
    stats = json.loads(outbox("stats", "--json", env=cli_env).stdout)
    assert stats["totals"]["delivered"] == 1 and stats["totals"]["pending"] == 0
    human = outbox("stats", env=cli_env).stdout
    assert "redis" in human and "delivered" in human


@pytest.mark.slow
def test_invalid_payload_is_refused_with_the_field(cli_env, app_engine):
    proc = outbox("enqueue-event", "--stream", "x", "--type", "", "--payload", "{}", env=cli_env, check=False)
    assert proc.returncode != 0 and "type:" in proc.stderr
    proc = outbox("enqueue-event", "--stream", "x", "--type", "t", "--payload", "{nope", env=cli_env, check=False)
    assert proc.returncode != 0 and "--payload" in proc.stderr
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar() == 0


@pytest.mark.slow
def test_an_empty_key_is_refused_by_option_and_nothing_is_written(cli_env, app_engine):
    proc = outbox("enqueue-event", "--stream", "x", "--type", "t", "--payload", "{}", "--key", "", env=cli_env,
                  check=False)
    assert proc.returncode == 2 and "key: must not be empty" in proc.stderr and "Traceback" not in proc.stderr
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar() == 0


@pytest.mark.slow
def test_plain_postgresql_urls_work_and_user_errors_are_one_line(cli_env, database_url):
    plain = database_url.replace("postgresql+pg8000://", "postgresql://")
    assert json.loads(outbox("stats", "--json", env={**cli_env, "DATABASE_URL": plain}).stdout)["totals"]["pending"] == 0
    for env, args, fragment in (
        ({"DATABASE_URL": "postgresql+psycopg2://u@h/db"}, ("stats",), "DATABASE_URL: driver must be"),
        ({"DATABASE_URL": "postgresql+pg8000://postgres@127.0.0.1:1/x"}, ("stats",), "cannot reach PostgreSQL"),
        ({}, ("enqueue-event", "--stream", "s", "--type", "t", "--payload", "@no-such-file.json"), "cannot read"),
    ):
        proc = outbox(*args, env={**cli_env, **env}, check=False)
        assert proc.returncode != 0 and fragment in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.slow  # a process, interrupted
def test_ctrl_c_ends_a_latency_relay_as_its_deadline_would(cli_env, app_engine, redis_client, redis_prefix):
    from outbox_relay.producer import enqueue_events_bulk

    # Given a backlog on four keys, and `outbox relay` in latency mode working through it in small batches
    stream, total = redis_prefix + "busy", 5000
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=stream, type="t", payload={"n": i}, key=f"k{i % 4}")
                                   for i in range(total)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "POWERTOOLS_"))}
    env.update(cli_env, OUTBOX_MODE="latency", OUTBOX_BATCH_SIZE="10")
    with sigint_ignored():  # whichever way this run was started, as a background job would
        relay = subprocess.Popen([sys.executable, "-m", "outbox_tools.cli", "relay", "--event",
                                  "events/relay-redis-scheduler.json", "--timeout", "60"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, preexec_fn=sigint_default)
    try:
        # When Ctrl-C arrives once it has delivered some
        give_up = time.monotonic() + 60
        while _statuses(app_engine).get("delivered", 0) == 0 and relay.poll() is None \
                and time.monotonic() < give_up:
            time.sleep(0.02)
        relay.send_signal(signal.SIGINT)
        out, err = relay.communicate(timeout=60)
    finally:
        if relay.poll() is None:
            relay.kill()
    # Then it ends at once with the status of an interrupted command, its summary on standard output
    assert relay.returncode == 130, err
    summary = json.loads(out)
    assert summary["mode"] == "latency" and summary["interrupted"] and 0 < summary["delivered"] < total
    assert "Aborted" not in err and "interrupted: finishing what is in flight" in err
    # and nothing is left leased: what it delivered is delivered, once; the rest is pending, no attempt spent
    with app_engine.connect() as conn:
        rows = conn.execute(text("SELECT status, attempts, count(*) FROM outbox_message GROUP BY 1, 2")).all()
    assert sorted(rows) == [("delivered", 1, summary["delivered"]), ("pending", 0, total - summary["delivered"])]
    assert redis_client.xlen(stream) == summary["delivered"]


@pytest.mark.slow  # a process, interrupted twice
def test_a_second_ctrl_c_aborts_a_latency_relay_in_one_line(cli_env, app_engine, redis_prefix):
    import socket
    import threading

    from outbox_relay.producer import enqueue_event

    # Given a message, and a "Redis" that takes connections and never answers: the relay
    # is held in its first call, so both interrupts land while the invocation runs
    with app_engine.begin() as conn:
        enqueue_event(conn, stream=redis_prefix + "held", type="t", payload={})
    silent = socket.create_server(("127.0.0.1", 0))
    asked = threading.Event()

    def listen() -> None:
        with contextlib.suppress(OSError):
            peer, _ = silent.accept()
            if peer.recv(1024):
                asked.set()
            peer.recv(1024)  # held open, unanswered, until the process is gone

    threading.Thread(target=listen, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "POWERTOOLS_"))}
    env.update(cli_env, OUTBOX_MODE="latency", REDIS_URL=f"redis://127.0.0.1:{silent.getsockname()[1]}/0",
               OUTBOX_REDIS_SOCKET_TIMEOUT_SECONDS="60")
    with sigint_ignored():
        relay = subprocess.Popen([sys.executable, "-m", "outbox_tools.cli", "relay", "--event",
                                  "events/relay-redis-scheduler.json", "--timeout", "60"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, preexec_fn=sigint_default)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(relay.stderr), daemon=True)
    reader.start()
    try:
        assert asked.wait(60), "the relay never called Redis"
        # When Ctrl-C comes, and again once the first is taken
        relay.send_signal(signal.SIGINT)
        give_up = time.monotonic() + 30
        while not any(line.startswith("interrupted:") for line in lines) and time.monotonic() < give_up:
            time.sleep(0.02)
        relay.send_signal(signal.SIGINT)
        relay.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        if relay.poll() is None:
            relay.kill()
        silent.close()
    # Then it ends at once with the status of an interrupted command and one line, no traceback
    assert relay.returncode == 130, lines
    assert lines[-1] == "Error: relay aborted; what it held is claimed again when its lease expires\n", lines
    assert not any("Traceback" in line or "SchemaValidationError" in line for line in lines), lines
    assert relay.stdout.read() == ""
    # and the message was not delivered: it is held under its lease, or was never claimed
    assert set(_statuses(app_engine)) <= {"pending", "leased"}


def _statuses(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT status, count(*) FROM outbox_message GROUP BY 1")).all())


@pytest.mark.slow
def test_relay_reports_a_configuration_error_by_name(cli_env):
    proc = outbox("relay", "--event", "events/relay-redis-scheduler.json",
                  env={**cli_env, "OUTBOX_BATCH_SIZE": "-3"}, check=False)
    assert proc.returncode != 0 and "OUTBOX_BATCH_SIZE" in proc.stderr


@pytest.mark.slow
def test_demo_runs_end_to_end(servers, redis_prefix):
    # Its own database and key prefix: two test runs on one machine must not share the demo's.
    # The prefix holds what a SCAN pattern reads as syntax (a backslash at the end, a star).
    database = f"outbox_demo_test_{os.getpid()}_{redis_prefix.strip('.')}"
    prefix = redis_prefix + "a*b\\"
    env = {"DATABASE_URL": servers.database_url, "REDIS_URL": servers.redis_url}
    proc = outbox("demo", "--database-name", database, "--prefix", prefix, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{prefix}orders:" in proc.stdout
    assert [line for line in proc.stdout.splitlines() if line.startswith("{")] == []  # no raw log lines
    # The two dead letters are said to be staged, and why
    assert f"staged: the demo made {prefix}audit a plain string key, so XADD to it fails with WRONGTYPE" in proc.stdout
    assert "staged: promo@unverified.example is not a verified identity of the local SES" in proc.stdout
    assert proc.stdout.rstrip().endswith("demo OK: everything was delivered except the two failures staged on "
                                         "purpose, which are dead letters as they should be")
    # Cleaned up: its database is gone and no key under its prefix is left
    assert_nothing_left(servers.database_url, servers.redis_url, database, prefix)


@pytest.mark.slow
def test_demo_refuses_unusable_names_by_option(servers):
    env = {"DATABASE_URL": servers.database_url, "REDIS_URL": servers.redis_url}
    for args, fragment in ((("--database-name", "x; DROP"), "--database-name"), (("--prefix", "{x}"), "--prefix")):
        proc = outbox("demo", *args, env=env, check=False)
        assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.fixture
def app_database(servers, redis_prefix):
    """A database of someone else's, with a row in it."""
    name = f"outbox_app_test_{os.getpid()}_{redis_prefix.strip('.')}"
    create_database(servers.database_url, name)
    engine = create_engine(with_database(servers.database_url, name), poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE customer (name text)"))
        conn.execute(text("INSERT INTO customer VALUES ('Zoë')"))
    yield name, engine
    engine.dispose()
    drop_database(servers.database_url, name)


@pytest.mark.slow
def test_demo_refuses_a_database_it_did_not_create(servers, app_database):
    name, engine = app_database
    env = {"DATABASE_URL": servers.database_url, "REDIS_URL": servers.redis_url}
    # When the demo is pointed at an existing database, the application's or PostgreSQL's own
    for database in (name, "postgres"):
        proc = outbox("demo", "--database-name", database, env=env, check=False)
        # Then it refuses by option, before creating anything
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"Error: Invalid value for --database-name: database {database} exists already" in proc.stderr
        assert "Traceback" not in proc.stderr and "migrated" not in proc.stdout
    # And the database and its row are still there
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM customer")).scalars().all() == ["Zoë"]


@pytest.mark.slow
def test_demo_refuses_a_prefix_keys_already_use(servers, redis_client, redis_prefix):
    redis_client.set(redis_prefix + "mine", "keep me")
    env = {"DATABASE_URL": servers.database_url, "REDIS_URL": servers.redis_url}
    proc = outbox("demo", "--prefix", redis_prefix, env=env, check=False)
    assert proc.returncode == 2 and "Error: Invalid value for --prefix: keys under" in proc.stderr, proc.stdout + proc.stderr
    assert redis_client.get(redis_prefix + "mine") == "keep me"
    assert "database outbox_demo" not in proc.stdout  # nothing was created


@pytest.mark.slow
def test_two_demos_at_once_on_default_names(servers):
    # Given two default demos started together on the same servers
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "POWERTOOLS_"))}
    env.update(DATABASE_URL=servers.database_url, REDIS_URL=servers.redis_url)
    demos = [subprocess.Popen([sys.executable, "-m", "outbox_tools.cli", "demo"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for _ in range(2)]
    outputs = [demo.communicate(timeout=300) for demo in demos]
    # Then both succeed, each on a database and a prefix of its own, and each removed its own
    names = []
    for demo, (out, err) in zip(demos, outputs):
        assert demo.returncode == 0, out + err
        line = next(x for x in out.splitlines() if x.startswith("database "))
        database, prefix = line.split()[1], line.split()[5]
        names.append((database, prefix))
        assert_nothing_left(servers.database_url, servers.redis_url, database, prefix)
    assert len(set(names)) == 2
