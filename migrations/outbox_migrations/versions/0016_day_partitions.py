"""Storage whose cost does not grow with history: delivered rows, bodies and history in day
partitions, retention by dropping days (docs/decisions/0066, amending 0065).

- `outbox_day`: the open days (days since the epoch). `outbox_id_day(id)` is the day of a
  UUIDv7 when that day is open, else 0: the partition a message id lives in. A day is opened
  before any id of it can arrive and closed before its partitions go, so an id maps to one
  day at any time and the unique key (message_id, day) is unique on message_id.
- `outbox_message` is `PARTITION BY LIST (status)`: `outbox_message_live` (every status but
  delivered) holds the claim's partial indexes; `outbox_message_done` (delivered) is
  `PARTITION BY RANGE (day)`. Delivering a row moves it (row movement) into its day.
- `outbox_message_body` and `outbox_message_history` are `PARTITION BY RANGE (day)` with the
  same days. Their ids come from sequences (a partitioned table has no identity column),
  drawn by functions of the owner's, so that no role needs a new right.
- The body foreign key goes: a message and its body are written in one statement and leave
  together, by DELETE (the triggers, kept) or by dropping their day's partitions; a trigger
  still refuses to delete a body whose message exists.
- `outbox_open_day(day)` creates a day's three partitions and opens it; `outbox_drop_day(day,
  keep_since)` closes it, moves to day 0 what must stay (rows not delivered, rows delivered
  since `keep_since`) and drops its partitions. Day 0 holds every other id.

The copy is offline: the three tables are locked for it. Every row is placed by `outbox_id_day`
after the window's days are opened, as producers will. When `outbox migrate --online` has built
and filled the tables beside the old ones (schema `outbox_online`, docs/decisions/0069), the
upgrade only swaps them in, to the same result.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""
import time

from alembic import op
from sqlalchemy.exc import DBAPIError

from outbox_migrations.grants import copy_grants

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

#: Days opened by the upgrade on either side of today: the default delivered window and margin.
DAYS_BEHIND, DAYS_AHEAD = 7, 7

ID_DAY = """
CREATE FUNCTION outbox_id_day(id uuid) RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path FROM CURRENT AS $f$
    -- A UUIDv7's first 48 bits are its Unix milliseconds; any other id, or a day not open: 0.
    SELECT coalesce((SELECT d.day FROM outbox_day d
                      WHERE substr(id::text, 15, 1) = '7'
                        AND d.day = (('x' || lpad(substr(replace(id::text, '-', ''), 1, 12), 16, '0'))::bit(64)::bigint
                                     / 86400000)::int), 0)
$f$;
"""

FUNCTIONS = """
-- The owner's rights, so that a relay's user that does not own the tables can run maintenance;
-- callable only by the roles granted it below.
CREATE FUNCTION outbox_open_day(d int) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
BEGIN
    IF d <= 0 OR EXISTS (SELECT 1 FROM outbox_day WHERE day = d) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE IF NOT EXISTS outbox_message_done_d%s PARTITION OF outbox_message_done '
                   'FOR VALUES FROM (%s) TO (%s)', d, d, d + 1);
    EXECUTE format('CREATE TABLE IF NOT EXISTS outbox_message_body_d%s PARTITION OF outbox_message_body '
                   'FOR VALUES FROM (%s) TO (%s)', d, d, d + 1);
    EXECUTE format('CREATE TABLE IF NOT EXISTS outbox_message_history_d%s PARTITION OF outbox_message_history '
                   'FOR VALUES FROM (%s) TO (%s)', d, d, d + 1);
    INSERT INTO outbox_day (day) VALUES (d);
    RETURN true;
END $f$;

CREATE FUNCTION outbox_drop_day(d int, keep_since timestamptz) RETURNS bigint
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
    LOCK TABLE outbox_message, outbox_message_body, outbox_message_history IN ACCESS EXCLUSIVE MODE;
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

DAYS = "CREATE TABLE outbox_day (day int PRIMARY KEY CHECK (day > 0))"

