"""Email from SQL as from Python: the parts of `outbox_enqueue_email_v1` that
took only a subset of what the Python API takes (docs/decisions/0052).

Migration 0009's email function refused, saying "this function", what only
the Python API took. This one replaces it, and the helpers it uses, under the
same names and signatures (a `_v1` statement keeps working) with functions
that take what Python takes and write the same row:

- an attachment without `content_type` gets the type guessed from its file
  name, by the table in outbox_relay/email/content_types.txt, which Python
  reads too (and no longer the machine's /etc/mime.types);
- addresses follow one grammar (addresses.MAILBOX_PATTERN), display names
  read as the email package reads them: quoted strings with escapes, encoded
  words, Unicode;
- custom header values are read as the email package reads them: encoded
  words (UTF-8 or US-ASCII, well-formed), Resent-Date and Orig-Date as
  RFC 5322 dates, the Resent-* address headers as lists of addresses.
- internationalised and Punycode domains are checked as email-validator and
  idna check them and stored in ASCII form; the data of each code point is
  the table outbox_idna_codepoint, filled here from those libraries and
  unicodedata.

The MIME size is refused by 0009's bound.

Frozen: the constants it writes into the functions are below as they were, and
the tables it fills (content types, IDNA code points, computed then from
`idna`, `email-validator` and `unicodedata`) are `0011_tables.json.gz` beside
it, so it makes the same schema whatever library is installed. Migration 0012
cuts the function back to a documented subset and drops what this one added
(docs/decisions/0054).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""
import gzip
import json
import re
from importlib import import_module
from pathlib import Path

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_0009 = import_module("outbox_migrations.versions.0009_enqueue_functions")

ADDR_SPEC_PATTERN = r'(?!=\?)[^ \t()<>@,:;\\"\[\]]+@(?!=\?)[^ \t()<>@,:;\\"\[\]]+'
PHRASE_PATTERN = r'(?:"(?:[^"\\]|\\.)*"|=\?[^? \t]*\?[bBqQ]\?[^? \t]*\?=|[^ \t()<>@,:;.\\"\[\]]|[ \t])+'
MAILBOX_PATTERN = rf"^(?:{ADDR_SPEC_PATTERN}|(?:{PHRASE_PATTERN})?<{ADDR_SPEC_PATTERN}>)$"
NOT_IN_GRAMMAR = ('is not a well-formed address in a form taken here: address, <address>, Display Name <address> '
                  'or "Quoted Name" <address> (no comments, no encoded word in the address)')
DATE_PATTERN = (r"^(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), +)?[0-9]{1,2} +(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct"
                r"|Nov|Dec) +(?:19|[2-9][0-9])[0-9]{2} +[0-9]{2}:[0-9]{2}(?::[0-9]{2})? +[+-][0-9]{4}$")
EMPTY_GROUP_PATTERN = r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?: [A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*:;$"
DEFAULT_CONTENT_TYPE = "application/octet-stream"


def tables() -> dict:
    """The content-type table and the IDNA code point rows, as this migration first wrote them."""
    with gzip.open(Path(__file__).with_name("0011_tables.json.gz"), "rt", encoding="utf-8") as f:
        return json.load(f)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


HELPERS = r"""
-- outbox_relay.email.content_types.guess_content_type: the extension as os.path.splitext
-- finds it (after the last dot that has something other than dots before it), ASCII
-- letters without case, looked up in the table of content_types.txt (filled in below).
CREATE OR REPLACE FUNCTION outbox__guess_content_type_v1(filename text) RETURNS text
LANGUAGE sql IMMUTABLE AS $f$
    SELECT coalesce(CASE WHEN e.ext ~ '^[\u0001-\u007f]*$' THEN CONTENT_TYPES ->> lower(e.ext COLLATE "C") END,
                    DEFAULT_CONTENT_TYPE)
      FROM (SELECT substring(filename FROM '^\.*[^.].*\.([^.]*)$') AS ext) e
$f$;
"""

HELPERS += r"""
-- One RFC 2047 encoded word at the start of `value`, as the email package's
-- get_encoded_word reads it: kind 'none' when it is not one at all (no '?='),
-- 'invalid' when the package gives up on it and reads it as text, else 'ok'
-- with the decoded text, what follows it, and the first defect (or the charset
-- rule of addresses.encoded_word_problem) as `problem`.
CREATE OR REPLACE FUNCTION outbox__encoded_word_v1(value text, OUT kind text, OUT decoded text, OUT rest text,
                                                   OUT problem text)
LANGUAGE plpgsql IMMUTABLE AS $f$
DECLARE
    s text := substr(value, 3);
    p int := strpos(s, '?=');
    tok text;
    parts text[];
    charset text;
    body text;
    hex text := '';
    raw bytea;
    i int := 1;
BEGIN
    IF left(value, 2) <> '=?' OR p = 0 THEN kind := 'none'; RETURN; END IF;
    tok := left(s, p - 1);
    rest := substr(s, p + 2);
    -- A '?=' followed by two hex digits may be a Q escape (=XX) after the encoding's '?'.
    IF rest ~ '^[0-9A-Fa-f]{2}' AND length(tok) - length(replace(tok, '?', '')) < 2 THEN
        p := strpos(rest, '?=');
        IF p = 0 THEN
            tok := tok || '?=' || rest;
            rest := '';
        ELSE
            tok := tok || '?=' || left(rest, p - 1);
            rest := substr(rest, p + 2);
        END IF;
    END IF;
    parts := string_to_array(tok, '?');
    IF cardinality(parts) <> 3 OR parts[2] !~ '^[qQbB]$' OR parts[3] ~ '[^\u0001-\u007f]' THEN
        kind := 'invalid';
        RETURN;
    END IF;
    kind := 'ok';
    charset := lower(split_part(parts[1], '*', 1));
    body := parts[3];
    IF tok ~ 'PYNOSPACEPYSPACE+PYNOSPACE' THEN problem := 'has whitespace inside an encoded word'; RETURN; END IF;
    IF lower(parts[2]) = 'b' THEN
        IF body !~ '^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$' THEN
            problem := 'has an encoded word that is not well-formed base64';
            RETURN;
        END IF;
        raw := decode(body, 'base64');
    ELSE
        body := replace(body, '_', ' ');
        WHILE i <= length(body) LOOP
            IF substr(body, i, 3) ~ '^=[0-9A-Fa-f]{2}$' THEN
                hex := hex || substr(body, i + 1, 2);
                i := i + 3;
            ELSE
                hex := hex || lpad(to_hex(ascii(substr(body, i, 1))), 2, '0');
                i := i + 1;
            END IF;
        END LOOP;
        raw := decode(hex, 'hex');
    END IF;
    IF charset NOT IN ('utf-8', 'us-ascii') THEN
        problem := 'has an encoded word (=?charset?…?=) in a charset other than UTF-8 or US-ASCII';
        RETURN;
    END IF;
    BEGIN
        decoded := convert_from(raw, 'UTF8');
    EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
        problem := 'has an encoded word whose bytes are not ' || upper(charset) || ' text (or hold NUL)';
        RETURN;
    END;
    IF charset = 'us-ascii' AND decoded ~ '[^\u0001-\u007f]' THEN
        problem := 'has an encoded word whose bytes are not US-ASCII text';
        RETURN;
    END IF;
    -- Control characters in the text, except where a space or tab starts a run of whitespace.
    IF regexp_replace(decoded, '[ \t]PYSPACE*', '', 'g') ~ '[\u0001-\u0008\u000a-\u001f\u007f]' THEN
        problem := 'has an encoded word that decodes to control characters';
        RETURN;
    END IF;
    IF rest <> '' AND left(rest, 1) NOT IN (' ', E'\t') THEN
        problem := 'has an encoded word not followed by whitespace';
    END IF;
