"""Migration 0016 on a running deployment (docs/decisions/0069): the partitioned tables are
built beside the old ones in a schema of their own, kept in step with every write by triggers
on the old tables, filled in short batches, and swapped in by 0016 in one short transaction.

`prepare` and `copy` are resumable: each step records where it is, and each transaction is
short; `outbox migrate --online` runs them within a time budget, and the next upgrade swaps.
`abandon` (`outbox migrate --online --abandon`) undoes the prepare, back to 0015 exactly.
"""

from __future__ import annotations

import time
from types import ModuleType

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

#: The old tables are locked only to add a column and the triggers: each try waits this long,
#: below the deadlock timeout, so that producers and relays win; tries a second apart.
LOCK_TIMEOUT, TRIES = "200ms", 30
#: Seqs per copy transaction: a short one (its row locks make a relay's outcome write wait).
BATCH = 5000

MESSAGE_COLUMNS = ("seq, message_id, channel, destination, type, key, status, attempts, max_attempts, "
                   "available_at, lease_owner, lease_expires_at, last_error, last_error_class, delivery_ref, "
                   "created_at, delivered_at, dead_at, payload_bytes, scheduled_at")
HISTORY_COLUMNS = "seq, id, at, event, attempt, error_class, error, ref, actor, next_at"

# Every write to an old table, done again on the new one: a row changed is deleted and written
# again (its status may move it to another partition). Owner's rights: writers need none there.
# The day is always the id's, whatever a writer of the previous version left in the column.
MIRROR = """
CREATE FUNCTION {s}.mirror_{table}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $f$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM {s}.{table} WHERE seq = OLD.seq AND {match};
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO {s}.{table} ({columns}, day) SELECT {new}, {day} ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $f$;
CREATE TRIGGER outbox_online_mirror AFTER INSERT OR UPDATE OR DELETE ON {t}.{table}
    FOR EACH ROW EXECUTE FUNCTION {s}.mirror_{table}();
"""
NEW_DAY = "{t}.outbox_id_day(NEW.message_id)"
#: Per old table: its columns, how its copy is found (by its partition where the row tells it), the copy's day.
MIRRORED = (
    ("outbox_message", MESSAGE_COLUMNS, "status = OLD.status AND day = {t}.outbox_id_day(OLD.message_id)", NEW_DAY),
    ("outbox_message_body", "seq, message_id, payload, headers", "day = {t}.outbox_id_day(OLD.message_id)", NEW_DAY),
    ("outbox_message_history", HISTORY_COLUMNS, "id = OLD.id",
     "{t}.outbox_id_day((SELECT message_id FROM {t}.outbox_message_body WHERE seq = NEW.seq))"),
)

# One batch of the rows that were there before the triggers. FOR SHARE: a row being changed or
# deleted is copied after that commits (its trigger then finds it), never before, as a stale copy.
COPY = """
INSERT INTO {s}.outbox_message_body (seq, message_id, payload, headers, day)
SELECT seq, message_id, payload, headers, {t}.outbox_id_day(message_id) FROM {t}.outbox_message_body
 WHERE seq > :lo AND seq <= :hi FOR SHARE
ON CONFLICT DO NOTHING;
INSERT INTO {s}.outbox_message ({m}, day)
SELECT {m}, {t}.outbox_id_day(message_id) FROM {t}.outbox_message WHERE seq > :lo AND seq <= :hi FOR SHARE
ON CONFLICT DO NOTHING;
INSERT INTO {s}.outbox_message_history ({h}, day)
SELECT {hh}, {t}.outbox_id_day(b.message_id) FROM {t}.outbox_message_history h
  LEFT JOIN {t}.outbox_message_body b ON b.seq = h.seq
 WHERE h.seq > :lo AND h.seq <= :hi FOR SHARE OF h
ON CONFLICT DO NOTHING;
"""


def migration() -> ModuleType:
    """Migration 0016's module: the new tables are its own statements."""
    from alembic.script import ScriptDirectory

    from outbox_migrations import alembic_config

    return ScriptDirectory.from_config(alembic_config()).get_revision("0016").module


def _locked(engine: Engine, step) -> None:
    """Run `step(conn)` in a transaction that locks the old tables, trying again while writers hold them."""
    for tries_left in range(TRIES - 1, -1, -1):
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                step(conn)
            return
        except DBAPIError as exc:
            if not tries_left or "55P03" not in (getattr(exc.orig, "pgcode", None) or str(exc.orig)):
                raise
            time.sleep(1)


def state(engine: Engine) -> tuple[int, int] | None:
    """(copied, mark) once prepared: rows up to seq `mark` predate the triggers; None before."""
    m = migration()
    with engine.connect() as conn:
        if conn.exec_driver_sql(f"SELECT to_regclass('{m.STAGING}.progress')").scalar() is None:
            return None
        return tuple(conn.exec_driver_sql(f"SELECT copied, mark FROM {m.STAGING}.progress").one())


