"""The due index carries each row's part hash, so that a claim of a part passes the other parts'
rows in the index without reading them (docs/decisions/0074-…).

- `outbox_message_pending_due_idx` on the live partition gains a fourth column: the first 32 bits
  of the md5 of the row's key (of its seq's, as text, without a key), written exactly as
  relay.sql's `part_hash`, which the claim's condition must match to be an index condition. The
  order of the index is unchanged (seq is unique). It is built as
  `outbox_message_pending_due_new`, then swapped in by name. Writes to the live partition wait
  while it reads the undelivered rows, unless an operator built that index beforehand with
  CONCURRENTLY (operating.md): a valid one is taken as it is, an invalid one (a build that
  failed) dropped and built again.
- `outbox_poller.parts_by_range`: true for the pollers that take parts as ranges of that hash.
  Those of the version before took the hash modulo the live slots; while one is live, the
  others claim the whole channel, so that no key falls in no one's part during a deploy.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

PART_HASH = "(CAST(('x' || left(md5(coalesce(key, CAST(seq AS text))), 8)) AS bit(32))::bigint)"

DROP_INVALID = """
DO $do$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('outbox_message_pending_due_new')
                                        AND NOT indisvalid) THEN
        DROP INDEX outbox_message_pending_due_new;
    END IF;
END $do$
"""


def _swap(columns: str) -> None:
    conn = op.get_bind()
    conn.exec_driver_sql(DROP_INVALID)
    conn.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS outbox_message_pending_due_new ON outbox_message_live "
                         f"({columns}) WHERE status = 'pending'")
    conn.exec_driver_sql("DROP INDEX outbox_message_pending_due_idx")
    conn.exec_driver_sql("ALTER INDEX outbox_message_pending_due_new RENAME TO outbox_message_pending_due_idx")


def upgrade() -> None:
    _swap(f"channel, available_at, seq, {PART_HASH}")
    op.execute("ALTER TABLE outbox_poller ADD COLUMN parts_by_range boolean NOT NULL DEFAULT false")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox_poller DROP COLUMN parts_by_range")
    _swap("channel, available_at, seq")
