"""Dropping a day locks the three parent tables only, not every partition under them.

`outbox_drop_day` (0016) took `LOCK TABLE ... IN ACCESS EXCLUSIVE MODE` on the parents, which
recurses into every partition: a vacuum of any partition (autovacuum's SHARE UPDATE EXCLUSIVE,
busy on the live partition and today's) then held it past the caller's short lock_timeout, and
the day was skipped run after run. Every write reaches a partition through its parent, so the
parents alone, locked first, keep writers out; the day's own partitions are locked by their
DROP. Same signature, rights and order of locks otherwise.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

BODY = """
CREATE OR REPLACE FUNCTION outbox_drop_day(d int, keep_since timestamptz) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
DECLARE
    kept bigint[];
BEGIN
    IF d <= 0 THEN
        RETURN 0;
    END IF;
    -- The parents before their partitions, as every statement takes them (a partition first
    -- deadlocks with them); the caller's short lock_timeout makes this the side that gives way.
    -- Held, no statement writes the day meanwhile: a message enqueued while its day was open is here.
    LOCK TABLE {only}outbox_message, {only}outbox_message_body, {only}outbox_message_history IN ACCESS EXCLUSIVE MODE;
    -- Closed: an id of this day enqueued from now on goes to day 0.
    DELETE FROM outbox_day WHERE day = d;
    -- What must stay: messages not delivered yet, and those delivered within the window.
    kept := ARRAY(SELECT seq FROM outbox_message_live WHERE day = d
                  UNION
                  SELECT seq FROM outbox_message_done WHERE day = d AND delivered_at >= keep_since);
    UPDATE outbox_message SET day = 0 WHERE day = d AND seq = ANY (kept);
    UPDATE outbox_message_body SET day = 0 WHERE day = d AND seq = ANY (kept);
    UPDATE outbox_message_history SET day = 0 WHERE day = d AND seq = ANY (kept);
    EXECUTE format('DROP TABLE outbox_message_done_d%s, outbox_message_body_d%s, outbox_message_history_d%s',
                   d, d, d);
    RETURN cardinality(kept);
END $f$;
"""


def upgrade() -> None:
    op.execute(BODY.replace("{only}", "ONLY "))


def downgrade() -> None:
    op.execute(BODY.replace("{only}", ""))
