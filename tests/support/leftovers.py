"""Checks that a command cleaned up after itself on the shared servers."""

from __future__ import annotations

import redis as redis_lib
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from outbox_tools.servers import glob_escape


def assert_nothing_left(database_url: str, redis_url: str, database: str, prefix: str) -> None:
    """The database `database` is gone and no Redis key under `prefix` (or `{prefix…`) is left."""
    admin = create_engine(database_url, poolclass=NullPool)
    with admin.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pg_database WHERE datname = :d"), {"d": database}).scalar() == 0
    admin.dispose()
    client = redis_lib.Redis.from_url(redis_url)
    pattern = glob_escape(prefix)
    assert not list(client.scan_iter(match=f"{pattern}*")) and not list(client.scan_iter(match=f"{{{pattern}*"))
    client.close()
