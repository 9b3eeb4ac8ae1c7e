"""The `outbox` command line, run as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from leftovers import assert_nothing_left  # tests/leftovers.py
from sqlalchemy import text

from outbox_relay.local import project_root

ROOT = project_root()


def outbox(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "POWERTOOLS_"))}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-m", "outbox_relay.cli", *args], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def cli_env(database_url, servers):
    return {"DATABASE_URL": database_url, "REDIS_URL": servers.redis_url, "POWERTOOLS_TRACE_DISABLED": "true"}


def test_migrate_is_harmless_twice(cli_env):
    assert "latest revision" in outbox("migrate", env=cli_env).stdout
    assert "latest revision" in outbox("migrate", env=cli_env).stdout


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


def test_invalid_payload_is_refused_with_the_field(cli_env, app_engine):
    proc = outbox("enqueue-event", "--stream", "x", "--type", "", "--payload", "{}", env=cli_env, check=False)
    assert proc.returncode != 0 and "type:" in proc.stderr
    proc = outbox("enqueue-event", "--stream", "x", "--type", "t", "--payload", "{nope", env=cli_env, check=False)
    assert proc.returncode != 0 and "--payload" in proc.stderr
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar() == 0


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


def test_relay_reports_a_configuration_error_by_name(cli_env):
    proc = outbox("relay", "--event", "events/relay-redis-scheduler.json",
                  env={**cli_env, "OUTBOX_BATCH_SIZE": "-3"}, check=False)
    assert proc.returncode != 0 and "OUTBOX_BATCH_SIZE" in proc.stderr


def test_demo_runs_end_to_end(servers, redis_prefix):
    # Its own database and key prefix: two test runs on one machine must not share the demo's.
    database = f"outbox_demo_test_{os.getpid()}_{redis_prefix.strip('.')}"
    env = {"DATABASE_URL": servers.database_url, "REDIS_URL": servers.redis_url}
    proc = outbox("demo", "--database-name", database, "--prefix", redis_prefix, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo OK" in proc.stdout and "Dead letters:" in proc.stdout
    assert f"{redis_prefix}orders:" in proc.stdout
    # Cleaned up: its database is gone and no key under its prefix is left
    assert_nothing_left(servers.database_url, servers.redis_url, database, redis_prefix)


def test_demo_refuses_unusable_names_by_option(servers):
    env = {"DATABASE_URL": servers.database_url, "REDIS_URL": servers.redis_url}
    for args, fragment in ((("--database-name", "x; DROP"), "--database-name"), (("--prefix", "*"), "--prefix")):
        proc = outbox("demo", *args, env=env, check=False)
        assert proc.returncode != 0 and fragment in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
