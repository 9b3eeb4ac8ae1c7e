"""Installed from a wheel, outside any checkout, the package still migrates:
the Alembic scripts are package data, and `outbox migrate` finds them."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.pool import NullPool

from outbox_migrations import head_revision

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (built,) = out.glob("outbox_relay-*.whl")
    return built


def test_the_wheel_carries_the_sql_and_the_migrations(wheel):
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"outbox_relay/sql/relay.sql", "outbox_relay/sql/producer.sql", "outbox_relay/sql/operations.sql",
            "outbox_migrations/env.py", "outbox_migrations/script.py.mako",
            "outbox_migrations/versions/0011_tables.json.gz"} <= names
    assert {n for n in names if n.startswith("outbox_migrations/versions/") and n.endswith(".py")}


def test_outbox_migrate_from_a_wheel_outside_the_checkout(wheel, tmp_path, servers, template_db):
    # Given a fresh virtual environment outside the checkout with only the wheel installed
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=900,
                   capture_output=True)
    # and an empty database
    from outbox_tools.servers import create_database, drop_database, with_database

    name = f"{template_db}_wheel"
    drop_database(servers.database_url, name)
    create_database(servers.database_url, name)
    url = with_database(servers.database_url, name)
    try:
        # When `outbox migrate` runs from there, in a directory that is not a checkout
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PYTHON"))}
        proc = subprocess.run([str(env_dir / "bin" / "outbox"), "migrate"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env=clean | {"DATABASE_URL": url})

        # Then the schema is at the latest revision, and it says it created it
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == f"schema created at the latest revision ({head_revision()})\n", proc.stdout
        engine = create_engine(url, poolclass=NullPool)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM outbox_alembic_version")).scalar_one() == head_revision()
            assert {"outbox_message", "outbox_message_body"} <= set(inspect(conn).get_table_names())
        engine.dispose()
        # and the installed package is the wheel's, not the checkout's
        where = subprocess.run([str(python), "-c", "import outbox_migrations; print(outbox_migrations.__file__)"],
                               cwd=tmp_path, capture_output=True, text=True, check=True).stdout
        assert str(env_dir) in where
        # But `outbox demo` there, where no functions/ are, says so in one line and creates nothing
        databases = _databases(servers.database_url)
        proc = subprocess.run([str(env_dir / "bin" / "outbox"), "demo"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env=clean | {"DATABASE_URL": url})
        assert proc.returncode == 1 and proc.stderr.splitlines() == [
            "Error: functions/ not found: run inside a checkout of outbox-relay, where the Lambda functions are"], \
            proc.stderr
        assert _databases(servers.database_url) == databases
        # And a local SES, whose moto only the `local` extra installs, names that extra in one line
        proc = subprocess.run([str(python), "-m", "outbox_tools.local_ses"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env=clean)
        assert proc.returncode == 1 and proc.stderr.splitlines() == [
            "python -m outbox_tools.local_ses: error: moto is not installed; install the local extra: "
            "pip install 'outbox-relay[local]'"], proc.stderr
    finally:
        drop_database(servers.database_url, name)


def _databases(admin_url: str) -> set[str]:
    engine = create_engine(admin_url, poolclass=NullPool)
    with engine.connect() as conn:
        names = set(conn.execute(text("SELECT datname FROM pg_database")).scalars())
    engine.dispose()
    return names