END $f$;

-- Why an unstructured header value has a defect (NULL: none), read as the email
-- package's get_unstructured reads it: whitespace, encoded words, and text up
-- to the next space or tab, cut before an encoded word it holds.
CREATE OR REPLACE FUNCTION outbox__unstructured_problem_v1(value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $f$
DECLARE
    v text := value;
    last_ text;
    ew record;
    tok text;
    valid_ew boolean;
BEGIN
    WHILE v <> '' LOOP
        IF left(v, 1) IN (' ', E'\t') THEN
            v := substr(v, length(substring(v FROM '^[ \t]PYSPACE*')) + 1);
            last_ := 'fws';
            CONTINUE;
        END IF;
        valid_ew := true;
        IF left(v, 2) = '=?' THEN
            ew := outbox__encoded_word_v1(v);
            IF ew.kind = 'invalid' THEN
                valid_ew := false;
            ELSIF ew.kind = 'ok' THEN
                IF ew.problem IS NOT NULL THEN RETURN ew.problem; END IF;
                IF last_ IS NOT NULL AND last_ <> 'fws' THEN
                    RETURN 'has an encoded word not preceded by whitespace';
                END IF;
                v := ew.rest;
                last_ := 'ew';
                CONTINUE;
            END IF;
        END IF;
        tok := substring(v FROM '^[^ \t]*');
        IF valid_ew AND tok ~ '=\?[^?]*\?[qQbB]\?.*?\?=' THEN
            tok := split_part(v, '=?', 1);
        END IF;
        IF tok = '' THEN RAISE EXCEPTION 'unstructured header: no progress'; END IF;  -- cannot happen
        v := substr(v, length(tok) + 1);
        last_ := 'vtext';
    END LOOP;
    RETURN NULL;
END $f$;

-- headers.split_address_list: commas inside a quoted string do not separate.
CREATE OR REPLACE FUNCTION outbox__split_address_list_v1(value text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $f$
DECLARE
    items text[] := '{}';
    start_ int := 1;
    quoted boolean := false;
    escaped boolean := false;
    ch text;
BEGIN
    FOR i IN 1 .. length(value) LOOP
        ch := substr(value, i, 1);
        IF quoted THEN
            IF escaped THEN escaped := false;
            ELSIF ch = '\' THEN escaped := true;
            ELSIF ch = '"' THEN quoted := false;
            END IF;
        ELSIF ch = '"' THEN
            quoted := true;
        ELSIF ch = ',' THEN
            items := items || substr(value, start_, i - start_);
            start_ := i + 1;
        END IF;
    END LOOP;
    RETURN items || substr(value, start_);
END $f$;

-- headers.header_problem for a custom header: a date as DATE_PATTERN and a valid
-- time, addresses as the recipient fields take them, else an unstructured value.
CREATE OR REPLACE FUNCTION outbox__header_value_problem_v1(name text, value text) RETURNS text
LANGUAGE plpgsql AS $f$
DECLARE
    lower_ text := lower(name);
    d text[];
    zone int;
    items text[];
    msg text;
BEGIN
    IF lower_ IN ('resent-date', 'orig-date') THEN
        IF value !~ 'DATE_PATTERN' THEN
            RETURN 'must be an RFC 5322 date such as ''Tue, 1 Jul 2003 10:52:37 +0200'' (numeric zone, no comments)';
        END IF;
        -- email.utils.parsedate_to_datetime: a real day and time, a zone under 24 hours.
        d := regexp_match(value, '([0-9]+) +([A-Z][a-z]{2}) +([0-9]{4}) +([0-9]{2}):([0-9]{2})(?::([0-9]{2}))? +[+-]([0-9]{4})$');
        zone := d[7]::int;
        IF d[1]::int < 1 OR d[1]::int > extract(day FROM make_date(d[3]::int, (strpos('JanFebMarAprMayJunJulAugSepOctNovDec',
                d[2]) + 2) / 3, 1) + interval '1 month' - interval '1 day')
           OR d[4]::int > 23 OR d[5]::int > 59 OR coalesce(d[6], '0')::int > 59
           OR (zone / 100) * 3600 + (zone % 100) * 60 >= 86400 THEN
            RETURN format('does not parse as a %s header (InvalidDateDefect)', name);
        END IF;
        RETURN NULL;
    END IF;
    IF lower_ IN ('resent-from', 'resent-sender', 'resent-to', 'resent-cc', 'resent-bcc') THEN
        IF lower_ NOT IN ('resent-from', 'resent-sender') AND value ~ 'EMPTY_GROUP_PATTERN' THEN RETURN NULL; END IF;
        items := outbox__split_address_list_v1(value);
        IF lower_ = 'resent-sender' AND cardinality(items) <> 1 THEN RETURN 'must be one address'; END IF;
        FOR i IN 1 .. cardinality(items) LOOP
            BEGIN
                PERFORM outbox__address_v1('headers', items[i]);
            EXCEPTION WHEN SQLSTATE 'OB001' THEN
                GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
                RETURN format('address %s %s', i - 1, substr(msg, length('headers: ') + 1));
            END;
        END LOOP;
        RETURN NULL;
    END IF;
    RETURN outbox__unstructured_problem_v1(value);
END $f$;
"""

HELPERS += r"""
-- A decoded encoded word's text as the email package's value of it: a run of
-- whitespace that starts with a space or a tab is one space.
CREATE OR REPLACE FUNCTION outbox__ew_value_v1(decoded text) RETURNS text
LANGUAGE sql IMMUTABLE AS $f$ SELECT regexp_replace(decoded, '[ \t]PYSPACE*', ' ', 'g') $f$;

-- One mailbox, canonical as outbox_relay.email.addresses.parse_address returns it:
-- MAILBOX_PATTERN, then the display name as the email package's phrase parser
-- reads it (words: atoms, quoted strings with their escapes, encoded words; a
-- space between words that whitespace separates), then email-validator's rules.
CREATE OR REPLACE FUNCTION outbox__address_v1(field text, value text) RETURNS text
LANGUAGE plpgsql AS $f$
DECLARE
    v text;
    addr text;
    tail int;
    rest text;
    display text := '';
    gap boolean := false;
    words int := 0;
    ew record;
    kind text;
    run text;
    ch text;
    escaped boolean;
    local_ text;
    domain text;
BEGIN
    IF value IS NULL THEN PERFORM outbox__refuse_v1(field, 'must be a string'); END IF;
    IF value ~ 'CONTROL' THEN
        PERFORM outbox__refuse_v1(field, 'must not contain CR, LF, NUL or other control characters '
                                         '(header injection)');
    END IF;
    v := outbox__strip_v1(value);
    IF v = '' THEN PERFORM outbox__refuse_v1(field, 'must not be blank'); END IF;
    IF v !~ 'MAILBOX_PATTERN' THEN
        PERFORM outbox__refuse_v1(field, 'NOT_IN_GRAMMAR');
    END IF;
    IF v ~ '^ADDR_SPEC_PATTERN$' THEN
        addr := v;
    ELSE
        addr := substring(v FROM '<(ADDR_SPEC_PATTERN)>$');
        tail := length(addr) + 2;  -- '<' address '>'
        rest := v;
        -- The display name: each pass reads whitespace or one word of what is left before '<'.
        WHILE length(rest) > tail LOOP
            IF left(rest, 1) IN (' ', E'\t') THEN
                run := substring(rest FROM '^[ \t]PYSPACE*');
                rest := substr(rest, length(run) + 1);
                gap := words > 0;  -- a space between words; none before the first or after the last
                CONTINUE;
            END IF;
            IF gap THEN display := display || ' '; gap := false; END IF;
            words := words + 1;
            IF left(rest, 1) = '"' THEN
                -- A quoted string: whitespace as written, a backslash escapes the next character
                -- (one before a space or tab is dropped), an encoded word is a defect.
                rest := substr(rest, 2);
                LOOP
                    IF rest = '' THEN PERFORM outbox__refuse_v1(field, 'is not a well-formed address'); END IF;
                    IF left(rest, 1) = '"' THEN rest := substr(rest, 2); EXIT; END IF;
                    IF left(rest, 1) IN (' ', E'\t') THEN
                        run := substring(rest FROM '^[ \t]PYSPACE*');
                        display := display || run;
                        rest := substr(rest, length(run) + 1);
                        CONTINUE;
                    END IF;
                    IF left(rest, 2) = '=?' AND (outbox__encoded_word_v1(rest)).kind = 'ok' THEN
                        PERFORM outbox__refuse_v1(field, 'is not a well-formed address (an encoded word inside '
                                                         'a quoted string)');
                    END IF;
                    escaped := false;
                    LOOP  -- up to the next space or tab, or the closing quote
                        ch := left(rest, 1);
                        EXIT WHEN ch = '' OR ch IN (' ', E'\t') OR (ch = '"' AND NOT escaped);
                        IF ch = '\' AND NOT escaped THEN
                            escaped := true;
                        ELSE
                            display := display || ch;
                            escaped := false;
                        END IF;
                        rest := substr(rest, 2);
                    END LOOP;
                END LOOP;
            ELSE
                kind := NULL;
                IF left(rest, 2) = '=?' THEN
                    ew := outbox__encoded_word_v1(rest);
                    kind := ew.kind;
                END IF;
                IF kind = 'ok' THEN
                    IF ew.problem IS NOT NULL THEN
                        PERFORM outbox__refuse_v1(field, CASE WHEN ew.problem LIKE '%charset%' THEN ew.problem
                                                              ELSE 'is not a well-formed address' END);
                    END IF;
                    display := display || outbox__ew_value_v1(ew.decoded);
                    rest := ew.rest;
                ELSE
                    run := substring(rest FROM '^[^ \t()<>@,:;.\\"\[\]]+');
                    IF run IS NULL THEN PERFORM outbox__refuse_v1(field, 'is not a well-formed address'); END IF;
                    display := display || run;
                    rest := substr(rest, length(run) + 1);
                END IF;
            END IF;
        END LOOP;
    END IF;
    IF strpos(addr, '@') = 0 THEN PERFORM outbox__refuse_v1(field, 'is not a well-formed address'); END IF;
    local_ := left(addr, length(addr) - strpos(reverse(addr), '@'));
    domain := right(addr, strpos(reverse(addr), '@') - 1);
    IF local_ !~ '^[A-Za-z0-9!#$%&''*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&''*+/=?^_`{|}~-]+)*$' THEN
        PERFORM outbox__refuse_v1(field, CASE WHEN local_ ~ '[^\u0001-\u007f]'
            THEN 'has a non-ASCII local part (before the @), which SES does not accept'
            ELSE 'is not a well-formed address' END);
    END IF;
    IF length(local_) > 64 THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (too long before the @-sign)');
    END IF;
    -- The email package's Domain.domain drops whitespace (str.split), which atoms may hold.
    domain := outbox__domain_v1(field, local_, regexp_replace(domain, 'PYSPACE', '', 'g'));
    addr := local_ || '@' || domain;
    IF display = '' THEN RETURN addr; END IF;
    -- headerregistry.Address quotes a display name holding a special, escaping '\' and '"'.
    IF display ~ '[()<>@,:;.\\"\[\]]' THEN
        display := '"' || replace(replace(display, '\', '\\'), '"', '\"') || '"';
    END IF;
    RETURN display || ' <' || addr || '>';
END $f$;
"""

IDNA = r"""
-- One code point's data for the IDNA rules (the row whose range holds it).
CREATE OR REPLACE FUNCTION outbox__codepoint_v1(cp int) RETURNS outbox_idna_codepoint
LANGUAGE sql STABLE AS $f$
    SELECT * FROM outbox_idna_codepoint WHERE lo <= cp ORDER BY lo DESC LIMIT 1
$f$;

-- RFC 3492 Punycode, as Python's "punycode" codec writes it.
CREATE OR REPLACE FUNCTION outbox__punycode_adapt_v1(delta bigint, points int, first_ boolean) RETURNS int
LANGUAGE plpgsql IMMUTABLE AS $f$
DECLARE
    k int := 0;
BEGIN
    delta := CASE WHEN first_ THEN delta / 700 ELSE delta / 2 END;
    delta := delta + delta / points;
    WHILE delta > 455 LOOP
        delta := delta / 35;
        k := k + 36;
    END LOOP;
    RETURN k + (36 * delta) / (delta + 38);
END $f$;

CREATE OR REPLACE FUNCTION outbox__punycode_encode_v1(label text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $f$
DECLARE
    cps int[] := ARRAY(SELECT ascii(cc) FROM regexp_split_to_table(label, '') WITH ORDINALITY AS u(cc, o) ORDER BY o);
    out text := '';
    n int := 128;
    delta bigint := 0;
    bias int := 72;
    b int;
    h int;
    m int;
    q bigint;
    k int;
    t int;
    c int;
    d int;
BEGIN
    SELECT string_agg(chr(x), '' ORDER BY o) INTO out FROM unnest(cps) WITH ORDINALITY AS u(x, o) WHERE x < 128;
    out := coalesce(out, '');
    b := length(out);
    h := b;
    IF b > 0 THEN out := out || '-'; END IF;
    WHILE h < cardinality(cps) LOOP
        SELECT min(x) INTO m FROM unnest(cps) AS x WHERE x >= n;
        delta := delta + (m - n)::bigint * (h + 1);
        n := m;
        FOREACH c IN ARRAY cps LOOP
            IF c < n THEN delta := delta + 1; END IF;
            IF c = n THEN
                q := delta;
                k := 36;
                LOOP
                    t := CASE WHEN k <= bias THEN 1 WHEN k >= bias + 26 THEN 26 ELSE k - bias END;
                    EXIT WHEN q < t;
                    d := t + ((q - t) % (36 - t))::int;
                    out := out || chr(CASE WHEN d < 26 THEN 97 + d ELSE 22 + d END);
                    q := (q - t) / (36 - t);
                    k := k + 36;
                END LOOP;
                out := out || chr(CASE WHEN q < 26 THEN 97 + q::int ELSE 22 + q::int END);
                bias := outbox__punycode_adapt_v1(delta, h + 1, h = b);
                delta := 0;
                h := h + 1;
            END IF;
        END LOOP;
        delta := delta + 1;
        n := n + 1;
    END LOOP;
    RETURN out;
END $f$;

-- NULL when `s` is not Punycode (a code point past U+10FFFF, a surrogate, a bad digit, cut short).
CREATE OR REPLACE FUNCTION outbox__punycode_decode_v1(s text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $f$
DECLARE
    pos int := length(s) - strpos(reverse(s), '-') + 1;
    out int[];
    ext text;
    n numeric := 128;
    i numeric := 0;
    bias int := 72;
    idx int := 1;
    oldi numeric;
    w numeric;
    k int;
    t int;
    digit int;
    ch int;
BEGIN
    IF strpos(s, '-') = 0 THEN
        out := '{}';
        ext := s;
    ELSE
        out := ARRAY(SELECT ascii(cc) FROM regexp_split_to_table(left(s, pos - 1), '') WITH ORDINALITY AS u(cc, o)
                      ORDER BY o);
        IF left(s, pos - 1) = '' THEN out := '{}'; END IF;
        ext := substr(s, pos + 1);
    END IF;
    WHILE idx <= length(ext) LOOP
        oldi := i;
        w := 1;
        k := 36;
        LOOP
            IF idx > length(ext) THEN RETURN NULL; END IF;
            ch := ascii(upper(substr(ext, idx, 1)));
            idx := idx + 1;
            digit := CASE WHEN ch BETWEEN 65 AND 90 THEN ch - 65 WHEN ch BETWEEN 48 AND 57 THEN ch - 22 END;
            IF digit IS NULL THEN RETURN NULL; END IF;
            i := i + digit * w;
            t := CASE WHEN k <= bias THEN 1 WHEN k >= bias + 26 THEN 26 ELSE k - bias END;
            EXIT WHEN digit < t;
            w := w * (36 - t);
            k := k + 36;
        END LOOP;
        IF i - oldi > 9223372036854775807 THEN RETURN NULL; END IF;  -- far past U+10FFFF
        bias := outbox__punycode_adapt_v1((i - oldi)::bigint, cardinality(out) + 1, oldi = 0);
        n := n + div(i, cardinality(out) + 1);
        i := mod(i, cardinality(out) + 1);
        IF n > 1114111 OR n BETWEEN 55296 AND 57343 OR n = 0 THEN RETURN NULL; END IF;
        out := out[1:i] || n::int || out[i + 1:];
        i := i + 1;
    END LOOP;
    RETURN (SELECT coalesce(string_agg(chr(x), '' ORDER BY o), '') FROM unnest(out) WITH ORDINALITY AS u(x, o));
END $f$;

-- idna.check_bidi (RFC 5893), for one label: true when it holds.
CREATE OR REPLACE FUNCTION outbox__check_bidi_v1(label text, check_ltr boolean) RETURNS boolean
LANGUAGE plpgsql STABLE AS $f$
DECLARE
    dirs text[] := ARRAY(SELECT (outbox__codepoint_v1(ascii(cc))).bidi
                           FROM regexp_split_to_table(label, '') WITH ORDINALITY AS u(cc, o) ORDER BY o);
    rtl boolean;
    valid_ending boolean := false;
    number_type text;
    d text;
BEGIN
    IF array_position(dirs, NULL) IS NOT NULL THEN RETURN false; END IF;
    IF NOT check_ltr AND NOT dirs && ARRAY['R', 'AL', 'AN'] THEN RETURN true; END IF;
    IF dirs[1] IN ('R', 'AL') THEN rtl := true;
    ELSIF dirs[1] = 'L' THEN rtl := false;
    ELSE RETURN false;
    END IF;
    FOREACH d IN ARRAY dirs LOOP
        IF rtl THEN
            IF d NOT IN ('EN', 'ES', 'ET', 'ON', 'AN', 'NSM', 'AL', 'BN', 'R', 'CS') THEN RETURN false; END IF;
            IF d IN ('R', 'AL', 'EN', 'AN') THEN valid_ending := true;
            ELSIF d <> 'NSM' THEN valid_ending := false;
            END IF;
            IF d IN ('EN', 'AN') THEN
                IF number_type IS NULL THEN number_type := d;
                ELSIF number_type <> d THEN RETURN false;
                END IF;
            END IF;
        ELSE
            IF d NOT IN ('EN', 'ES', 'ET', 'ON', 'NSM', 'BN', 'CS', 'L') THEN RETURN false; END IF;
            IF d IN ('L', 'EN') THEN valid_ending := true;
            ELSIF d <> 'NSM' THEN valid_ending := false;
            END IF;
        END IF;
    END LOOP;
    RETURN valid_ending;
END $f$;

-- idna.check_label (IDNA 2008, RFC 5891 and 5892): true when the label is valid.
CREATE OR REPLACE FUNCTION outbox__check_label_v1(label text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $f$
DECLARE
    cps int[] := ARRAY(SELECT ascii(cc) FROM regexp_split_to_table(label, '') WITH ORDINALITY AS u(cc, o) ORDER BY o);
    len int := cardinality(cps);
    r outbox_idna_codepoint;
    p outbox_idna_codepoint;
    cp int;
    j int;
    ok boolean;
BEGIN
    IF label = '' OR len > 254 OR normalize(label, NFC) <> label THEN RETURN false; END IF;
    IF substr(label, 3, 2) = '--' OR left(label, 1) = '-' OR right(label, 1) = '-' THEN RETURN false; END IF;
    IF (outbox__codepoint_v1(cps[1])).category LIKE 'M%' THEN RETURN false; END IF;
    FOR pos IN 1 .. len LOOP
        cp := cps[pos];
        r := outbox__codepoint_v1(cp);
        CONTINUE WHEN r.idna_class = 'P';
        IF r.idna_class = 'J' THEN
            IF pos > 1 THEN
                p := outbox__codepoint_v1(cps[pos - 1]);
                IF p.unnamed THEN RETURN false; END IF;  -- idna: an unknown code point next to a joiner
                CONTINUE WHEN p.ccc = 9;                 -- after a virama
            END IF;
            IF cp <> 8204 THEN RETURN false; END IF;     -- U+200D only after a virama
            ok := false;
            FOR j IN REVERSE pos - 1 .. 1 LOOP
                r := outbox__codepoint_v1(cps[j]);
                CONTINUE WHEN r.joining = 'T';
                ok := coalesce(r.joining IN ('L', 'D'), false);
                EXIT;
            END LOOP;
            IF NOT ok THEN RETURN false; END IF;
            ok := false;
            FOR j IN pos + 1 .. len LOOP
                r := outbox__codepoint_v1(cps[j]);
                CONTINUE WHEN r.joining = 'T';
                ok := coalesce(r.joining IN ('R', 'D'), false);
                EXIT;
            END LOOP;
            IF NOT ok THEN RETURN false; END IF;
        ELSIF r.idna_class = 'O' THEN
            ok := coalesce(CASE
                WHEN cp = 183 THEN pos > 1 AND pos < len AND cps[pos - 1] = 108 AND cps[pos + 1] = 108
                WHEN cp = 885 THEN pos < len AND (outbox__codepoint_v1(cps[pos + 1])).script = 'Greek'
                WHEN cp IN (1523, 1524) THEN pos > 1 AND (outbox__codepoint_v1(cps[pos - 1])).script = 'Hebrew'
                WHEN cp = 12539 THEN EXISTS (SELECT FROM unnest(cps) AS x WHERE x <> 12539
                                             AND (outbox__codepoint_v1(x)).script IN ('Hiragana', 'Katakana', 'Han'))
                WHEN cp BETWEEN 1632 AND 1641 THEN NOT EXISTS (SELECT FROM unnest(cps) AS x WHERE x BETWEEN 1776 AND 1785)
                WHEN cp BETWEEN 1776 AND 1785 THEN NOT EXISTS (SELECT FROM unnest(cps) AS x WHERE x BETWEEN 1632 AND 1641)
                ELSE false END, false);
            IF NOT ok THEN RETURN false; END IF;
        ELSE
            RETURN false;
        END IF;
    END LOOP;
    RETURN outbox__check_bidi_v1(label, false);
END $f$;

-- idna.ulabel of an ASCII label: a Punycode label decoded (NULL when it is not a
-- valid, canonical one), any other checked as it is.
CREATE OR REPLACE FUNCTION outbox__ulabel_v1(label text) RETURNS text
LANGUAGE plpgsql STABLE AS $f$
DECLARE
    body text;
    u text;
BEGIN
    label := lower(label);
    IF label NOT LIKE 'xn--%' THEN
        RETURN CASE WHEN outbox__check_label_v1(label) THEN label END;
    END IF;
    body := substr(label, 5);
    IF body = '' OR right(body, 1) = '-' THEN RETURN NULL; END IF;
    u := outbox__punycode_decode_v1(body);
    IF u IS NULL OR outbox__punycode_encode_v1(u) <> body OR NOT outbox__check_label_v1(u) THEN RETURN NULL; END IF;
    RETURN u;
END $f$;

-- email-validator's check_unsafe_chars: letters, numbers, punctuation and symbols,
-- marks but not first; no spaces, separators, controls, format or unassigned code points.
CREATE OR REPLACE FUNCTION outbox__unsafe_v1(value text) RETURNS boolean
LANGUAGE sql STABLE AS $f$
    SELECT EXISTS (SELECT FROM regexp_split_to_table(value, '') WITH ORDINALITY AS u(cc, o)
                    WHERE left((outbox__codepoint_v1(ascii(cc))).category, 1) NOT IN ('L', 'N', 'P', 'S', 'M')
                       OR (o = 1 AND (outbox__codepoint_v1(ascii(cc))).category LIKE 'M%'))
$f$;

-- The domain of an address as email-validator's validate_email_domain_name (and the
-- lengths of validate_email_length) take it: refused naming `field`, else its ASCII
-- (Punycode) form. Every refusal names the one field; the order of the checks is Python's.
CREATE OR REPLACE FUNCTION outbox__domain_v1(field text, local_ text, domain text) RETURNS text
LANGUAGE plpgsql STABLE AS $f$
DECLARE
    d text := '';
    r outbox_idna_codepoint;
    c text;
    labels text[];
    label text;
    ascii_ text;
    i18n text;
    u text;
    bad text := 'is not a valid address (the part after the @-sign is not valid)';
BEGIN
    IF length(domain) > 253 THEN PERFORM outbox__refuse_v1(field, 'is not a valid address (too long after the @-sign)'); END IF;
    IF domain ~ '[\u0001-\u002c\u002f\u003a-\u0040\u005b-\u0060\u007b-\u007f]' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign contains invalid characters)');
    END IF;
    IF domain ~ '^[\u0001-\u007f]*$' THEN
        d := lower(domain);
    ELSE
        IF outbox__unsafe_v1(domain) THEN
            PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign contains unsafe characters)');
        END IF;
        -- UTS 46: valid and deviation code points kept, mapped ones replaced, ignored ones dropped.
        FOR c IN SELECT x FROM regexp_split_to_table(domain, '') WITH ORDINALITY AS u(x, o) ORDER BY o LOOP
            r := outbox__codepoint_v1(ascii(c));
            IF NOT r.uts46_valid OR r.status NOT IN ('V', 'D', 'M', 'I') THEN
                PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign contains invalid '
                                                 'characters)');
            END IF;
            d := d || CASE r.status WHEN 'M' THEN r.replacement WHEN 'I' THEN '' ELSE c END;
        END LOOP;
        d := normalize(d, NFC);
    END IF;
    IF d ~ '[\u0001-\u002c\u002f\u003a-\u0040\u005b-\u0060\u007b-\u007f]' THEN PERFORM outbox__refuse_v1(field, bad); END IF;
    IF d ~ '(^[.-]|[.-]$|\.\.|\.-|-\.)' OR d = '' THEN PERFORM outbox__refuse_v1(field, bad); END IF;
    labels := string_to_array(d, '.');
    FOREACH label IN ARRAY labels LOOP
        IF substr(label, 3, 2) = '--' AND lower(left(label, 2)) <> 'xn' THEN
            PERFORM outbox__refuse_v1(field, 'is not a valid address (two letters followed by two dashes start a '
                                             'domain label, except Punycode)');
        END IF;
    END LOOP;
    IF d ~ '^([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)(\.([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?))*$' THEN
        ascii_ := d;
    ELSE
        ascii_ := '';
        FOREACH label IN ARRAY labels LOOP
            IF label ~ '^[\u0001-\u007f]*$' THEN
                IF outbox__ulabel_v1(label) IS NULL THEN PERFORM outbox__refuse_v1(field, bad); END IF;
            ELSE
                IF NOT outbox__check_label_v1(label) THEN PERFORM outbox__refuse_v1(field, bad); END IF;
                label := 'xn--' || outbox__punycode_encode_v1(label);
            END IF;
            IF length(label) > 63 THEN PERFORM outbox__refuse_v1(field, bad); END IF;
            ascii_ := ascii_ || CASE WHEN ascii_ = '' THEN '' ELSE '.' END || label;
        END LOOP;
        IF ascii_ !~ '^([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)(\.([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?))*$' THEN
            PERFORM outbox__refuse_v1(field, bad);
        END IF;
    END IF;
    IF length(ascii_) > 253 THEN PERFORM outbox__refuse_v1(field, 'is not a valid address (too long)'); END IF;
    FOREACH label IN ARRAY string_to_array(ascii_, '.') LOOP
        IF length(label) > 63 THEN
            PERFORM outbox__refuse_v1(field, 'is not a valid address (a domain label is longer than 63)');
        END IF;
    END LOOP;
    IF strpos(ascii_, '.') = 0 THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign should have a period)');
    END IF;
    IF ascii_ !~ '[A-Za-z]$' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (not within a valid top-level domain)');
    END IF;
    IF ascii_ ~ '(^|\.)(arpa|invalid|local|localhost|onion|test)$' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (a special-use or reserved name)');
    END IF;
    i18n := ascii_;
    IF strpos(ascii_, 'xn--') > 0 THEN
        -- A Punycode domain must be IDNA as it is (idna.decode), then safe, then the Bidi Rule
        -- across all its labels when one of them is right-to-left.
        i18n := '';
        FOREACH label IN ARRAY string_to_array(ascii_, '.') LOOP
            u := outbox__ulabel_v1(label);
            IF u IS NULL THEN
                PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign is not valid IDNA)');
            END IF;
            i18n := i18n || CASE WHEN i18n = '' THEN '' ELSE '.' END || u;
        END LOOP;
        IF i18n ~ '[\u0001-\u002c\u002f\u003a-\u0040\u005b-\u0060\u007b-\u007f]' OR outbox__unsafe_v1(i18n) THEN PERFORM outbox__refuse_v1(field, bad); END IF;
        IF EXISTS (SELECT FROM regexp_split_to_table(i18n, '') AS cc
                    WHERE (outbox__codepoint_v1(ascii(cc))).bidi IN ('R', 'AL', 'AN'))
           AND EXISTS (SELECT FROM unnest(string_to_array(i18n, '.')) AS l WHERE NOT outbox__check_bidi_v1(l, true)) THEN
            PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign is not valid IDNA)');
        END IF;
    END IF;
    IF octet_length(local_ || '@' || domain) > 254 OR octet_length(local_ || '@' || i18n) > 254
       OR length(local_ || '@' || ascii_) > 254 THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (too long)');
    END IF;
    RETURN ascii_;
