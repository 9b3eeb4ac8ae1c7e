"""Move what never changes out of the row the relay updates: outbox_message_body.

The relay updates every outbox row twice (claim, outcome). PostgreSQL writes a
whole new row version for each update, and, since `status` feeds the partial
indexes, none of them is a HOT update: every index gets a new entry, and the
unique index on `message_id` checks the heap for each; the payload and that
index in the updated row made each update about twice as expensive
("Heap-Only Tuples (HOT)", PostgreSQL documentation, "Database Physical Storage").

So:
- `outbox_message_body (seq, message_id, payload, headers)`: written once at
  enqueue, never updated; owns the `seq` identity and the `message_id` unique
  key (the idempotency key); deleted with its message by the purge.
- `outbox_message` keeps the state (status, attempts, lease, errors, times) and
  the small immutable fields (channel, destination, type, key, and a copy of
  message_id for display), plus `payload_bytes`, the payload's size as JSON
  text, which the claim's byte budget reads instead of the payload.
- `outbox_message.seq` references `outbox_message_body.seq`: a state row never
  lacks its body. The claim and outcome updates never change `seq`, so the
  foreign key costs them nothing.
- A body never outlives its state row: deleting (or truncating) outbox_message
  deletes the bodies too, through a statement-level trigger, so a row
  deleted by hand cannot leave a body behind that would silently swallow a
  later enqueue of the same message id.
- Every role granted rights on outbox_message gets the same rights on
  outbox_message_body, so the relay's and the producers' users keep working.

Existing rows are copied; the dropped columns' space in old row versions is
reclaimed as rows are updated or purged (or by VACUUM FULL).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""
from alembic import op

from outbox_migrations.grants import copy_grants

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE outbox_message_body (
            seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            message_id uuid NOT NULL,
            payload    json NOT NULL,
            headers    json,
            CONSTRAINT outbox_message_body_message_id_key UNIQUE (message_id)
        )
        """
    )
    op.execute(
        "INSERT INTO outbox_message_body (seq, message_id, payload, headers) OVERRIDING SYSTEM VALUE "
        "SELECT seq, message_id, payload, headers FROM outbox_message"
    )
    # The body's identity continues where the message's left off.
    op.execute(
        "SELECT setval(pg_get_serial_sequence('outbox_message_body', 'seq'), "
        "greatest((SELECT max(seq) FROM outbox_message_body), "
        "pg_sequence_last_value(pg_get_serial_sequence('outbox_message', 'seq')::regclass), 1), true)"
    )
    op.execute("ALTER TABLE outbox_message ADD COLUMN payload_bytes integer")
    op.execute("UPDATE outbox_message SET payload_bytes = octet_length(payload::text)")
    op.execute(
        "ALTER TABLE outbox_message "
        "ALTER COLUMN payload_bytes SET NOT NULL, "
        "ADD CONSTRAINT outbox_message_payload_bytes_check CHECK (payload_bytes >= 0), "
        "ALTER COLUMN seq DROP IDENTITY, "
        "DROP CONSTRAINT outbox_message_message_id_key, "
        "DROP COLUMN payload, "
        "DROP COLUMN headers, "
        "ADD CONSTRAINT outbox_message_seq_fkey FOREIGN KEY (seq) REFERENCES outbox_message_body (seq)"
    )
    # Bodies go with their messages, whatever deletes them. One statement per
    # deleting statement; `seq = ANY(ARRAY(...))` reaches them through the
    # primary key (a join could hash the whole table).
    op.execute(
        """
        CREATE FUNCTION outbox_message_delete_bodies() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM outbox_message_body WHERE seq = ANY (ARRAY(SELECT seq FROM gone));
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_message_delete_bodies AFTER DELETE ON outbox_message "
        "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_delete_bodies()"
    )
    op.execute(
        """
        CREATE FUNCTION outbox_message_truncate_bodies() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM outbox_message_body;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_message_truncate_bodies AFTER TRUNCATE ON outbox_message "
        "FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_truncate_bodies()"
    )
    # The same rights on the bodies as on the messages, for every role but the owner.
    op.execute(copy_grants("outbox_message", "outbox_message_body"))


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_message_truncate_bodies ON outbox_message")
    op.execute("DROP TRIGGER outbox_message_delete_bodies ON outbox_message")
    op.execute("DROP FUNCTION outbox_message_truncate_bodies()")
    op.execute("DROP FUNCTION outbox_message_delete_bodies()")
    op.execute(
        "ALTER TABLE outbox_message "
        "DROP CONSTRAINT outbox_message_seq_fkey, "
        "ADD COLUMN payload json, "
        "ADD COLUMN headers json"
    )
    op.execute(
        "UPDATE outbox_message o SET payload = b.payload, headers = b.headers "
        "FROM outbox_message_body b WHERE b.seq = o.seq"
    )
    op.execute(
        "ALTER TABLE outbox_message "
        "ALTER COLUMN payload SET NOT NULL, "
        "DROP COLUMN payload_bytes, "
        "ADD CONSTRAINT outbox_message_message_id_key UNIQUE (message_id)"
    )
    op.execute("ALTER TABLE outbox_message ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY")
    op.execute(
        "SELECT setval(pg_get_serial_sequence('outbox_message', 'seq'), "
        "greatest((SELECT max(seq) FROM outbox_message), "
        "pg_sequence_last_value(pg_get_serial_sequence('outbox_message_body', 'seq')::regclass), 1), true)"
    )
    op.execute("DROP TABLE outbox_message_body")
