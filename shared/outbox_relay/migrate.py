"""Apply the Alembic migrations under `infra/migrations` (idempotent)."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine


def migrations_dir() -> Path:
    """The Alembic script directory: `$OUTBOX_MIGRATIONS_DIR`, else `infra/migrations`
    of the source checkout this package is installed from (`pip install -e`)."""
    override = os.environ.get("OUTBOX_MIGRATIONS_DIR")
    if override:
        return Path(override)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "infra" / "migrations"
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError(
        "infra/migrations not found; install from a checkout (pip install -e .) "
        "or set OUTBOX_MIGRATIONS_DIR"
    )


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` (default: latest). Running it twice is harmless."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