TABLES = """
CREATE TABLE outbox_message (LIKE outbox_message_v15 INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                                 day int NOT NULL DEFAULT 0)
    PARTITION BY LIST (status);
CREATE TABLE outbox_message_live PARTITION OF outbox_message
    FOR VALUES IN ('pending', 'leased', 'dead', 'discarded') WITH (fillfactor = 80);
CREATE TABLE outbox_message_done PARTITION OF outbox_message
    FOR VALUES IN ('delivered') PARTITION BY RANGE (day);
CREATE TABLE outbox_message_done_d0 PARTITION OF outbox_message_done FOR VALUES FROM (0) TO (1);

CREATE TABLE outbox_message_body (seq bigint NOT NULL, message_id uuid NOT NULL, payload json NOT NULL,
                                      headers json, day int NOT NULL DEFAULT 0)
    PARTITION BY RANGE (day);
CREATE TABLE outbox_message_body_d0 PARTITION OF outbox_message_body FOR VALUES FROM (0) TO (1);

CREATE TABLE outbox_message_history (LIKE outbox_message_history_v15 INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                                         day int NOT NULL DEFAULT 0)
    PARTITION BY RANGE (day);
CREATE TABLE outbox_message_history_d0 PARTITION OF outbox_message_history FOR VALUES FROM (0) TO (1);
"""

# Which days are open is no secret; opening and dropping days is the relay's maintenance, so
# the roles that may delete messages (the relay's, decision 0066) may run it.
DAY_RIGHTS = """
GRANT SELECT ON outbox_day TO PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox_open_day(int), outbox_drop_day(int, timestamptz) FROM PUBLIC;
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT DISTINCT quote_ident(pg_get_userbyid(a.grantee)) AS grantee
               FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
              WHERE c.oid = 'outbox_message_v15'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
                AND a.privilege_type = 'DELETE'
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION outbox_open_day(int), outbox_drop_day(int, timestamptz) TO %s',
                       r.grantee);
    END LOOP;
END
$$;
"""

FINISH = """
DROP TABLE outbox_message_v15, outbox_message_body_v15, outbox_message_history_v15;
"""

# The sequences go on after the highest id copied ({body_after} and {history_after}).
SEQUENCES = """

-- Drawn through functions of the owner's: whoever may insert a row needs no right on a sequence,
-- as with the identity columns before.
CREATE SEQUENCE outbox_message_body_seq_seq OWNED BY outbox_message_body.seq;
SELECT setval('outbox_message_body_seq_seq', {body_after}, false);
CREATE FUNCTION outbox__next_body_seq() RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $f$
    SELECT nextval('outbox_message_body_seq_seq')
$f$;
ALTER TABLE outbox_message_body ALTER COLUMN seq SET DEFAULT outbox__next_body_seq();
CREATE SEQUENCE outbox_message_history_id_seq OWNED BY outbox_message_history.id;
SELECT setval('outbox_message_history_id_seq', {history_after}, false);
CREATE FUNCTION outbox__next_history_id() RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $f$
    SELECT nextval('outbox_message_history_id_seq')
$f$;
ALTER TABLE outbox_message_history ALTER COLUMN id SET DEFAULT outbox__next_history_id();

-- What the foreign key to the body did: a body is not deleted from under its message.
CREATE FUNCTION outbox_message_body_keep() RETURNS trigger
LANGUAGE plpgsql AS $f$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_message o
                WHERE o.seq = ANY (ARRAY(SELECT seq FROM gone))
                  AND (o.seq, o.day) IN (SELECT seq, day FROM gone)) THEN
        RAISE EXCEPTION 'a body cannot be deleted while its message exists (the foreign key of decision 0066)'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END $f$;
CREATE TRIGGER outbox_message_body_keep AFTER DELETE ON outbox_message_body REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_body_keep();
"""

