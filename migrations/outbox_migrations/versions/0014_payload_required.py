"""A payload is required: the SQL enqueue functions refuse a NULL or JSON null
payload, as the Python API refuses None (docs/decisions/0057).

A null payload is what a payload left unset looks like, and was stored as JSON
null without a word. This replaces 0009's `outbox__check_json_v1`, which every
enqueue function calls on its payload at the point where the Python API makes
the payload's JSON text, under the same name and signature; the `_v1`
functions keep their arguments. tests/integration/test_sql_functions.py holds
both to the same field.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

CHECK_JSON = r"""
CREATE OR REPLACE FUNCTION outbox__check_json_v1(field text, value text, max_bytes int) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
{required}    BEGIN
        PERFORM value::jsonb;
    EXCEPTION WHEN untranslatable_character THEN
        PERFORM outbox__refuse_v1(field, 'must not contain the NUL character (\u0000)');
    END;
    IF octet_length(value) > max_bytes THEN
        PERFORM outbox__refuse_v1(field, format('is %s bytes as JSON; the limit is %s bytes',
                                                 octet_length(value), max_bytes));
    END IF;
END$f$
"""

REQUIRED = """    IF field = 'payload' AND value = 'null' THEN
        PERFORM outbox__refuse_v1(field, 'is required (a null payload is refused); send a JSON value such as {}');
    END IF;
"""


def upgrade() -> None:
    # To the driver as written (as 0009): the body holds percent signs.
    op.get_bind().exec_driver_sql(CHECK_JSON.replace("{required}", REQUIRED))


def downgrade() -> None:
    # 0009's function as it was, to the character.
    op.get_bind().exec_driver_sql(CHECK_JSON.replace("{required}", ""))
