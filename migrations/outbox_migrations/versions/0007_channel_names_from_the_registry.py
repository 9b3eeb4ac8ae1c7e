"""Which channels exist is the relay's registry's to say, not the schema's.

0001 pinned `CHECK (channel IN ('redis', 'ses'))` on `outbox_message`, so each
new channel needed a migration. The check goes: the producer API accepts only
channels listed in `publishers/registry.py` (decision 0041), and a relay claims
only its own channel's rows. Dropping a CHECK constraint rewrites nothing and
holds its ACCESS EXCLUSIVE lock only for the catalog change.

The downgrade puts the check back, validated: it fails while a message of
another channel is in the table (move or delete those first).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# PostgreSQL's name for 0001's unnamed column check (<table>_<column>_check).
CONSTRAINT = "outbox_message_channel_check"


def upgrade() -> None:
    op.execute(f"ALTER TABLE outbox_message DROP CONSTRAINT IF EXISTS {CONSTRAINT}")


def downgrade() -> None:
    op.execute(f"ALTER TABLE outbox_message ADD CONSTRAINT {CONSTRAINT} CHECK (channel IN ('redis', 'ses'))")