KEYS = """
ALTER TABLE outbox_message_live ADD CONSTRAINT outbox_message_pkey PRIMARY KEY (seq);
ALTER TABLE outbox_message_done ADD CONSTRAINT outbox_message_done_pkey PRIMARY KEY (seq, day);
ALTER TABLE outbox_message_body ADD CONSTRAINT outbox_message_body_pkey PRIMARY KEY (seq, day);
ALTER TABLE outbox_message_body ADD CONSTRAINT outbox_message_body_message_id_key UNIQUE (message_id, day);
ALTER TABLE outbox_message_history ADD CONSTRAINT outbox_message_history_pkey PRIMARY KEY (seq, id, day);

-- The claim's partial indexes, on the live partition only.
CREATE INDEX outbox_message_pending_due_idx ON outbox_message_live (channel, available_at, seq)
    WHERE status = 'pending';
CREATE INDEX outbox_message_lease_expiry_idx ON outbox_message_live (channel, lease_expires_at)
    WHERE status = 'leased';
CREATE INDEX outbox_message_dead_idx ON outbox_message_live (channel, dead_at) WHERE status = 'dead';
CREATE INDEX outbox_message_discarded_idx ON outbox_message_live (channel, dead_at) WHERE status = 'discarded';
CREATE INDEX outbox_message_key_active_idx ON outbox_message_live (channel, destination, key, seq)
    WHERE key IS NOT NULL AND status IN ('pending', 'leased');
CREATE INDEX outbox_message_key_dead_idx ON outbox_message_live (channel, destination, key, seq)
    WHERE key IS NOT NULL AND status = 'dead';
CREATE INDEX outbox_message_ses_ref_idx ON outbox_message_live (delivery_ref)
    WHERE channel = 'ses' AND delivery_ref IS NOT NULL;
-- Delivered rows: the purge's and the lag's order, and SES feedback by the SES id.
CREATE INDEX outbox_message_delivered_at_idx ON outbox_message_done (delivered_at);
CREATE INDEX outbox_message_done_ses_ref_idx ON outbox_message_done (delivery_ref)
    WHERE channel = 'ses' AND delivery_ref IS NOT NULL;
"""

TRIGGERS = """
CREATE TRIGGER outbox_message_delete_bodies AFTER DELETE ON outbox_message REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_delete_bodies();
CREATE TRIGGER outbox_message_delete_history AFTER DELETE ON outbox_message REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_delete_history();
CREATE TRIGGER outbox_message_truncate_bodies AFTER TRUNCATE ON outbox_message
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_truncate_bodies();
CREATE TRIGGER outbox_message_truncate_history AFTER TRUNCATE ON outbox_message
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_truncate_history();
"""

# A day's rows by their key: each partition's primary key, pruned to the days deleted.
DELETE_BY_DAY = """
CREATE OR REPLACE FUNCTION outbox_message_delete_{what}() RETURNS trigger
LANGUAGE plpgsql AS $f$
BEGIN
    DELETE FROM outbox_message_{what}
     WHERE seq = ANY (ARRAY(SELECT seq FROM gone)) AND day = ANY (ARRAY(SELECT DISTINCT day FROM gone));
    RETURN NULL;
END $f$
"""
DELETE_BY_SEQ = """
CREATE OR REPLACE FUNCTION outbox_message_delete_{what}() RETURNS trigger
LANGUAGE plpgsql AS $f$
        BEGIN
            DELETE FROM outbox_message_{what} WHERE seq = ANY (ARRAY(SELECT seq FROM gone));
            RETURN NULL;
        END
        $f$
"""

INSERT_V1 = """
CREATE OR REPLACE FUNCTION outbox__insert_v1(p_message_id uuid, p_channel text, p_destination text, p_type text, p_key text, p_payload text, p_headers text, p_max_attempts integer, p_deliver_at timestamp with time zone) RETURNS uuid
    LANGUAGE plpgsql
    AS $f$
DECLARE
    inserted bigint;
    same boolean;
BEGIN
    -- A day opens before its ids are accepted (outbox_drop_day, outbox_open_day): one further
    -- ahead could land in day 0 and, once its day opens, again in its day.
    IF substr(p_message_id::text, 15, 1) = '7'
       AND ('x' || lpad(substr(replace(p_message_id::text, '-', ''), 1, 12), 16, '0'))::bit(64)::bigint
           > (extract(epoch FROM now() + interval '1 day') * 1000)::bigint THEN
        PERFORM outbox__refuse_v1('message_id', 'is a UUIDv7 more than a day ahead of the database clock');
    END IF;
    WITH body AS (
        INSERT INTO outbox_message_body (message_id, payload, headers, day)
        VALUES (p_message_id, p_payload::json, p_headers::json, outbox_id_day(p_message_id))
        ON CONFLICT (message_id, day) DO NOTHING
        RETURNING seq, message_id, payload, day
    ), ins AS (
        INSERT INTO outbox_message
            (seq, message_id, channel, destination, type, key, payload_bytes, max_attempts, available_at,
             scheduled_at, day)
        SELECT seq, message_id, p_channel, p_destination, p_type, p_key, octet_length(payload::text),
               p_max_attempts, greatest(p_deliver_at, now()),
               CASE WHEN p_deliver_at > now() THEN p_deliver_at END, day
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
      JOIN outbox_message o ON o.seq = b.seq AND o.day = b.day;
    IF same IS NOT TRUE THEN
        PERFORM outbox__refuse_v1('message_id',
            'already used by a different message (channel, destination, type, key or payload differ); '
            'an idempotency key must identify one message', 'OB002');
    END IF;
    RETURN p_message_id;
END$f$
"""

