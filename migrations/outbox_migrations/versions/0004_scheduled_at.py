"""Remember when a scheduled message was first due: `outbox_message.scheduled_at`.

Delivery lag is measured from the moment a message could first be delivered:
its `created_at`, or, for a message enqueued with `deliver_at`, that time.
`available_at` cannot tell it once a retry or a release has moved it, so the
enqueue keeps `deliver_at` here (NULL when the message was due at once). The
column is nullable and has no default, so adding it rewrites nothing.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE outbox_message ADD COLUMN scheduled_at timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox_message DROP COLUMN scheduled_at")
