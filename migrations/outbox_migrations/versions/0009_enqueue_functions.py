"""Enqueue from any language: SQL functions for every channel (issue 26).

`outbox_enqueue_event_v1`, `outbox_enqueue_email_v1`, `outbox_enqueue_sqs_v1`,
`outbox_enqueue_sns_v1` and `outbox_enqueue_eventbridge_v1` validate a message
by the producer API's rules and write it in the caller's transaction, from any
driver (docs/producers.md). A refusal raises SQLSTATE OB001 (a field breaks a
rule) or OB002 (the message id holds a different message); the message starts
with the field's name, which is also the error's COLUMN. Nothing is written.

The `_v1` suffix is a promise: a later change of arguments or behaviour is a
new `_v2` beside it, so a statement written against `_v1` keeps working.
Functions named `outbox__*_v1` are their parts, not an interface.

The rules are the Python API's; tests/integration/test_sql_functions.py checks
both against each other with hypothesis (docs/decisions/0048). Where plpgsql
cannot reasonably repeat a rule (the email address and header parsers, the
MIME size) the functions accept a documented subset and refuse the rest.

`same message` (the idempotency comparison) is `same_message_as_m` of
shared/outbox_relay/sql/producer.sql, copied verbatim; a test keeps them equal.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Python's str.isspace() characters, for str.strip(): the rules strip with it.
_PY_SPACE = r"[\t\n\u000b\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
# outbox_relay.email.addresses.CONTROL_RE (NUL cannot be in PostgreSQL text).
_CONTROL = r"[\u0001-\u0008\u000a-\u001f\u007f-\u009f\u2028\u2029]"

HELPERS = r"""
CREATE FUNCTION outbox__refuse_v1(field text, problem text, code text DEFAULT 'OB001') RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = field || ': ' || problem, COLUMN = field;
END $f$;