INSERT_V1_BEFORE = """
CREATE OR REPLACE FUNCTION outbox__insert_v1(p_message_id uuid, p_channel text, p_destination text, p_type text, p_key text, p_payload text, p_headers text, p_max_attempts integer, p_deliver_at timestamp with time zone) RETURNS uuid
    LANGUAGE plpgsql
    AS $f$
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
END$f$
"""

#: The schema where `outbox migrate --online` builds and fills the new tables beside the old
#: (outbox_migrations.online); when it is there, the upgrade only swaps them in.
STAGING = "outbox_online"
#: Each try to lock the old tables for the swap waits this long, below the deadlock timeout, so
#: that a producer or relay holding them wins; the tries, a second apart.
SWAP_LOCK_TIMEOUT, SWAP_TRIES = "200ms", 30
TABLE_NAMES = ("outbox_message", "outbox_message_body", "outbox_message_history")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.exec_driver_sql(f"SELECT to_regnamespace('{STAGING}')").scalar() is not None:
        _swap(bind)
        return
    bind.exec_driver_sql(f"LOCK TABLE {', '.join(TABLE_NAMES)} IN ACCESS EXCLUSIVE MODE")
    for t in TABLE_NAMES:
        bind.exec_driver_sql(f"ALTER TABLE {t} RENAME TO {t}_v15")
    bind.exec_driver_sql(DAYS)
    bind.exec_driver_sql(TABLES)
    bind.exec_driver_sql(ID_DAY)
    bind.exec_driver_sql(FUNCTIONS)
    _open_days(bind)
    # Each row where a producer would place it now.
    bind.exec_driver_sql("""
        INSERT INTO outbox_message_body (seq, message_id, payload, headers, day)
        SELECT seq, message_id, payload, headers, outbox_id_day(message_id) FROM outbox_message_body_v15;
        INSERT INTO outbox_message SELECT o.*, b.day FROM outbox_message_v15 o
          JOIN outbox_message_body b ON b.seq = o.seq;
        INSERT INTO outbox_message_history SELECT h.*, coalesce(b.day, 0) FROM outbox_message_history_v15 h
          LEFT JOIN outbox_message_body b ON b.seq = h.seq;
    """)
    _finish(bind, "coalesce((SELECT max(seq) FROM outbox_message_body), 0) + 1",
            "coalesce((SELECT max(id) FROM outbox_message_history), 0) + 1", keys=True)


def _open_days(bind) -> None:
    bind.exec_driver_sql(f"SELECT outbox_open_day(d) FROM generate_series("
                         f"(current_date - DATE '1970-01-01') - {DAYS_BEHIND}, "
                         f"(current_date - DATE '1970-01-01') + {DAYS_AHEAD}) d")


def _finish(bind, body_after: str, history_after: str, keys: bool) -> None:
    _rights(bind, "")
    bind.exec_driver_sql(FINISH)
    _complete(bind, body_after, history_after, keys)


def _rights(bind, schema: str) -> None:
    for t in TABLE_NAMES:
        bind.exec_driver_sql(copy_grants(f"{t}_v15", f"{schema}{t}"))
    bind.exec_driver_sql(DAY_RIGHTS)