END $f$;
"""

EMAIL = r"""
CREATE OR REPLACE FUNCTION outbox_enqueue_email_v1(
    "to" text[] DEFAULT '{}', subject text DEFAULT NULL, html text DEFAULT NULL, text text DEFAULT NULL,
    cc text[] DEFAULT '{}', bcc text[] DEFAULT '{}', reply_to text[] DEFAULT '{}', sender text DEFAULT NULL,
    headers json DEFAULT NULL, tags json DEFAULT NULL, configuration_set text DEFAULT NULL,
    attachments jsonb DEFAULT NULL, message_id uuid DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL, key text DEFAULT NULL, traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL) RETURNS uuid
LANGUAGE plpgsql AS $f$
DECLARE
    p jsonb := '{}';
    a_to jsonb; a_cc jsonb; a_bcc jsonb; a_reply jsonb;
    subj text;
    hs json; tg json;
    e record;
    seen text[] := '{}';
    name_ text; value_ text;
    att jsonb := '[]';
    a jsonb;
    i int := 0;
    fname text; ctype text; b64 text;
    n int;
    bound bigint;
    h json;
    hj jsonb;
    problem text;
    mid uuid := coalesce(message_id, gen_random_uuid());
BEGIN
    -- The payload model's fields in their order (email/payload.py), then the rules across them.
    IF sender IS NOT NULL THEN p := p || jsonb_build_object('from', outbox__address_v1('sender', sender)); END IF;
    a_to := outbox__addresses_v1('to', "to");
    a_cc := outbox__addresses_v1('cc', cc);
    a_bcc := outbox__addresses_v1('bcc', bcc);
    a_reply := outbox__addresses_v1('reply_to', reply_to);
    IF subject IS NULL THEN PERFORM outbox__refuse_v1('subject', 'is required'); END IF;
    IF length(subject) > 998 THEN PERFORM outbox__refuse_v1('subject', 'must be at most 998 characters'); END IF;
    IF subject ~ 'CONTROL' THEN
        PERFORM outbox__refuse_v1('subject', 'must not contain CR, LF, NUL or other control characters '
                                             '(header injection)');
    END IF;
    subj := outbox__strip_v1(subject);
    IF subj = '' THEN PERFORM outbox__refuse_v1('subject', 'must not be blank'); END IF;
    -- headers: strings; at most 15; names, reserved names, repeats, values.
    hs := outbox__string_map_v1('headers', headers);
    IF (SELECT count(*) FROM json_object_keys(hs)) > 15 THEN
        PERFORM outbox__refuse_v1('headers', 'at most 15 custom headers (SES API v2, Message.Headers)');
    END IF;
    FOR e IN SELECT j.k, j.v FROM json_each_text(hs) WITH ORDINALITY AS j(k, v, n) ORDER BY j.n LOOP
        name_ := e.k;
        value_ := outbox__strip_v1(e.v);
        IF name_ !~ '^[!-9;-~]{1,126}$' THEN
            PERFORM outbox__refuse_v1('headers', format('name %s must be 1-126 printable ASCII characters without '
                                                        'a colon (RFC 5322 field-name)', quote_literal(left(name_, 60))));
        END IF;
        IF lower(name_) IN ('from', 'sender', 'to', 'cc', 'bcc', 'reply-to', 'subject', 'date', 'message-id',
                            'mime-version', 'return-path') OR lower(name_) LIKE 'content-%' THEN
            PERFORM outbox__refuse_v1('headers', name_ || ' is set from the message''s own fields or its MIME '
                                                          'structure; it cannot be a custom header');
        END IF;
        IF lower(name_) LIKE 'x-ses-%' THEN
            PERFORM outbox__refuse_v1('headers', name_ || ': use tags and configuration_set instead of X-SES-* headers');
        END IF;
        IF lower(name_) = ANY (seen) THEN
            PERFORM outbox__refuse_v1('headers', name_ || ' is given twice (header names are case-insensitive)');
        END IF;
        seen := seen || lower(name_);
        IF value_ ~ 'CONTROL' THEN
            PERFORM outbox__refuse_v1('headers', name_ || ': the value must not contain CR, LF, NUL or other '
                                                          'control characters (header injection)');
        END IF;
        IF outbox__encoded_length_v1(value_) > 995 THEN
            PERFORM outbox__refuse_v1('headers', name_ || ': the value is longer than 995 characters once encoded '
                                                          '(SES API v2, MessageHeader)');
        END IF;
        -- As the email package parses it (headers.header_problem).
        problem := outbox__header_value_problem_v1(name_, value_);
        IF problem IS NOT NULL THEN PERFORM outbox__refuse_v1('headers', name_ || ': the value ' || problem); END IF;
        hj := coalesce(hj, '{}') || jsonb_build_object(name_, value_);
    END LOOP;
    -- tags
    tg := outbox__string_map_v1('tags', tags);
    IF (SELECT count(*) FROM json_object_keys(tg)) > 49 THEN
        PERFORM outbox__refuse_v1('tags', 'at most 49 tags (one more is the outbox message id)');
    END IF;
    FOR e IN SELECT j.k, j.v FROM json_each_text(tg) WITH ORDINALITY AS j(k, v, n) ORDER BY j.n LOOP
        IF e.k !~ '^[A-Za-z0-9_-]+$' OR length(e.k) > 256 THEN
            PERFORM outbox__refuse_v1('tags', format('name %s must be 1-256 ASCII letters, digits, ''_'' or ''-'' '
                                                     '(SES API v2, MessageTag)', quote_literal(left(e.k, 60))));
        END IF;
        IF e.k = 'outbox-message-id' THEN
            PERFORM outbox__refuse_v1('tags', 'the tag name outbox-message-id is reserved for the outbox message id');
        END IF;
        IF e.v !~ '^[A-Za-z0-9_-]+$' OR length(e.v) > 256 THEN
            PERFORM outbox__refuse_v1('tags', e.k || ': the value must be 1-256 ASCII letters, digits, ''_'' or ''-'' '
                                                     '(SES API v2, MessageTag)');
        END IF;
    END LOOP;
    IF configuration_set !~ '^[A-Za-z0-9_-]{1,64}$' THEN
        PERFORM outbox__refuse_v1('configuration_set', 'must be 1-64 ASCII letters, digits, ''_'' or ''-'' '
                                                       '(SES configuration set name)');
    END IF;
    -- attachments: a JSON array of {filename, content_type, content_base64}
    IF attachments IS NOT NULL AND jsonb_typeof(attachments) <> 'null' THEN
        IF jsonb_typeof(attachments) <> 'array' THEN
            PERFORM outbox__refuse_v1('attachments', 'must be a JSON array of objects');
        END IF;
        FOR a IN SELECT x FROM jsonb_array_elements(attachments) AS x LOOP
            IF jsonb_typeof(a) <> 'object' THEN
                PERFORM outbox__refuse_v1(format('attachments[%s]', i), 'must be an object with filename, '
                                          'content_type and content_base64');
            END IF;
            fname := a ->> 'filename';
            IF jsonb_typeof(a -> 'filename') IS DISTINCT FROM 'string' THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].filename', i), 'is required (a string)');
            END IF;
            IF fname = '' OR length(fname) > 255 THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].filename', i), 'must be 1-255 characters');
            END IF;
            IF fname ~ 'CONTROL' OR strpos(fname, E'\t') > 0 THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].filename', i),
                                          'must not contain control characters (CR, LF, NUL, …)');
            END IF;
            IF fname ~ '[/\\]' THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].filename', i), 'must be a file name, not a path');
            END IF;
            IF outbox__strip_v1(fname) = '' THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].filename', i), 'must not be blank');
            END IF;
            -- A missing or empty type is guessed from the file name, as Attachment does.
            IF NOT a ? 'content_type' OR a -> 'content_type' = '""' THEN
                ctype := outbox__guess_content_type_v1(fname);
            ELSIF jsonb_typeof(a -> 'content_type') <> 'string' THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].content_type', i), 'must be a string');
            ELSE
                ctype := a ->> 'content_type';
            END IF;
            IF length(ctype) > 255 OR ctype !~ '^[A-Za-z0-9!#$%&''*+.^_`{|}~-]+/[A-Za-z0-9!#$%&''*+.^_`{|}~-]+$' THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].content_type', i),
                                          'must be a MIME type such as application/pdf (type/subtype, no parameters)');
            END IF;
            IF lower(split_part(ctype, '/', 1)) IN ('multipart', 'message') THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].content_type', i), 'must not be multipart/* or message/*');
            END IF;
            b64 := a ->> 'content_base64';
            IF jsonb_typeof(a -> 'content_base64') IS DISTINCT FROM 'string' THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].content_base64', i), 'is required (a string)');
            END IF;
            IF b64 !~ '^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$' THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].content_base64', i),
                                          'must be standard base64 (RFC 4648 section 4)');
            END IF;
            SELECT k INTO name_ FROM jsonb_object_keys(a) AS k
             WHERE k NOT IN ('filename', 'content_type', 'content_base64') LIMIT 1;
            IF name_ IS NOT NULL AND name_ NOT IN ('filename', 'content_type', 'content_base64') THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].%s', i, name_), 'Extra inputs are not permitted');
            END IF;
            name_ := NULL;
            att := att || jsonb_build_array(jsonb_build_object('filename', fname, 'content_type', ctype,
                                                               'content_base64', b64));
            i := i + 1;
        END LOOP;
        IF i > 100 THEN PERFORM outbox__refuse_v1('attachments', 'at most 100 attachments'); END IF;
    END IF;
    -- Across fields (payload.check_message).
    n := jsonb_array_length(a_to) + jsonb_array_length(a_cc) + jsonb_array_length(a_bcc);
    IF n = 0 THEN PERFORM outbox__refuse_v1('to', 'at least one recipient is required in to, cc or bcc'); END IF;
    IF n > 50 THEN
        PERFORM outbox__refuse_v1('to', format('%s recipients across to, cc and bcc; SES accepts at most 50 '
                                               'per message', n));
    END IF;
    IF nullif(html, '') IS NULL AND nullif(text, '') IS NULL THEN
        PERFORM outbox__refuse_v1('html/text', 'an html or a text body is required');
    END IF;
    -- The payload as EmailPayload.to_json writes it: empty fields left out.
    p := p || CASE WHEN jsonb_array_length(a_to) > 0 THEN jsonb_build_object('to', a_to) ELSE '{}' END
           || CASE WHEN jsonb_array_length(a_cc) > 0 THEN jsonb_build_object('cc', a_cc) ELSE '{}' END
           || CASE WHEN jsonb_array_length(a_bcc) > 0 THEN jsonb_build_object('bcc', a_bcc) ELSE '{}' END
           || CASE WHEN jsonb_array_length(a_reply) > 0 THEN jsonb_build_object('reply_to', a_reply) ELSE '{}' END
           || jsonb_build_object('subject', subj)
           || CASE WHEN nullif(html, '') IS NOT NULL THEN jsonb_build_object('html', html) ELSE '{}' END
           || CASE WHEN nullif(text, '') IS NOT NULL THEN jsonb_build_object('text', text) ELSE '{}' END
           || CASE WHEN hj IS NOT NULL THEN jsonb_build_object('headers', hj) ELSE '{}' END
           || CASE WHEN tg IS NOT NULL THEN jsonb_build_object('tags', tg::jsonb) ELSE '{}' END
           || CASE WHEN configuration_set IS NOT NULL THEN jsonb_build_object('configuration_set', configuration_set)
                   ELSE '{}' END
           || CASE WHEN i > 0 THEN jsonb_build_object('attachments', att) ELSE '{}' END;
    bound := outbox__mime_bound_v1(p);
    IF bound > 40000000 THEN
        PERFORM outbox__refuse_v1(CASE WHEN i > 0 THEN 'attachments' ELSE 'html/text' END,
            format('the message is up to %s bytes as MIME; SES v2 accepts at most 40000000 bytes including '
                   'attachments', bound));
    END IF;
    PERFORM outbox__check_key_v1(key);
    PERFORM outbox__check_deliver_at_v1(deliver_at);
    PERFORM outbox__check_attempts_v1(max_attempts);
    h := outbox__trace_context_v1(traceparent, tracestate);  -- the relay adds it to the email's headers
    RETURN outbox__insert_v1(mid, 'ses', coalesce(configuration_set, 'ses'), 'email', key, p::text,
                             outbox__compact_v1(h), max_attempts, deliver_at);
END $f$;
"""


#: The IDNA data of each code point, one row per range of code points alike.
TABLE = """
CREATE TABLE outbox_idna_codepoint (
    lo integer PRIMARY KEY,  -- the first code point of the range; the range ends where the next row starts
    uts46_valid boolean NOT NULL, status text NOT NULL, replacement text, category text NOT NULL,
    idna_class text, bidi text, joining text, ccc integer NOT NULL, unnamed boolean NOT NULL, script text
);
-- Public Unicode data: any role that may enqueue may read it.
GRANT SELECT ON outbox_idna_codepoint TO PUBLIC
"""
#: The functions this migration creates (the others it replaces are 0009's).
CREATED = ["outbox__domain_v1(text, text, text)", "outbox__unsafe_v1(text)", "outbox__ulabel_v1(text)",
           "outbox__check_label_v1(text)", "outbox__check_bidi_v1(text, boolean)", "outbox__punycode_decode_v1(text)",
           "outbox__punycode_encode_v1(text)", "outbox__punycode_adapt_v1(bigint, int, boolean)",
           "outbox__codepoint_v1(int)", "outbox__ew_value_v1(text)", "outbox__header_value_problem_v1(text, text)", "outbox__split_address_list_v1(text)",
           "outbox__unstructured_problem_v1(text)", "outbox__encoded_word_v1(text)",
           "outbox__guess_content_type_v1(text)"]
#: 0009's functions this one replaces, put back by the downgrade.
REPLACED = ["outbox_enqueue_email_v1", "outbox__address_v1"]


def sql_text() -> str:
    """Every statement of the upgrade, the character classes and the table filled in."""
    table = _literal(json.dumps(tables()["content_types"], sort_keys=True)) + "::jsonb"
    return ((HELPERS + IDNA + EMAIL).replace("PYNOSPACE", _0009._PY_SPACE.replace("[", "[^", 1))
            .replace("PYSPACE", _0009._PY_SPACE).replace("'DATE_PATTERN'", _literal(DATE_PATTERN))
            .replace("'EMPTY_GROUP_PATTERN'", _literal(EMPTY_GROUP_PATTERN))
            .replace("'MAILBOX_PATTERN'", _literal(MAILBOX_PATTERN)).replace("'NOT_IN_GRAMMAR'", _literal(NOT_IN_GRAMMAR))
            .replace("'^ADDR_SPEC_PATTERN$'", _literal(f"^{ADDR_SPEC_PATTERN}$"))
            .replace("'<(ADDR_SPEC_PATTERN)>$'", _literal(f"<({ADDR_SPEC_PATTERN})>$")).replace("'CONTROL'", f"'{_0009._CONTROL}'")
            .replace("CONTENT_TYPES", table).replace("DEFAULT_CONTENT_TYPE", _literal(DEFAULT_CONTENT_TYPE)))


def statements() -> list[str]:
    return [s.strip() + "$f$" for s in sql_text().split("$f$;") if s.strip()]


def upgrade() -> None:
    # As 0009: to the driver as written (colons and percent signs in the bodies).
    bind = op.get_bind()
    rows = json.dumps(tables()["idna_codepoints"], ensure_ascii=False, separators=(",", ":"))
    bind.exec_driver_sql(TABLE)
    bind.exec_driver_sql("INSERT INTO outbox_idna_codepoint SELECT * FROM json_populate_recordset("
                         "NULL::outbox_idna_codepoint, " + _literal(rows) + ")")
    for statement in statements():
        bind.exec_driver_sql(statement)


def downgrade() -> None:
    bind = op.get_bind()
    for statement in _0009.statements():
        if re.search(r"^CREATE FUNCTION (\w+)\(", statement, re.M).group(1) in REPLACED:
            bind.exec_driver_sql(statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    for signature in CREATED:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    op.execute("DROP TABLE IF EXISTS outbox_idna_codepoint")
