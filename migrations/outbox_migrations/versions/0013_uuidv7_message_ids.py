"""Time-ordered message ids: `outbox_uuidv7()`, and the SQL enqueue functions
make an omitted message id with it (docs/decisions/0060).

`outbox_uuidv7()` returns a UUIDv7 (RFC 9562) in the layout the Python API's
ids follow (outbox_relay/ids.py): the Unix time in milliseconds, version 7, the
fraction of the millisecond in 1/4096 steps (method 3 of section 6.2; the
clock gives microseconds), variant 10, 62 random bits. Within a transaction an
id is never below the one before it.

The enqueue functions called gen_random_uuid() for an omitted message id. Each
is replaced by its own definition with that one call changed, read from the
database, so it keeps its name, signature, rights and every other line; the
downgrade changes it back. Ids already written (UUIDv4) are untouched: both are
`uuid` and compare as before.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UUIDV7 = """
CREATE FUNCTION outbox_uuidv7() RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $f$
DECLARE
    us bigint := floor(extract(epoch FROM clock_timestamp()) * 1000000);
    -- Unix milliseconds, then the fraction of the millisecond in 1/4096 steps.
    step bigint := ((us / 1000) << 12) | ((us % 1000) * 4096 / 1000);
    last bigint := nullif(current_setting('outbox.uuidv7_step', true), '')::bigint;
BEGIN
    -- Never below the transaction's last id (the same microsecond, a clock set back),
    -- so ids made in sequence sort in that order. Transaction-local: no session state.
    IF step <= last THEN
        step := last + 1;
    END IF;
    PERFORM set_config('outbox.uuidv7_step', step::text, true);
    -- The variant and rand_b are a UUIDv4's last 64 bits: 10, then 62 random bits.
    RETURN (lpad(to_hex(step >> 12), 12, '0') || '7' || lpad(to_hex(step & 4095), 3, '0')
            || right(gen_random_uuid()::text, 17))::uuid;
END $f$
"""

#: The functions that make a message id when the caller gives none.
MAKERS = ["outbox_enqueue_event_v1", "outbox__enqueue_aws_v1", "outbox_enqueue_eventbridge_v1",
          "outbox_enqueue_email_v1"]

REPLACE = """
DO $do$
DECLARE
    name text;
    def text;
BEGIN
    FOREACH name IN ARRAY ARRAY[{names}] LOOP
        def := pg_get_functiondef(to_regproc(name));
        IF def IS NULL OR strpos(def, '{old}') = 0 THEN
            RAISE EXCEPTION '%: no function that calls {old}', name;
        END IF;
        EXECUTE replace(def, '{old}', '{new}');
    END LOOP;
END $do$
"""


def _replace(old: str, new: str) -> str:
    return REPLACE.format(names=", ".join(f"'{n}'" for n in MAKERS), old=old, new=new)


def upgrade() -> None:
    # To the driver as written, as 0009 (percent signs in the bodies).
    bind = op.get_bind()
    bind.exec_driver_sql(UUIDV7)
    bind.exec_driver_sql(_replace("gen_random_uuid()", "outbox_uuidv7()"))


def downgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql(_replace("outbox_uuidv7()", "gen_random_uuid()"))
    bind.exec_driver_sql("DROP FUNCTION outbox_uuidv7()")