def _complete(bind, body_after: str, history_after: str, keys: bool) -> None:
    bind.exec_driver_sql(SEQUENCES.replace("{body_after}", body_after).replace("{history_after}", history_after))
    if keys:
        bind.exec_driver_sql(KEYS)
    bind.exec_driver_sql(TRIGGERS)
    for what in ("bodies", "history"):
        bind.exec_driver_sql(DELETE_BY_DAY.format(what=what).replace("outbox_message_bodies", "outbox_message_body"))
    bind.exec_driver_sql(INSERT_V1)


def _swap(bind) -> None:
    """The online path's last step: the new tables, filled and kept in step by triggers, take
    the old ones' place in one short transaction (docs/decisions/0069)."""
    if bind.exec_driver_sql(f"SELECT to_regclass('{STAGING}.progress')").scalar() is None:
        raise RuntimeError(f"schema {STAGING}: the online migration is half prepared; "
                           "run `outbox migrate --online` to go on")
    for tries_left in range(SWAP_TRIES - 1, -1, -1):
        try:
            with bind.begin_nested():
                bind.exec_driver_sql(f"SET LOCAL lock_timeout = '{SWAP_LOCK_TIMEOUT}'")
                # The parents in the order every statement and outbox_drop_day take them.
                bind.exec_driver_sql(f"LOCK TABLE {', '.join(TABLE_NAMES)} IN ACCESS EXCLUSIVE MODE")
            break
        except DBAPIError as exc:  # lock_not_available: a writer holds them; the next try
            if not tries_left or "55P03" not in (getattr(exc.orig, "pgcode", None) or str(exc.orig)):
                raise
            time.sleep(1)
    copied, mark = bind.exec_driver_sql(f"SELECT copied, mark FROM {STAGING}.progress").one()
    if copied < mark:
        raise RuntimeError(f"schema {STAGING}: rows up to seq {mark} are copied up to {copied} only; "
                           "run `outbox migrate --online` until it says copied")
    # The sequences go on after the old ones (no scan of the history for its highest id).
    after = [bind.exec_driver_sql(f"SELECT last_value + 1 FROM {seq}").scalar() for seq in (
        bind.exec_driver_sql(f"SELECT pg_get_serial_sequence('{t}', '{c}')").scalar()
        for t, c in (("outbox_message_body", "seq"), ("outbox_message_history", "id")))]
    for t in TABLE_NAMES:
        bind.exec_driver_sql(f"ALTER TABLE {t} RENAME TO {t}_v15")
    bind.exec_driver_sql(FUNCTIONS)
    _rights(bind, f"{STAGING}.")
    bind.exec_driver_sql(FINISH)
    schema = bind.exec_driver_sql("SELECT quote_ident(current_schema())").scalar()
    for (name,) in bind.exec_driver_sql(
            f"SELECT relname FROM pg_class WHERE relnamespace = '{STAGING}'::regnamespace "
            f"AND relkind IN ('r', 'p') AND relname <> 'progress'").all():
        bind.exec_driver_sql(f"ALTER TABLE {STAGING}.{name} SET SCHEMA {schema}")
    _open_days(bind)
    _complete(bind, str(after[0]), str(after[1]), keys=False)
    bind.exec_driver_sql(f"DROP SCHEMA {STAGING} CASCADE")


DOWN_TABLES = """
LOCK TABLE outbox_message, outbox_message_body, outbox_message_history IN ACCESS EXCLUSIVE MODE;
CREATE TABLE outbox_message_body_old (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                      message_id uuid NOT NULL UNIQUE, payload json NOT NULL, headers json);
INSERT INTO outbox_message_body_old (seq, message_id, payload, headers) OVERRIDING SYSTEM VALUE
SELECT seq, message_id, payload, headers FROM outbox_message_body;
CREATE TABLE outbox_message_old (LIKE outbox_message INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    WITH (fillfactor = 80);
ALTER TABLE outbox_message_old DROP COLUMN day;
INSERT INTO outbox_message_old SELECT seq, message_id, channel, destination, type, key, status, attempts,
       max_attempts, available_at, lease_owner, lease_expires_at, last_error, last_error_class, delivery_ref,
       created_at, delivered_at, dead_at, payload_bytes, scheduled_at FROM outbox_message;
CREATE TABLE outbox_message_history_old (LIKE outbox_message_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE outbox_message_history_old DROP COLUMN day;
ALTER TABLE outbox_message_history_old ALTER COLUMN id DROP DEFAULT;
ALTER TABLE outbox_message_history_old ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY;
INSERT INTO outbox_message_history_old OVERRIDING SYSTEM VALUE
SELECT seq, id, at, event, attempt, error_class, error, ref, actor, next_at FROM outbox_message_history;
"""