def prepare(engine: Engine) -> None:
    """Build the new tables beside the old (resumable), then, under a short lock, the day column
    the new library writes on the old tables and the triggers that keep the new ones in step."""
    m = migration()
    s = m.STAGING
    with engine.begin() as conn:
        t = conn.exec_driver_sql("SELECT quote_ident(current_schema())").scalar()
        if conn.exec_driver_sql(f"SELECT to_regnamespace('{s}')").scalar() is None:
            conn.exec_driver_sql(f"CREATE SCHEMA {s}")
            # Where 0016 puts them: the new library enqueues through them before the swap.
            conn.exec_driver_sql(m.DAYS)
            conn.exec_driver_sql(m.ID_DAY)
            conn.exec_driver_sql(f"SET LOCAL search_path = {s}, {t}")
            conn.exec_driver_sql(m.TABLES.replace("_v15 ", " "))
            today = conn.exec_driver_sql("SELECT current_date - DATE '1970-01-01'").scalar()
            for d in range(today - m.DAYS_BEHIND, today + m.DAYS_AHEAD + 1):
                for what in ("done", "body", "history"):
                    parent = "outbox_message_done" if what == "done" else f"outbox_message_{what}"
                    conn.exec_driver_sql(f"CREATE TABLE outbox_message_{what}_d{d} PARTITION OF {parent} "
                                         f"FOR VALUES FROM ({d}) TO ({d + 1})")
                conn.exec_driver_sql(f"INSERT INTO {t}.outbox_day (day) VALUES ({d})")
            conn.exec_driver_sql(m.KEYS)

    def triggers(conn: Connection) -> None:
        if conn.exec_driver_sql(f"SELECT to_regclass('{s}.progress')").scalar() is not None:
            return
        conn.exec_driver_sql(f"LOCK TABLE {', '.join(m.TABLE_NAMES)} IN ACCESS EXCLUSIVE MODE")
        for name in m.TABLE_NAMES:
            conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN day int NOT NULL DEFAULT 0")
        for table, columns, match, day in MIRRORED:
            conn.exec_driver_sql(MIRROR.format(
                s=s, t=t, table=table, columns=columns, match=match.format(t=t), day=day.format(t=t),
                new=", ".join(f"NEW.{c}" for c in columns.split(", "))))
        # The SQL functions' insert as 0016 makes it, but decided by whichever unique key the body
        # table has: a call that waits on the swap's lock goes on, compiled, into the new tables.
        conn.exec_driver_sql(m.INSERT_V1.replace("ON CONFLICT (message_id, day)", "ON CONFLICT"))
        # Every row above the mark is written after the triggers, which copy it.
        conn.exec_driver_sql(f"CREATE TABLE {s}.progress AS SELECT 0::bigint AS copied, "
                             f"coalesce(max(seq), 0) AS mark FROM outbox_message_body")

    _locked(engine, triggers)


def abandon(engine: Engine) -> bool:
    """Undo `prepare`, whole or half done, under the same short lock: the schema, its triggers,
    the day columns, `outbox_day` and `outbox_id_day` go, and 0015's insert comes back.
    False, and nothing done, when nothing is prepared."""
    m = migration()
    with engine.connect() as conn:
        if conn.exec_driver_sql(f"SELECT to_regnamespace('{m.STAGING}')").scalar() is None:
            return False

    def undo(conn: Connection) -> None:
        conn.exec_driver_sql(f"LOCK TABLE {', '.join(m.TABLE_NAMES)} IN ACCESS EXCLUSIVE MODE")
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {m.STAGING} CASCADE")  # the triggers with their functions
        for name in m.TABLE_NAMES:
            # Only this version's library writes the column; the previous one's never names it.
            conn.exec_driver_sql(f"ALTER TABLE {name} DROP COLUMN IF EXISTS day")
        conn.exec_driver_sql(m.INSERT_V1_BEFORE)
        conn.exec_driver_sql("DROP FUNCTION IF EXISTS outbox_id_day(uuid); DROP TABLE IF EXISTS outbox_day")

    _locked(engine, undo)
    return True


def copy(engine: Engine, seconds: float, batch: int = BATCH) -> tuple[int, int]:
    """Copy the rows that predate the triggers, a batch per transaction, for up to `seconds`
    (resumable); returns (copied, mark)."""
    m = migration()
    s = m.STAGING
    deadline = time.monotonic() + seconds
    with engine.connect() as conn:
        t = conn.exec_driver_sql("SELECT quote_ident(current_schema())").scalar()
    hh = ", ".join(f"h.{c}" for c in HISTORY_COLUMNS.split(", "))
    statements = [text(q) for q in COPY.format(s=s, t=t, m=MESSAGE_COLUMNS, h=HISTORY_COLUMNS, hh=hh)
                  .split(";\n") if q.strip()]
    while True:
        with engine.connect() as conn:
            copied, mark = conn.exec_driver_sql(f"SELECT copied, mark FROM {s}.progress").one()
        if copied >= mark or time.monotonic() >= deadline:
            return copied, mark
        hi = min(copied + batch, mark)

        def one(conn: Connection) -> None:
            for q in statements:
                conn.execute(q, {"lo": copied, "hi": hi})
            conn.exec_driver_sql(f"UPDATE {s}.progress SET copied = {hi}")

        _locked(engine, one)
