"""The due index carries each row's part hash, so that a claim of a part passes the other parts'
rows in the index without reading them (docs/decisions/0074-…).

`outbox_message_pending_due_idx` on the live partition gains a fourth column: the first 32 bits of
the md5 of the row's key (of its seq's, as text, without a key), written exactly as relay.sql's
`part_hash`, which the claim's condition must match to be an index condition. The order of the
index is unchanged (seq is unique). Built beside the old one, then swapped by name in the same
transaction: writes to the live partition wait while it reads the undelivered rows once, as the
earlier indexes were built (0008).

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


def _swap(columns: str) -> None:
    conn = op.get_bind()
    conn.exec_driver_sql(f"CREATE INDEX outbox_message_pending_due_new ON outbox_message_live ({columns}) "
                         "WHERE status = 'pending'")
    conn.exec_driver_sql("DROP INDEX outbox_message_pending_due_idx")
    conn.exec_driver_sql("ALTER INDEX outbox_message_pending_due_new RENAME TO outbox_message_pending_due_idx")


def upgrade() -> None:
    _swap(f"channel, available_at, seq, {PART_HASH}")


def downgrade() -> None:
    _swap("channel, available_at, seq")