DOWN_RENAME = """
DROP TABLE outbox_message, outbox_message_body, outbox_message_history, outbox_day;
DROP FUNCTION outbox_id_day(uuid), outbox_open_day(int), outbox_drop_day(int, timestamptz),
    outbox__next_body_seq(), outbox__next_history_id(), outbox_message_body_keep();
ALTER TABLE outbox_message_old RENAME TO outbox_message;
ALTER TABLE outbox_message_body_old RENAME TO outbox_message_body;
ALTER TABLE outbox_message_history_old RENAME TO outbox_message_history;
ALTER SEQUENCE outbox_message_body_old_seq_seq RENAME TO outbox_message_body_seq_seq;
ALTER SEQUENCE outbox_message_history_old_id_seq RENAME TO outbox_message_history_id_seq;
SELECT setval('outbox_message_body_seq_seq', coalesce((SELECT max(seq) FROM outbox_message_body), 0) + 1, false);
SELECT setval('outbox_message_history_id_seq', coalesce((SELECT max(id) FROM outbox_message_history), 0) + 1,
              false);
ALTER TABLE outbox_message_body RENAME CONSTRAINT outbox_message_body_old_pkey TO outbox_message_body_pkey;
ALTER TABLE outbox_message_body RENAME CONSTRAINT outbox_message_body_old_message_id_key
    TO outbox_message_body_message_id_key;
ALTER TABLE outbox_message ADD CONSTRAINT outbox_message_pkey PRIMARY KEY (seq);
ALTER TABLE outbox_message ADD CONSTRAINT outbox_message_seq_fkey FOREIGN KEY (seq)
    REFERENCES outbox_message_body (seq);
ALTER TABLE outbox_message_history ADD CONSTRAINT outbox_message_history_pkey PRIMARY KEY (seq, id);
CREATE INDEX outbox_message_pending_due_idx ON outbox_message (channel, available_at, seq) WHERE status = 'pending';
CREATE INDEX outbox_message_lease_expiry_idx ON outbox_message (channel, lease_expires_at) WHERE status = 'leased';
CREATE INDEX outbox_message_dead_idx ON outbox_message (channel, dead_at) WHERE status = 'dead';
CREATE INDEX outbox_message_discarded_idx ON outbox_message (channel, dead_at) WHERE status = 'discarded';
CREATE INDEX outbox_message_delivered_at_idx ON outbox_message (delivered_at) WHERE status = 'delivered';
CREATE INDEX outbox_message_key_active_idx ON outbox_message (channel, destination, key, seq)
    WHERE key IS NOT NULL AND status IN ('pending', 'leased');
CREATE INDEX outbox_message_key_dead_idx ON outbox_message (channel, destination, key, seq)
    WHERE key IS NOT NULL AND status = 'dead';
CREATE INDEX outbox_message_ses_ref_idx ON outbox_message (delivery_ref)
    WHERE channel = 'ses' AND delivery_ref IS NOT NULL;
CREATE TRIGGER outbox_message_delete_bodies AFTER DELETE ON outbox_message REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_delete_bodies();
CREATE TRIGGER outbox_message_delete_history AFTER DELETE ON outbox_message REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_delete_history();
CREATE TRIGGER outbox_message_truncate_bodies AFTER TRUNCATE ON outbox_message
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_truncate_bodies();
CREATE TRIGGER outbox_message_truncate_history AFTER TRUNCATE ON outbox_message
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_message_truncate_history();
"""


def downgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql(INSERT_V1_BEFORE)
    bind.exec_driver_sql(DOWN_TABLES)
    for new in ("outbox_message", "outbox_message_body", "outbox_message_history"):
        bind.exec_driver_sql(copy_grants(new, f"{new}_old"))
    bind.exec_driver_sql(DOWN_RENAME)
    for what in ("bodies", "history"):
        bind.exec_driver_sql(DELETE_BY_SEQ.format(what=what).replace("outbox_message_bodies", "outbox_message_body"))
