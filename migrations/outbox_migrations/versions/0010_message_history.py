"""A message's history: `outbox_message_history`, one row per attempt that did
not deliver and per later change (docs/decisions/0051-message-history-written-with-the-outcome.md).

Rows are written by the statements that change a message, in the same
statement, so the relay's round trips stay what they were: the outcome write
(retry, dead, released, ambiguous), the claim (a lease that expired), the
feedback function (an ambiguous send settled by an SES event), and the
operators' redrive and discard. A delivery writes no row: the message row
holds it (delivered_at, delivery_ref), and `outbox show ID` adds it as the
last line.

- `attempt`: the attempt the row ends (the message's count when it was made;
  a released attempt is refunded afterwards); NULL for an operator's action.
- `next_at`: when the message is due again, for outcomes that leave it pending.
- `ref`: the SES message id that settled an ambiguous send.
- `actor`: the lease owner that made the attempt, `feedback`, or `operator`.

History goes with its message: a statement trigger deletes the rows of the
messages a statement deleted (the retention purges), as bodies go. The same
rights as on `outbox_message` are granted on the table, so a role that can
record outcomes or purge can still do so. The table is new: creating it holds
no lock on the outbox beyond the triggers' creation.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""
from alembic import op

from outbox_migrations.grants import copy_grants

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

EVENTS = "'retry', 'dead', 'released', 'ambiguous', 'lease_expired', 'settled', 'redriven', 'discarded'"


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE outbox_message_history (
            seq          bigint      NOT NULL,
            id           bigint      GENERATED ALWAYS AS IDENTITY,
            at           timestamptz NOT NULL DEFAULT now(),
            event        text        NOT NULL CHECK (event IN ({EVENTS})),
            attempt      integer,
            error_class  text,
            error        text,
            ref          text,
            actor        text,
            next_at      timestamptz,
            PRIMARY KEY (seq, id)
        )
    """)
    # One statement per deleting statement, through the primary key's leading column.
    op.execute("""
        CREATE FUNCTION outbox_message_delete_history() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM outbox_message_history WHERE seq = ANY (ARRAY(SELECT seq FROM gone));
            RETURN NULL;
        END
        $$
    """)
    op.execute("CREATE TRIGGER outbox_message_delete_history AFTER DELETE ON outbox_message "
               "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_delete_history()")
    op.execute("""
        CREATE FUNCTION outbox_message_truncate_history() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM outbox_message_history;
            RETURN NULL;
        END
        $$
    """)
    op.execute("CREATE TRIGGER outbox_message_truncate_history AFTER TRUNCATE ON outbox_message "
               "FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_truncate_history()")
    # Whoever may change or delete messages writes or deletes their history in the same statement.
    op.execute(copy_grants("outbox_message", "outbox_message_history"))


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_message_truncate_history ON outbox_message")
    op.execute("DROP TRIGGER outbox_message_delete_history ON outbox_message")
    op.execute("DROP FUNCTION outbox_message_truncate_history()")
    op.execute("DROP FUNCTION outbox_message_delete_history()")
    op.execute("DROP TABLE outbox_message_history")
