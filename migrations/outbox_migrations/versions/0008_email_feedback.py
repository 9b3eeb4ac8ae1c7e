"""SES feedback: what happened to each email after SES accepted it, and the
suppression list (docs/decisions/0046-ses-feedback-through-sns.md, 0047-…).

- `outbox_email_event`: one row per SES event (Send, Delivery, Bounce,
  Complaint, Reject, Rendering Failure, DeliveryDelay) matched to its outbox
  message. `(ses_message_id, event_type, event_key)` is unique, so a redelivered
  event inserts nothing. Recipients are kept only as keyed hashes.
- `outbox_suppression`: addresses (keyed hashes) that bounced permanently or
  complained, or that an operator added, with the reason and the time.
- `outbox_message_ses_ref_idx`: finds a message by the SES message id the relay
  stored, for an event without the `outbox-message-id` tag. Partial (SES rows
  with a reference), so other channels' writes do not maintain it. It is built
  without CONCURRENTLY, as the earlier indexes were: it holds writes to the
  table while it reads the SES rows once.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

EVENT_TYPES = "('send', 'delivery', 'bounce', 'complaint', 'reject', 'rendering_failure', 'delivery_delay')"


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE outbox_email_event (
            id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            message_id      uuid        NOT NULL,
            ses_message_id  text        NOT NULL CHECK (ses_message_id <> ''),
            event_type      text        NOT NULL CHECK (event_type IN {EVENT_TYPES}),
            event_at        timestamptz NOT NULL,
            subtype         text,
            recipients      text[]      NOT NULL DEFAULT '{{}}',
            configuration_set text,
            event_key       text        NOT NULL,
            received_at     timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT outbox_email_event_once UNIQUE (ses_message_id, event_type, event_key)
        )
    """)
    op.execute("CREATE INDEX outbox_email_event_message_idx ON outbox_email_event (message_id, event_at)")
    op.execute("CREATE INDEX outbox_email_event_received_idx ON outbox_email_event (received_at)")
    op.execute("""
        CREATE TABLE outbox_suppression (
            address_hash  text        PRIMARY KEY CHECK (address_hash ~ '^[0-9a-f]{64}$'),
            reason        text        NOT NULL CHECK (reason IN ('bounce', 'complaint', 'manual')),
            detail        text,
            message_id    uuid,
            created_at    timestamptz NOT NULL DEFAULT now()
        )
    """)
    op.execute("CREATE INDEX outbox_message_ses_ref_idx ON outbox_message (delivery_ref) "
               "WHERE channel = 'ses' AND delivery_ref IS NOT NULL")


def downgrade() -> None:
    op.execute("DROP INDEX outbox_message_ses_ref_idx")
    op.execute("DROP TABLE outbox_suppression")
    op.execute("DROP TABLE outbox_email_event")