CREATE FUNCTION outbox__strip_v1(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $f$
    SELECT regexp_replace(value, '^PYSPACE+|PYSPACE+$', '', 'g')
$f$;

CREATE FUNCTION outbox__check_name_v1(field text, value text) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    IF value IS NULL THEN PERFORM outbox__refuse_v1(field, 'is required'); END IF;
    IF value = '' THEN PERFORM outbox__refuse_v1(field, 'must not be empty'); END IF;
    IF length(value) > 512 THEN PERFORM outbox__refuse_v1(field, 'must be at most 512 characters'); END IF;
END $f$;

CREATE FUNCTION outbox__check_type_v1(value text) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM outbox__check_name_v1('type', value);
    IF outbox__strip_v1(value) = '' THEN PERFORM outbox__refuse_v1('type', 'must not be blank'); END IF;
END $f$;

CREATE FUNCTION outbox__check_key_v1(value text) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    IF value = '' THEN
        PERFORM outbox__refuse_v1('key', 'must not be empty; leave it out for a message without a key');
    END IF;
    IF length(value) > 512 THEN PERFORM outbox__refuse_v1('key', 'must be at most 512 characters'); END IF;
END $f$;

CREATE FUNCTION outbox__check_stream_v1(stream text) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE
    open_ int;
    rel int;
BEGIN
    PERFORM outbox__check_name_v1('stream', stream);
    IF outbox__strip_v1(stream) <> stream THEN
        PERFORM outbox__refuse_v1('stream', 'must not be blank or have leading/trailing spaces');
    END IF;
    -- Braces only as one Redis Cluster hash tag (outbox_relay.events.check_stream_name).
    open_ := strpos(stream, '{');
    IF open_ = 0 THEN
        IF strpos(stream, '}') > 0 THEN
            PERFORM outbox__refuse_v1('stream', '''}'' is allowed only to close a Redis Cluster hash tag {…}');
        END IF;
        RETURN;
    END IF;
    rel := strpos(substr(stream, open_ + 1), '}');
    IF rel <= 1 THEN
        PERFORM outbox__refuse_v1('stream', '''{'' must open a non-empty Redis Cluster hash tag {…}');
    END IF;
    IF strpos(left(stream, open_ - 1), '}') > 0 THEN
        PERFORM outbox__refuse_v1('stream', '''}'' is allowed only to close a Redis Cluster hash tag {…}');
    END IF;
    IF substr(stream, open_ + rel + 1) ~ '[{}]' THEN
        PERFORM outbox__refuse_v1('stream', 'braces are allowed only as one Redis Cluster hash tag {…}');
    END IF;
END $f$;

CREATE FUNCTION outbox__check_attempts_v1(max_attempts integer) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    IF max_attempts NOT BETWEEN 1 AND 1000 THEN
        PERFORM outbox__refuse_v1('max_attempts', 'must be an integer from 1 to 1000');
    END IF;
END $f$;

-- The window of docs/decisions/0013: 366 days of 24 hours either way (Python's timedelta),
-- from the time of the call (as Python reads its clock at the call, not at the transaction's start).
CREATE FUNCTION outbox__check_deliver_at_v1(deliver_at timestamptz) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    IF deliver_at > clock_timestamp() + interval '8784 hours' THEN
        PERFORM outbox__refuse_v1('deliver_at',
            'is more than 366 days ahead; the outbox schedules at most 366 days ahead');
    END IF;
    IF deliver_at < clock_timestamp() - interval '8784 hours' THEN
        PERFORM outbox__refuse_v1('deliver_at',
            'is more than 366 days in the past (a past deliver_at within 366 days means now)');
    END IF;
END $f$;

-- A JSON text as the producer API's json_text refuses it: NUL (jsonb, which the
-- idempotency check compares, cannot hold it) and more than `max_bytes`.
CREATE FUNCTION outbox__check_json_v1(field text, value text, max_bytes int) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    BEGIN
        PERFORM value::jsonb;
    EXCEPTION WHEN untranslatable_character THEN
        PERFORM outbox__refuse_v1(field, 'must not contain the NUL character (\u0000)');
    END;
    IF octet_length(value) > max_bytes THEN
        PERFORM outbox__refuse_v1(field, format('is %s bytes as JSON; the limit is %s bytes',
                                                 octet_length(value), max_bytes));
    END IF;
END $f$;

-- String headers: a JSON object of strings, else refused; NULL for none (as {}).
-- json, not jsonb: the caller's order is kept, so the first bad entry is Python's first.
CREATE FUNCTION outbox__string_map_v1(field text, value json) RETURNS json
LANGUAGE plpgsql AS $f$
DECLARE
    k text;
BEGIN
    IF value IS NULL OR json_typeof(value) = 'null' THEN RETURN NULL; END IF;
    IF json_typeof(value) <> 'object' THEN
        PERFORM outbox__refuse_v1(field, 'must be a JSON object of strings');
    END IF;
    SELECT e.k INTO k FROM json_each(value) WITH ORDINALITY AS e(k, v, n) WHERE json_typeof(e.v) <> 'string'
     ORDER BY e.n LIMIT 1;
    IF k IS NOT NULL THEN PERFORM outbox__refuse_v1(field || '.' || k, 'must be a string'); END IF;
    SELECT e.k INTO k FROM json_object_keys(value) AS e(k) GROUP BY e.k HAVING count(*) > 1 LIMIT 1;
    IF k IS NOT NULL THEN PERFORM outbox__refuse_v1(field, format('has the name %s twice', k)); END IF;
    RETURN CASE WHEN (SELECT count(*) FROM json_object_keys(value)) = 0 THEN NULL ELSE value END;
END $f$;

-- A map of strings as compact JSON text, in its order, as Python's json.dumps(separators=(",", ":")).
CREATE FUNCTION outbox__compact_v1(value json) RETURNS text
LANGUAGE sql IMMUTABLE AS $f$
    SELECT '{' || string_agg(to_json(e.k)::text || ':' || to_json(e.v)::text, ',' ORDER BY e.n) || '}'
      FROM json_each_text(value) WITH ORDINALITY AS e(k, v, n)
$f$;

-- W3C trace context (issue 26 item 3), given as arguments: checked as
-- outbox_relay.tracing.check_context checks it, and returned as the headers
-- `traceparent` and `tracestate` (an empty tracestate is none), NULL for none.
CREATE FUNCTION outbox__trace_context_v1(traceparent text, tracestate text) RETURNS json
LANGUAGE plpgsql AS $f$
BEGIN
    IF traceparent IS NULL THEN
        IF tracestate IS NOT NULL THEN PERFORM outbox__refuse_v1('tracestate', 'needs a traceparent'); END IF;
        RETURN NULL;
    END IF;
    IF traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       OR substr(traceparent, 4, 32) = repeat('0', 32) OR substr(traceparent, 37, 16) = repeat('0', 16) THEN
        PERFORM outbox__refuse_v1('traceparent',
            'must be a W3C traceparent, 00-<32 hex>-<16 hex>-<2 hex>, ids not all zero');
    END IF;
    IF tracestate !~ '^[\u0020-\u007e]*$' OR length(tracestate) > 512 THEN
        PERFORM outbox__refuse_v1('tracestate', 'must be printable ASCII of at most 512 characters');
    END IF;
    IF coalesce(tracestate, '') = '' THEN RETURN json_build_object('traceparent', traceparent); END IF;
    RETURN json_build_object('traceparent', traceparent, 'tracestate', tracestate);
END $f$;

-- `headers` with the context added first, as outbox_relay.tracing.with_context adds
-- the producer's: a traceparent already in the headers wins, with its own tracestate
-- or none; headers that are not an object are left for validation to refuse.
-- JSON values, not text: a header that is not a string is still refused where Python refuses it.
CREATE FUNCTION outbox__with_context_v1(headers json, context json) RETURNS json
LANGUAGE sql IMMUTABLE AS $f$
    SELECT CASE
        WHEN context IS NULL THEN headers
        WHEN headers IS NULL OR json_typeof(headers) = 'null' THEN context
        WHEN json_typeof(headers) <> 'object'
             OR EXISTS (SELECT FROM json_object_keys(headers) AS k WHERE k = 'traceparent') THEN headers
        -- {**context, **headers}: a name in both keeps the context's place and the header's value
        ELSE (SELECT json_object_agg(e.k, e.v ORDER BY e.n)
                FROM (SELECT c.k, coalesce(headers -> c.k, c.v) AS v, c.n
                        FROM json_each(context) WITH ORDINALITY AS c(k, v, n)
                      UNION ALL
                      SELECT h.k, h.v, 100 + h.n FROM json_each(headers) WITH ORDINALITY AS h(k, v, n)
                       WHERE (context -> h.k) IS NULL) e)
    END
$f$;

-- Write one validated message: the statement of sql.producer.insert_message in
-- plpgsql. In READ COMMITTED the second look sees a writer that committed
-- while the insert waited on its id; in REPEATABLE READ the insert raises 40001 instead.
CREATE FUNCTION outbox__insert_v1(p_message_id uuid, p_channel text, p_destination text, p_type text,
                                  p_key text, p_payload text, p_headers text, p_max_attempts integer,
                                  p_deliver_at timestamptz) RETURNS uuid
LANGUAGE plpgsql AS $f$
DECLARE
    inserted bigint;
    same boolean;
BEGIN
    WITH body AS (
        INSERT INTO outbox_message_body (message_id, payload, headers)
        VALUES (p_message_id, p_payload::json, p_headers::json)
        ON CONFLICT (message_id) DO NOTHING
        RETURNING seq, message_id, payload
    ), ins AS (
        INSERT INTO outbox_message
            (seq, message_id, channel, destination, type, key, payload_bytes, max_attempts, available_at,
             scheduled_at)
        SELECT seq, message_id, p_channel, p_destination, p_type, p_key, octet_length(payload::text),
               p_max_attempts, greatest(p_deliver_at, now()),
               CASE WHEN p_deliver_at > now() THEN p_deliver_at END
          FROM body
        RETURNING seq
    )
    SELECT count(*) INTO inserted FROM ins;
    IF inserted = 1 THEN
        RETURN p_message_id;
    END IF;
    SELECT o.channel = m.channel AND o.destination = m.destination AND o.type = m.type
AND o.key IS NOT DISTINCT FROM m.key AND b.payload::jsonb = m.payload::jsonb
      INTO same
      FROM (SELECT p_message_id AS message_id, p_channel AS channel, p_destination AS destination,
                   p_type AS type, p_key AS key, p_payload AS payload) m
      JOIN outbox_message_body b ON b.message_id = m.message_id
      JOIN outbox_message o ON o.seq = b.seq;
    IF same IS NOT TRUE THEN
        PERFORM outbox__refuse_v1('message_id',
            'already used by a different message (channel, destination, type, key or payload differ); '
            'an idempotency key must identify one message', 'OB002');
    END IF;
    RETURN p_message_id;
END $f$;
"""

EVENT = r"""
CREATE FUNCTION outbox_enqueue_event_v1(
    stream text, type text, payload json, key text DEFAULT NULL, message_id uuid DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL, max_attempts integer DEFAULT NULL, headers json DEFAULT NULL,
    traceparent text DEFAULT NULL, tracestate text DEFAULT NULL) RETURNS uuid
LANGUAGE plpgsql AS $f$
DECLARE
    h json;
    context json;
    payload_text text := coalesce(payload::text, 'null');  -- SQL NULL is JSON null, as Python's None
    headers_text text;
BEGIN
    -- In the order the Python API checks them, so both name the same field first; the
    -- context joins the headers before they are checked, as the producer's does.
    context := outbox__trace_context_v1(traceparent, tracestate);
    PERFORM outbox__check_stream_v1(stream);
    PERFORM outbox__check_type_v1(type);
    PERFORM outbox__check_key_v1(key);
    h := outbox__string_map_v1('headers', outbox__with_context_v1(headers, context));
    PERFORM outbox__check_attempts_v1(max_attempts);
    PERFORM outbox__check_deliver_at_v1(deliver_at);
    PERFORM outbox__check_json_v1('payload', payload_text, 262144);
    headers_text := outbox__compact_v1(h);
    IF headers_text IS NOT NULL THEN PERFORM outbox__check_json_v1('headers', headers_text, 65536); END IF;
    RETURN outbox__insert_v1(coalesce(message_id, gen_random_uuid()), 'redis', stream, type, key, payload_text,
                             headers_text, max_attempts, deliver_at);
END $f$;
"""

AWS = r"""
-- SQS's XML characters (outbox_relay.aws_messages.check_sqs_text).
CREATE FUNCTION outbox__check_sqs_text_v1(field text, value text) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE
    bad text := substring(value FROM '[\u0001-\u0008\u000b\u000c\u000e-\u001f\ufffe\uffff]');
BEGIN
    IF bad IS NOT NULL THEN
        PERFORM outbox__refuse_v1(field, format('contains U+%s, which SQS refuses (only XML characters are allowed)',
                                                 upper(lpad(to_hex(ascii(bad)), 4, '0'))));
    END IF;
END $f$;

-- The bytes one string attribute counts: name, data type ("String"), value.
CREATE FUNCTION outbox__attribute_bytes_v1(name text, value text) RETURNS int
LANGUAGE sql IMMUTABLE AS $f$ SELECT octet_length(name) + 6 + octet_length(value) $f$;

-- What SQS and SNS check of the attributes and the size (aws_messages.aws_row, from
-- its _check_headers on), raising on the first problem.
CREATE FUNCTION outbox__check_aws_v1(channel text, type text, payload_text text, key text, h json,
                                     mid uuid) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE
    n int := coalesce((SELECT count(*) FROM json_object_keys(h)), 0);
    e record;
    size int;
BEGIN
    IF n > 7 THEN
        PERFORM outbox__refuse_v1('headers', format('has %s entries; %s carries at most 10 message attributes, '
                                                    '3 of them the relay''s, so at most 7', n, channel));
    END IF;
    FOR e IN SELECT j.k, j.v FROM json_each_text(h) WITH ORDINALITY AS j(k, v, n) ORDER BY j.n LOOP
        IF e.k IN ('outbox-message-id', 'outbox-type', 'outbox-key') THEN
            PERFORM outbox__refuse_v1('headers.' || e.k, 'is the relay''s own attribute');
        END IF;
        IF length(e.k) > 256 OR e.k !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'
           OR lower(e.k) LIKE 'aws.%' OR lower(e.k) LIKE 'amazon.%' THEN
            PERFORM outbox__refuse_v1('headers.' || e.k, 'must be 1-256 letters, digits, ''_'', ''-'' or ''.'' '
                '(not leading, trailing or doubled), not starting with ''AWS.'' or ''Amazon.''');
        END IF;
        IF e.v = '' THEN
            PERFORM outbox__refuse_v1('headers.' || e.k, 'must not be empty (SQS and SNS refuse empty attributes)');
        END IF;
        IF channel = 'sqs' THEN PERFORM outbox__check_sqs_text_v1('headers.' || e.k, e.v); END IF;
    END LOOP;
    PERFORM outbox__check_json_v1('payload', payload_text, 262144);
    IF channel = 'sqs' THEN
        -- The characters of the values, as Python writes them (a JSON escape of U+FFFF is U+FFFF).
        PERFORM outbox__check_sqs_text_v1('payload', payload_text::jsonb::text);
        PERFORM outbox__check_sqs_text_v1('type', type);
        IF key IS NOT NULL THEN PERFORM outbox__check_sqs_text_v1('key', key); END IF;
    END IF;
    IF h IS NOT NULL THEN PERFORM outbox__check_json_v1('headers', outbox__compact_v1(h), 65536); END IF;
    size := octet_length(payload_text) + outbox__attribute_bytes_v1('outbox-message-id', mid::text)
            + outbox__attribute_bytes_v1('outbox-type', type)
            + coalesce(outbox__attribute_bytes_v1('outbox-key', key), 0)
            + coalesce((SELECT sum(outbox__attribute_bytes_v1(j.k, j.v)) FROM json_each_text(h) AS j(k, v)), 0);
    IF size > 262144 THEN
        PERFORM outbox__refuse_v1('payload', format('makes the %s message %s bytes with its attributes; '
                                                    'the limit is 262144 bytes', channel, size));
    END IF;
END $f$;

-- SQS and SNS (outbox_relay.aws_messages.aws_row and producer._aws_traced).
CREATE FUNCTION outbox__enqueue_aws_v1(
    channel text, type text, payload json, key text, headers json, message_id uuid, deliver_at timestamptz,
    max_attempts integer, traceparent text, tracestate text) RETURNS uuid
LANGUAGE plpgsql AS $f$
DECLARE
    h json;
    context json;
    traced json;
    payload_text text := coalesce(payload::text, 'null');
    mid uuid := coalesce(message_id, gen_random_uuid());
    n int;
BEGIN
    PERFORM outbox__check_type_v1(type);
    PERFORM outbox__check_key_v1(key);
    h := outbox__string_map_v1('headers', headers);
    PERFORM outbox__check_attempts_v1(max_attempts);
    PERFORM outbox__check_deliver_at_v1(deliver_at);
    context := outbox__trace_context_v1(traceparent, tracestate);
    PERFORM outbox__check_aws_v1(channel, type, payload_text, key, h, mid);
    -- The context only where it fits, as the producer API stores it: never making a
    -- valid message invalid (tracestate left out first, then the whole context).
    n := coalesce((SELECT count(*) FROM json_object_keys(h)), 0);
    IF context IS NOT NULL AND n + 2 > 7 THEN
        context := json_build_object('traceparent', context ->> 'traceparent');
    END IF;
    IF context IS NOT NULL AND n + 1 <= 7 THEN
        traced := outbox__with_context_v1(h, context);
        BEGIN
            PERFORM outbox__check_aws_v1(channel, type, payload_text, key, traced, mid);
            h := traced;
        EXCEPTION WHEN SQLSTATE 'OB001' THEN
            NULL;  -- no room for it (256 KiB): stored without it
        END;
    END IF;
    RETURN outbox__insert_v1(mid, channel, '(relay)', type, key, payload_text, outbox__compact_v1(h), max_attempts,
                             deliver_at);
END $f$;

CREATE FUNCTION outbox_enqueue_sqs_v1(
    type text, payload json, key text DEFAULT NULL, headers json DEFAULT NULL, message_id uuid DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL, max_attempts integer DEFAULT NULL, traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL) RETURNS uuid
LANGUAGE sql AS $f$
    SELECT outbox__enqueue_aws_v1('sqs', type, payload, key, headers, message_id, deliver_at, max_attempts,
                                  traceparent, tracestate)
$f$;

CREATE FUNCTION outbox_enqueue_sns_v1(
    type text, payload json, key text DEFAULT NULL, headers json DEFAULT NULL, message_id uuid DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL, max_attempts integer DEFAULT NULL, traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL) RETURNS uuid
LANGUAGE sql AS $f$
    SELECT outbox__enqueue_aws_v1('sns', type, payload, key, headers, message_id, deliver_at, max_attempts,
                                  traceparent, tracestate)
$f$;

CREATE FUNCTION outbox_enqueue_eventbridge_v1(
    type text, payload json, source text DEFAULT NULL, bus text DEFAULT NULL, key text DEFAULT NULL,
    message_id uuid DEFAULT NULL, deliver_at timestamptz DEFAULT NULL, max_attempts integer DEFAULT NULL,
    traceparent text DEFAULT NULL, tracestate text DEFAULT NULL) RETURNS uuid
LANGUAGE plpgsql AS $f$
DECLARE
    payload_text text := coalesce(payload::text, 'null');
    mid uuid := coalesce(message_id, gen_random_uuid());
    inner_ text;
    detail text;
    size int;
    h json;
BEGIN
    PERFORM outbox__check_type_v1(type);
    PERFORM outbox__check_key_v1(key);
    PERFORM outbox__check_attempts_v1(max_attempts);
    IF source = '' OR length(source) > 256 THEN
        PERFORM outbox__refuse_v1('source', 'must be 1-256 characters');
    END IF;
    IF outbox__strip_v1(source) <> source OR lower(source) LIKE 'aws.%' THEN
        PERFORM outbox__refuse_v1('source', 'must have no leading or trailing blanks and not start with ''aws.'' '
                                            '(reserved for AWS services)');
    END IF;
    IF bus = '' OR length(bus) > 1600 THEN PERFORM outbox__refuse_v1('bus', 'must be 1-1600 characters'); END IF;
    -- (PostgreSQL's regular expressions count repetitions to 255: longer bounds are lengths.)
    IF NOT (bus ~ '^[/._A-Za-z0-9-]+$' AND length(bus) <= 256)
       AND NOT (bus ~ '^arn:aws[A-Za-z0-9_-]*:events:[a-z0-9-]+:[0-9]{12}:event-bus/[/._A-Za-z0-9-]+$'
                AND length(substring(bus FROM 'event-bus/(.*)$')) <= 256) THEN
        PERFORM outbox__refuse_v1('bus', 'must be an event bus name (letters, digits, ''.'', ''-'', ''_'', ''/'') '
                                         'or an event bus ARN');
    END IF;
    PERFORM outbox__check_deliver_at_v1(deliver_at);
    PERFORM outbox__check_json_v1('payload', payload_text, 262144);
    IF json_typeof(payload_text::json) <> 'object' THEN
        PERFORM outbox__refuse_v1('payload', 'must be a JSON object (it is the event''s detail)');
    END IF;
    IF payload_text::jsonb ? 'outbox-message-id' THEN
        PERFORM outbox__refuse_v1('payload.outbox-message-id', 'is the relay''s own detail field');
    END IF;
    -- The detail the relay sends: the payload with the message id first (aws_messages.detail_text).
    inner_ := outbox__strip_v1(substr(outbox__strip_v1(payload_text), 2,
                                      length(outbox__strip_v1(payload_text)) - 2));
    detail := '{"outbox-message-id":"' || mid::text || '"' || CASE WHEN inner_ = '' THEN '' ELSE ',' END
              || inner_ || '}';
    size := octet_length(detail) + octet_length(type) + 14 + coalesce(octet_length(source), 0);
    IF size > 262144 THEN
        PERFORM outbox__refuse_v1('payload', format('makes the eventbridge message %s bytes with its attributes; '
                                                    'the limit is 262144 bytes', size));
    END IF;
    -- EventBridge has no attributes: the headers column carries the source the publisher reads.
    h := outbox__trace_context_v1(traceparent, tracestate);
    IF source IS NOT NULL THEN  -- beside the source, after it, as the producer API stores it
        h := (SELECT json_object_agg(e.k, e.v ORDER BY e.n)
                FROM (SELECT 'source' AS k, source AS v, 0 AS n
                      UNION ALL SELECT c.k, c.v, c.n FROM json_each_text(h) WITH ORDINALITY AS c(k, v, n)) e);
    END IF;
    RETURN outbox__insert_v1(mid, 'eventbridge', coalesce(bus, '(relay)'), type, key, payload_text,
                             outbox__compact_v1(h), max_attempts, deliver_at);
END $f$;
"""

EMAIL = r"""
-- One mailbox, canonical as outbox_relay.email.addresses.parse_address returns it,
-- for the subset this parser takes (docs/producers.md lists it); the rest is refused.
CREATE FUNCTION outbox__address_v1(field text, value text) RETURNS text
LANGUAGE plpgsql AS $f$
DECLARE
    v text;
    parts text[];
    display text;
    addr text;
    local_ text;
    domain text;
    label text;
BEGIN
    IF value IS NULL THEN PERFORM outbox__refuse_v1(field, 'must be a string'); END IF;
    IF value ~ 'CONTROL' THEN
        PERFORM outbox__refuse_v1(field, 'must not contain CR, LF, NUL or other control characters '
                                         '(header injection)');
    END IF;
    IF outbox__strip_v1(value) = '' THEN PERFORM outbox__refuse_v1(field, 'must not be blank'); END IF;
    v := btrim(value, E' \t');
    -- addr, <addr>, Display Name <addr>, "Quoted, Name" <addr>
    parts := regexp_match(v, '^(?:("[^"\\]*")|([^\s()<>@,:;.\\"\[\]]+(?:[ \t]+[^\s()<>@,:;.\\"\[\]]+)*))?[ \t]*<([^<>\s]*)>$');
    IF parts IS NULL THEN
        IF v ~ '^[^\s<>"]+$' THEN
            addr := v;
        ELSE
            PERFORM outbox__refuse_v1(field, 'is not a form this function takes: address, <address>, '
                                             'Display Name <address> or "Quoted Name" <address>');
        END IF;
    ELSE
        addr := parts[3];
        IF parts[1] IS NOT NULL THEN
            display := substr(parts[1], 2, length(parts[1]) - 2);
        ELSIF parts[2] IS NOT NULL THEN
            display := regexp_replace(parts[2], '[ \t]+', ' ', 'g');
        END IF;
        IF display ~ '=\?' THEN
            PERFORM outbox__refuse_v1(field, 'has a display name with ''=?'' (an encoded word), '
                                             'which this function does not decode');
        END IF;
    END IF;
    IF strpos(addr, '@') = 0 THEN PERFORM outbox__refuse_v1(field, 'is not a well-formed address'); END IF;
    local_ := left(addr, length(addr) - strpos(reverse(addr), '@'));
    domain := right(addr, strpos(reverse(addr), '@') - 1);
    IF local_ !~ '^[A-Za-z0-9!#$%&''*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&''*+/=?^_`{|}~-]+)*$' THEN
        PERFORM outbox__refuse_v1(field, 'has a local part (before the @) this function does not take: '
                                         'ASCII letters, digits and !#$%&''*+/=?^_`{|}~- separated by single dots');
    END IF;
    IF length(local_) > 64 THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (too long before the @-sign)');
    END IF;
    domain := lower(domain);
    IF domain ~ '[^\u0001-\u007f]' THEN
        PERFORM outbox__refuse_v1(field, 'has an internationalised domain, which this function does not take '
                                         '(the Python API converts it to Punycode)');
    END IF;
    IF domain !~ '^[a-z0-9.-]+$' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign contains invalid '
                                         'characters)');
    END IF;
    IF strpos(domain, '.') = 0 THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign should have a period)');
    END IF;
    IF domain !~ '^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (the part after the @-sign is not well formed)');
    END IF;
    FOREACH label IN ARRAY string_to_array(domain, '.') LOOP
        IF length(label) > 63 THEN
            PERFORM outbox__refuse_v1(field, 'is not a valid address (a domain label is longer than 63)');
        END IF;
        IF label LIKE 'xn--%' THEN
            PERFORM outbox__refuse_v1(field, 'has a Punycode domain label, which this function does not take '
                                             '(the Python API checks it with the idna package)');
        END IF;
        IF substr(label, 3, 2) = '--' THEN
            PERFORM outbox__refuse_v1(field, 'is not a valid address (two letters followed by two dashes '
                                             'start a domain label, except Punycode)');
        END IF;
    END LOOP;
    IF domain !~ '[a-z]$' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (not within a valid top-level domain)');
    END IF;
    IF domain ~ '(^|\.)(arpa|invalid|local|localhost|onion|test)$' THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (a special-use or reserved name)');
    END IF;
    IF length(domain) > 253 OR length(local_) + 1 + length(domain) > 254 THEN
        PERFORM outbox__refuse_v1(field, 'is not a valid address (too long)');
    END IF;
    addr := local_ || '@' || domain;
    IF display IS NULL OR display = '' THEN RETURN addr; END IF;
    -- headerregistry.Address quotes a display name holding a special.
    IF display ~ '[()<>@,:;.\\"\[\]]' THEN display := '"' || display || '"'; END IF;
    RETURN display || ' <' || addr || '>';
END $f$;

CREATE FUNCTION outbox__addresses_v1(field text, value text[]) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    out jsonb := '[]';
    i int;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(value), 0) LOOP
        out := out || to_jsonb(outbox__address_v1(format('%s[%s]', field, i - 1), value[i]));
    END LOOP;
    RETURN out;
