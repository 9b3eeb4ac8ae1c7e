"""Store payload and headers as `json` (the text as written), not `jsonb`.

The relay only ever hands the stored JSON on as text (a stream entry's
`payload` field, an email's parts). With `jsonb` every claim rendered the
binary document back to text, once for the batch's byte budget and once for
the reply, a large part of the claim's cost. `json` still refuses invalid JSON at
insert ("JSON Types", PostgreSQL documentation), and what reaches a consumer
is now exactly what the producer serialised.

The type change rewrites the table under an ACCESS EXCLUSIVE lock: run it
when the outbox is small (drained and purged), as for any such migration.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE outbox_message "
        "ALTER COLUMN payload TYPE json USING payload::json, "
        "ALTER COLUMN headers TYPE json USING headers::json"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE outbox_message "
        "ALTER COLUMN payload TYPE jsonb USING payload::jsonb, "
        "ALTER COLUMN headers TYPE jsonb USING headers::jsonb"
    )
