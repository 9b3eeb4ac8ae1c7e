"""Alembic environment for the outbox schema.

Run through `outbox_migrations.upgrade` (`outbox migrate`, the migration
function) or `alembic -c infra/alembic.ini upgrade head` with DATABASE_URL set.
The connection comes from the caller when there is one
(`config.attributes["connection"]`), else from `sqlalchemy.url`/DATABASE_URL.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from outbox_migrations import VERSION_TABLE

config = context.config


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=None, version_table=VERSION_TABLE,
                      transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL: not set (needed to run migrations)")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url") or os.environ.get("DATABASE_URL"),
                      literal_binds=True, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
