"""The outbox table and the partial indexes that serve the claim.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE outbox_message (
            seq               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            message_id        uuid        NOT NULL,
            channel           text        NOT NULL CHECK (channel IN ('redis', 'ses')),
            destination       text        NOT NULL CHECK (destination <> ''),
            type              text        NOT NULL CHECK (type <> ''),
            key               text,
            payload           jsonb       NOT NULL,
            headers           jsonb,
            status            text        NOT NULL DEFAULT 'pending'
                              CHECK (status IN ('pending', 'leased', 'delivered', 'dead')),
            attempts          integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            max_attempts      integer     CHECK (max_attempts IS NULL OR max_attempts >= 1),
            available_at      timestamptz NOT NULL DEFAULT now(),
            lease_owner       text,
            lease_expires_at  timestamptz,
            last_error        text,
            last_error_class  text,
            delivery_ref      text,
            created_at        timestamptz NOT NULL DEFAULT now(),
            delivered_at      timestamptz,
            dead_at           timestamptz,
            CONSTRAINT outbox_message_message_id_key UNIQUE (message_id),
            CONSTRAINT outbox_message_lease_shape CHECK (
                (status = 'leased') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
            )
        )
        """
    )
    # The claim's two branches, each served by its own partial index.
    op.execute(
        "CREATE INDEX outbox_message_pending_due_idx ON outbox_message "
        "(channel, available_at, seq) WHERE status = 'pending'"
    )
    op.execute(
        "CREATE INDEX outbox_message_lease_expiry_idx ON outbox_message "
        "(channel, lease_expires_at) WHERE status = 'leased'"
    )
    # Retention purge and dead-letter inspection.
    op.execute(
        "CREATE INDEX outbox_message_delivered_at_idx ON outbox_message "
        "(delivered_at) WHERE status = 'delivered'"
    )
    op.execute(
        "CREATE INDEX outbox_message_dead_idx ON outbox_message "
        "(channel, dead_at) WHERE status = 'dead'"
    )
    # Many rows change status quickly: leave room for HOT updates.
    op.execute("ALTER TABLE outbox_message SET (fillfactor = 80)")


def downgrade() -> None:
    op.execute("DROP TABLE outbox_message")