END $f$;

-- A custom header's value length once encoded (addresses.encode_header_value):
-- as is when ASCII, else one RFC 2047 word, the shorter of B and Q encoding.
CREATE FUNCTION outbox__encoded_length_v1(value text) RETURNS int
LANGUAGE sql IMMUTABLE AS $f$
    SELECT CASE WHEN value ~ '^[\u0001-\u007f]*$' THEN length(value)
           ELSE 12 + least(4 * ((octet_length(value) + 2) / 3),
                           octet_length(value) + 2 * (octet_length(value)
                               - octet_length(regexp_replace(value, '[^-!*+/A-Za-z0-9 ]', '', 'g'))))
           END
$f$;

-- An upper bound of the bytes of an email payload's MIME message (mime.build_mime):
-- bodies and attachments base64 with a CRLF per 76 characters, header text at
-- three bytes a byte (encoded words), file names at six (RFC 2231), and room for
-- the fixed parts. Never below the real size, a few KiB above it (the tests check both).
CREATE FUNCTION outbox__mime_bound_v1(p jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $f$
    WITH bodies(n) AS (
        SELECT octet_length(p ->> 'html') UNION ALL SELECT octet_length(p ->> 'text')
        UNION ALL
        SELECT length(a ->> 'content_base64') / 4 * 3 - length(a ->> 'content_base64')
               + length(rtrim(a ->> 'content_base64', '='))
          FROM jsonb_array_elements(coalesce(p -> 'attachments', '[]')) AS a
    ), headers(n) AS (
        SELECT octet_length(coalesce(p ->> 'from', '')) + octet_length(p ->> 'subject')
               + octet_length(coalesce(p ->> 'to', '')) + octet_length(coalesce(p ->> 'cc', ''))
               + octet_length(coalesce(p ->> 'reply_to', ''))
        UNION ALL
        SELECT octet_length(h.k) + octet_length(h.v) + 4 FROM jsonb_each_text(coalesce(p -> 'headers', '{}')) AS h(k, v)
        UNION ALL
        SELECT 2 * octet_length(a ->> 'filename') + octet_length(a ->> 'content_type')
          FROM jsonb_array_elements(coalesce(p -> 'attachments', '[]')) AS a
    )
    SELECT 4096 + 3 * (SELECT sum(n) FROM headers)
           + coalesce((SELECT sum(400 + 4 * ((n + 2) / 3) + 2 * ((4 * ((n + 2) / 3) + 75) / 76))
                         FROM bodies WHERE n IS NOT NULL), 0)
$f$;

CREATE FUNCTION outbox_enqueue_email_v1(
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
        -- Structured headers, and encoded words, need the email package's parser: not taken here.
        IF lower(name_) IN ('resent-date', 'resent-sender', 'resent-from', 'resent-to', 'resent-cc',
                            'resent-bcc', 'orig-date') OR value_ ~ '=\?' THEN
            PERFORM outbox__refuse_v1('headers', name_ || ': this function does not take Resent-*/Orig-Date headers '
                                                          'or values with ''=?'' (the Python API does)');
        END IF;
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
            -- Python guesses a missing type from the file name (mimetypes); here it is required.
            ctype := a ->> 'content_type';
            IF jsonb_typeof(a -> 'content_type') IS DISTINCT FROM 'string' OR ctype = '' THEN
                PERFORM outbox__refuse_v1(format('attachments[%s].content_type', i),
                                          'is required by this function (the Python API guesses it from the file name)');
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

FUNCTIONS = [
    "outbox_enqueue_email_v1(text[], text, text, text, text[], text[], text[], text, json, json, text, jsonb, uuid, "
    "timestamptz, integer, text, text, text)",
    "outbox__mime_bound_v1(jsonb)",
    "outbox__encoded_length_v1(text)",
    "outbox__addresses_v1(text, text[])",
    "outbox__address_v1(text, text)",
    "outbox_enqueue_eventbridge_v1(text, json, text, text, text, uuid, timestamptz, integer, text, text)",
    "outbox_enqueue_sns_v1(text, json, text, json, uuid, timestamptz, integer, text, text)",
    "outbox_enqueue_sqs_v1(text, json, text, json, uuid, timestamptz, integer, text, text)",
    "outbox__enqueue_aws_v1(text, text, json, text, json, uuid, timestamptz, integer, text, text)",
    "outbox__check_aws_v1(text, text, text, text, json, uuid)",
    "outbox__attribute_bytes_v1(text, text)",
    "outbox__check_sqs_text_v1(text, text)",
    "outbox_enqueue_event_v1(text, text, json, text, uuid, timestamptz, integer, json, text, text)",
    "outbox__insert_v1(uuid, text, text, text, text, text, text, integer, timestamptz)",
    "outbox__with_context_v1(json, json)",
    "outbox__trace_context_v1(text, text)",
    "outbox__compact_v1(json)",
    "outbox__string_map_v1(text, json)",
    "outbox__check_json_v1(text, text, int)",
    "outbox__check_deliver_at_v1(timestamptz)",
    "outbox__check_attempts_v1(integer)",
    "outbox__check_stream_v1(text)",
    "outbox__check_key_v1(text)",
    "outbox__check_type_v1(text)",
    "outbox__check_name_v1(text, text)",
    "outbox__strip_v1(text)",
    "outbox__refuse_v1(text, text, text)",
]


def sql_text() -> str:
    """Every statement of the upgrade, the character classes filled in."""
    return (HELPERS + EVENT + AWS + EMAIL).replace("PYSPACE", _PY_SPACE).replace("'CONTROL'", f"'{_CONTROL}'")


def statements() -> list[str]:
    """The upgrade's statements, one CREATE FUNCTION each."""
    return [s.strip() + "$f$" for s in sql_text().split("$f$;") if s.strip()]


def upgrade() -> None:
    # Sent to the driver as written: the bodies hold colons and percent signs,
    # which SQLAlchemy's text() would take for parameters.
    bind = op.get_bind()
    for statement in statements():
        bind.exec_driver_sql(statement)


def downgrade() -> None:
    for signature in FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
