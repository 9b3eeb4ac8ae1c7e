"""Dropping a day locks the three parent tables only, not every partition under them.

`outbox_drop_day` (0016) took `LOCK TABLE ... IN ACCESS EXCLUSIVE MODE` on the parents, which
recurses into every partition: a vacuum of any partition (autovacuum's SHARE UPDATE EXCLUSIVE,
busy on the live partition and today's) then held it past the caller's short lock_timeout, and
the day was skipped run after run. Every write reaches a partition through its parent, so the
parents alone, locked first, keep writers out; the day's own partitions are locked by their
DROP. The function is replaced by its own definition, read from the database, with that one
statement changed (as 0013 does), so it keeps its signature, rights and every other line.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

PARENTS = "outbox_message, outbox_message_body, outbox_message_history IN ACCESS EXCLUSIVE MODE"
ONLY_PARENTS = "ONLY outbox_message, ONLY outbox_message_body, ONLY outbox_message_history IN ACCESS EXCLUSIVE MODE"

REPLACE = """
DO $do$
DECLARE
    def text := pg_get_functiondef(to_regprocedure('outbox_drop_day(int, timestamptz)'));
BEGIN
    IF def IS NULL OR strpos(def, 'LOCK TABLE {old};') = 0 THEN
        RAISE EXCEPTION 'outbox_drop_day: no LOCK TABLE {old}';
    END IF;
    EXECUTE replace(def, 'LOCK TABLE {old};', 'LOCK TABLE {new};');
END $do$
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(REPLACE.format(old=PARENTS, new=ONLY_PARENTS))


def downgrade() -> None:
    op.get_bind().exec_driver_sql(REPLACE.format(old=ONLY_PARENTS, new=PARENTS))
