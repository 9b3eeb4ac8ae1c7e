"""Several pollers per channel: each registration holds a slot of its channel.

A latency-mode channel keeps OUTBOX_POLLERS pollers (up to OUTBOX_POLLERS_MAX
while its backlog is old), each in a slot of its own. The handover happens
within a slot: a poller leaves for a newer one of its slot, and its successor
takes its slot (docs/design.md, "The poller handover"; decision 0063).

- `slot`: the registration's slot, 0 for every registration before this one
  (one poller per channel).
- `add_requested_at`: when the poller asked for a poller to be added to its
  channel because the backlog was old (so that one add is on its way at a time).

Adding a column with a constant default rewrites nothing: no lock held long.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE outbox_poller ADD COLUMN slot int NOT NULL DEFAULT 0, "
               "ADD COLUMN add_requested_at timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox_poller DROP COLUMN slot, DROP COLUMN add_requested_at")
