"""The outbox schema as Alembic migrations, and `upgrade()` to apply them.

The scripts ship inside this package (`versions/`), so an installed wheel
migrates as well as a source checkout: `outbox migrate` on a workstation, and
the migration function at deploy time, both call `upgrade()`.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

#: Key of the transaction-level advisory lock an upgrade holds: a second upgrade
#: of the same database (a deploy while someone runs `outbox migrate`) waits for
#: the first, then finds nothing to do, instead of failing on a half-made table.
UPGRADE_LOCK_KEY = 0x6F7574626F78  # "outbox"

#: Alembic's version table; not `alembic_version`, so the outbox can share a
#: database with an application that has migrations of its own.
VERSION_TABLE = "outbox_alembic_version"


def script_location() -> Path:
    """The Alembic script directory (this package)."""
    return Path(__file__).resolve().parent


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` (default: latest). Running it twice, or
    twice at once, is harmless."""
    cfg = alembic_config()
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": UPGRADE_LOCK_KEY})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    from alembic.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def head_revision() -> str:
    """The latest revision these scripts define."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head
