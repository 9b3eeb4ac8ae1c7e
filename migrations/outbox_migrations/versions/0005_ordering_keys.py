"""Per-key ordering: the indexes the claim reads a key's head through, and the
`discarded` status for a dead letter an operator gives up on.

- `outbox_message_key_active_idx (channel, destination, key, seq)`, pending and
  leased rows with a key: the first of a key is its head; a message is claimed
  only after every earlier active message of its key (docs/design.md, "Per-key ordering").
- `outbox_message_key_dead_idx`, the same for dead rows: under the `block`
  policy a dead message holds the rest of its key until it is redriven or discarded.
- `outbox_message_discarded_idx (channel, dead_at)`: the retention purge of
  discarded messages, as `outbox_message_dead_idx` serves dead ones.

Rows without a key are in none of the new indexes, so their updates cost what
they did. Building the indexes takes a lock that holds writers back: run it
while the outbox is small, as for the earlier migrations.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

STATUSES = "('pending', 'leased', 'delivered', 'dead', 'discarded')"


def upgrade() -> None:
    op.execute("ALTER TABLE outbox_message DROP CONSTRAINT outbox_message_status_check")
    op.execute(f"ALTER TABLE outbox_message ADD CONSTRAINT outbox_message_status_check CHECK (status IN {STATUSES})")
    op.execute(
        "CREATE INDEX outbox_message_key_active_idx ON outbox_message (channel, destination, key, seq) "
        "WHERE key IS NOT NULL AND status IN ('pending', 'leased')"
    )
    op.execute(
        "CREATE INDEX outbox_message_key_dead_idx ON outbox_message (channel, destination, key, seq) "
        "WHERE key IS NOT NULL AND status = 'dead'"
    )
    op.execute(
        "CREATE INDEX outbox_message_discarded_idx ON outbox_message (channel, dead_at) WHERE status = 'discarded'"
    )


def downgrade() -> None:
    op.execute("DROP INDEX outbox_message_discarded_idx")
    op.execute("DROP INDEX outbox_message_key_dead_idx")
    op.execute("DROP INDEX outbox_message_key_active_idx")
    op.execute("UPDATE outbox_message SET status = 'dead' WHERE status = 'discarded'")
    op.execute("ALTER TABLE outbox_message DROP CONSTRAINT outbox_message_status_check")
    op.execute("ALTER TABLE outbox_message ADD CONSTRAINT outbox_message_status_check "
               "CHECK (status IN ('pending', 'leased', 'delivered', 'dead'))")
