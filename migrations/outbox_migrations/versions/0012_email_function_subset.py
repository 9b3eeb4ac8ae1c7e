"""The SQL email function cut back to a documented subset (docs/decisions/0054).

0011 made `outbox_enqueue_email_v1` take exactly what the Python API takes, by
repeating the `email` package's parsers, UTS 46, IDNA 2008 and Punycode in
plpgsql over a table of code points. This one replaces the function, under the
same `_v1` names and signatures, with structural checks, sizes and an ASCII
address grammar, and drops 0011's helpers and table. What it refuses beyond
the Python API's rules is listed in docs/producers.md, and each such refusal
says to use the Python API; whatever it writes, the Python API takes and
writes the same row.

- `outbox_enqueue_email_v1` is 0009's again: an attachment needs its
  `content_type`; Resent-*/Orig-Date headers and header values with `=?`
  (encoded words) are refused; the MIME size by 0009's bound of it.
- `outbox__address_v1` takes `address`, `<address>`, `Display Name <address>`
  or `"Quoted Name" <address>`: a dot-atom ASCII local part, an ASCII domain
  (no Punycode label), no encoded word in the display name.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""
import re
from importlib import import_module

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_0009 = import_module("outbox_migrations.versions.0009_enqueue_functions")
_0011 = import_module("outbox_migrations.versions.0011_email_functions_as_python")

ADDRESS = r"""
-- One mailbox of the ASCII grammar docs/producers.md lists, canonical as the Python
-- API's parse_address returns it; the rest is refused, naming the Python API.
CREATE OR REPLACE FUNCTION outbox__address_v1(field text, value text) RETURNS text
LANGUAGE plpgsql AS $f$
DECLARE
    v text;
    parts text[];
    display text;
    addr text;
    domain text;
BEGIN
    IF value IS NULL THEN PERFORM outbox__refuse_v1(field, 'must be a string'); END IF;
    IF value ~ 'CONTROL' THEN
        PERFORM outbox__refuse_v1(field, 'must not contain CR, LF, NUL or other control characters '
                                         '(header injection)');
    END IF;
    v := outbox__strip_v1(value);
    IF v = '' THEN PERFORM outbox__refuse_v1(field, 'must not be blank'); END IF;
    parts := regexp_match(v, '^(?:(?:"([^"\\]*)"|(ATOM+(?:[ \t]+ATOM+)*))[ \t]*)?<([^<>]*)>$');
    addr := coalesce(parts[3], v);
    display := coalesce(parts[1], regexp_replace(parts[2], '[ \t]+', ' ', 'g'));
    IF split_part(addr, '@', 2) ~ '[^\u0001-\u007f]' THEN
        PERFORM outbox__refuse_v1(field, 'has an internationalised domain, which this SQL function does not take: '
                                         'use the Python API (enqueue_email), which stores it as Punycode');
    END IF;
    IF addr !~ '^LOCAL@[A-Za-z0-9.-]+$' OR addr ~ '^=\?' THEN
        PERFORM outbox__refuse_v1(field, 'is not an address this SQL function takes: name@example.com, '
            '<name@example.com>, Display Name <name@example.com> or "Quoted Name" <name@example.com>, '
            'the address in ASCII (the Python API, enqueue_email, takes more forms)');
    END IF;
    IF display ~ '=\?' THEN
        PERFORM outbox__refuse_v1(field, 'has ''=?'' (an encoded word) in its display name, which this SQL '
                                         'function does not decode: use the Python API (enqueue_email)');
    END IF;
    IF length(split_part(addr, '@', 1)) > 64 THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (too long before the @-sign)');
    END IF;
    domain := lower(split_part(addr, '@', 2));
    IF domain !~ '^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign is not a domain name '
                                         'with a period)');
    END IF;
    IF domain ~ '(^|\.)[^.]{64}' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (a domain label is longer than 63)');
    END IF;
    IF domain ~ '(^|\.)xn--' THEN
        PERFORM outbox__refuse_v1(field, 'has a Punycode domain label, which this SQL function does not check: '
                                         'use the Python API (enqueue_email)');
    END IF;
    IF domain ~ '(^|\.)..--' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (two letters followed by two dashes '
                                         'start a domain label, except Punycode)');
    END IF;
    IF domain !~ '[a-z]$' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (not within a valid top-level domain)');
    END IF;
    IF domain ~ '(^|\.)(arpa|invalid|local|localhost|onion|test)$' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (a special-use or reserved name)');
    END IF;
    IF length(domain) > 253 OR length(addr) > 254 THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (too long)');
    END IF;
    addr := split_part(addr, '@', 1) || '@' || domain;
    IF coalesce(display, '') = '' THEN RETURN addr; END IF;
    -- headerregistry.Address quotes a display name holding a special.
    IF display ~ '[()<>@,:;.\\"\[\]]' THEN display := '"' || display || '"'; END IF;
    RETURN display || ' <' || addr || '>';
END $f$
"""
# A word of a display name: anything but RFC 5322's specials and what str.isspace() takes
# (the email package's parser drops such characters after a space).
_ATOM = r'[^()<>@,:;.\\"\[\]' + _0009._PY_SPACE[1:]
# A dot-atom local part of ASCII letters, digits and RFC 5322's atext symbols.
_LOCAL = r"[A-Za-z0-9!#$%&''*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&''*+/=?^_`{|}~-]+)*"


def upgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql(ADDRESS.replace("'CONTROL'", f"'{_0009._CONTROL}'").replace("ATOM", _ATOM)
                         .replace("LOCAL", _LOCAL))
    for statement in _0009.statements():
        if re.search(r"^CREATE FUNCTION outbox_enqueue_email_v1\(", statement, re.M):
            bind.exec_driver_sql(statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    for signature in _0011.CREATED:
        op.execute(f"DROP FUNCTION {signature}")
    op.execute("DROP TABLE outbox_idna_codepoint")


def downgrade() -> None:
    _0011.upgrade()
