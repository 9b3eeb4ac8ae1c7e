"""Every SQL statement of the relay, named and kept together.

Rules that hold for all of them (DESIGN.md):
- time comes from the database: `now()`, never a timestamp from Python;
- one statement per unit of work, each its own short transaction (works through
  RDS Proxy and PgBouncer in transaction mode: no session state);
- every outcome write is fenced on `lease_owner = :owner AND status = 'leased'`.
"""

from __future__ import annotations

from sqlalchemy import text

TABLE = "outbox_message"

# Claim one batch for one channel, in one statement.
#
# Two branches, each a plain range scan of its own partial index (an OR across
# statuses in one scan would lose both indexes):
#   expired: leased rows whose lease ran out (their holder died or overran),
#            outbox_message_lease_expiry_idx (channel, lease_expires_at) WHERE leased;
#   due:     pending rows with available_at <= now(), oldest first,
#            outbox_message_pending_due_idx (channel, available_at, seq) WHERE pending.
# Expired leases go first; `due` only fills what they left of the batch.
# SKIP LOCKED lets concurrent claimers take disjoint rows without waiting.
# The UPDATE finds the picked rows through the primary key (`seq = ANY(ARRAY(…))`),
# not through a join with `picked`: once the table has statistics, the planner
# estimated the join at thousands of rows and chose a hash join over a
# sequential scan of the whole table (bench/: claim CPU 102 -> 53 µs per row at
# 30,000 rows, and a scan that grows with the table).
# Memory stays bounded: the batch also stops at max_bytes of payload JSON text
# (`payload_bytes`, stored at enqueue: what the relay holds in memory; not the
# on-disk size, which TOAST may have compressed), so a batch of large emails or
# events cannot exhaust a small Lambda.
# Payload and headers come from outbox_message_body (never updated, see
# migration 0003), one primary-key lookup per claimed row (LATERAL: always a
# nested loop on its index, whatever the planner estimates).
# A re-claimed row whose attempts already reached its maximum goes to dead
# with class lease_expired instead of being leased again; it is returned too,
# so the caller can count it.
# Each row comes back as six columns: the six the database generates (seq,
# status, attempts, max_attempts, message id, created_at: digits, a status
# word, a UUID and an ISO timestamp, none with a space) joined by spaces in
# the first, then destination, type, key, payload and headers as they are.
# pg8000 decodes every column in Python; eleven columns cost the relay
# 2.2 µs more per message than six (bench/: 17,500 -> 17,900 msg/s at batch
# 1,000). `models.ClaimedMessage.from_row` splits the first column.
CLAIM = text(
    """
    WITH expired AS (
        SELECT seq, payload_bytes AS size FROM outbox_message
         WHERE status = 'leased' AND channel = :channel AND lease_expires_at <= now()
         ORDER BY lease_expires_at
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
    ), due AS (
        SELECT seq, payload_bytes AS size FROM outbox_message
         WHERE status = 'pending' AND channel = :channel AND available_at <= now()
         ORDER BY available_at, seq
         LIMIT (SELECT :limit - count(*) FROM expired)
           FOR UPDATE SKIP LOCKED
    ), candidates AS (
        SELECT seq, size, 0 AS branch, row_number() OVER () AS n FROM expired
        UNION ALL
        SELECT seq, size, 1 AS branch, row_number() OVER () AS n FROM due
    ), picked AS (
        -- The byte budget: candidates in claim order while the stored payload
        -- bytes before them stay under the max_bytes parameter (the first always fits).
        -- Rows locked but not picked are unlocked when the statement ends.
        SELECT seq FROM (
            SELECT seq, size, sum(size) OVER (ORDER BY branch, n) AS running FROM candidates
        ) w
         WHERE running - size < :max_bytes
    ), claimed AS (
    UPDATE outbox_message o SET
        status           = CASE WHEN (o.status = 'leased' AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts)) THEN 'dead' ELSE 'leased' END,
        attempts         = CASE WHEN (o.status = 'leased' AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts)) THEN o.attempts ELSE o.attempts + 1 END,
        lease_owner      = CASE WHEN (o.status = 'leased' AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts)) THEN NULL ELSE :owner END,
        lease_expires_at = CASE WHEN (o.status = 'leased' AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts)) THEN NULL
                                ELSE now() + make_interval(secs => :lease_seconds) END,
        dead_at          = CASE WHEN (o.status = 'leased' AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts)) THEN now() ELSE o.dead_at END,
        last_error_class = CASE WHEN (o.status = 'leased' AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts)) THEN 'lease_expired' ELSE o.last_error_class END,
        last_error       = CASE WHEN (o.status = 'leased' AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts))
                                THEN 'lease expired with no attempts left (' || o.attempts || ' made); '
                                     || 'the holder died or overran its lease'
                                ELSE o.last_error END
     WHERE o.seq = ANY (ARRAY(SELECT seq FROM picked))
    RETURNING o.seq, o.message_id, o.status, o.destination, o.type, o.key, o.attempts,
              coalesce(o.max_attempts, :default_max_attempts) AS max_attempts,
              to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at
    )
    SELECT concat_ws(' ', c.seq, c.status, c.attempts, c.max_attempts, c.message_id, c.created_at),
           c.destination, c.type, c.key, b.payload::text, b.headers::text
      FROM claimed c
     CROSS JOIN LATERAL (SELECT payload, headers FROM outbox_message_body WHERE seq = c.seq) b
    """
)

# Age in seconds of the channel's oldest due pending message (0 when none), by
# the database clock: the OldestPendingAge metric. One read of the front of
# outbox_message_pending_due_idx.
_OLDEST_PENDING_AGE_SQL = """
    SELECT coalesce(EXTRACT(EPOCH FROM now() - min(available_at)), 0)::float8
      FROM outbox_message
     WHERE status = 'pending' AND channel = :channel AND available_at <= now()
"""

# Record the outcomes of one group of claimed messages in one statement,
# whatever their kinds. Arrays are parallel, one element per message, each
# sent as one array literal ('{1,2,3}', built by `store.array_literal`): pg8000
# encodes a Python list element by element, which cost more client time than
# the whole statement's server time (bench/: 27 -> 3 µs per message).
# kind: delivered | retry | dead | release (see models.OutcomeKind).
# error_classes, errors, refs and delays may be NULL (no element set).
# A retry whose attempts reached the maximum becomes dead here, with the
# database's view of attempts. A release refunds the claim's attempt.
# Fenced: a row changes only while `status = 'leased' AND lease_owner = :owner`.
# Rows not matched (lease lost: taken over, or redriven) are not touched.
# Returns one row: counts delivered, retried, dead, released, the seqs
# whose lease was lost (NULL when none), and the channel's oldest pending age
# in seconds, as OLDEST_PENDING_AGE computes it: the invocation's metric comes
# with its last outcome write instead of costing a statement of its own (three
# protocol round trips with pg8000, 1.5 ms on the bench machine). Every part of
# one statement reads the same snapshot, taken before this write: messages it
# makes pending again are not counted, and they could not be the oldest due
# one anyway (a release is due at now(), a retry later). The rows are found by
# `seq = ANY(:seqs)` and the fence, and joined to the values once. The planner
# may take the primary key or the lease-expiry partial index; it usually takes
# the latter, and then reads every leased row of the channel (EXPLAIN ANALYZE:
# 0.7 ms per 1,000 outcomes for one holder; with eight holders of 1,000 each,
# 4.3 ms in an earlier measurement and 1.1 ms, a bitmap
# scan, after ANALYZE; forcing the primary key costs about 3 ms).
RECORD_OUTCOMES = text(
    """
    WITH v AS (
        SELECT * FROM unnest(
            CAST(:seqs AS bigint[]), CAST(:kinds AS text[]), CAST(:error_classes AS text[]),
            CAST(:errors AS text[]), CAST(:refs AS text[]), CAST(:delays AS float8[])
        ) AS v(seq, kind, error_class, error, ref, delay)
    ), done AS (
        UPDATE outbox_message o SET
            status           = CASE WHEN v.kind = 'delivered' THEN 'delivered'
                                    WHEN v.kind = 'dead' THEN 'dead'
                                    WHEN v.kind = 'retry'
                                         AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts) THEN 'dead'
                                    ELSE 'pending' END,
            attempts         = CASE WHEN v.kind = 'release' THEN greatest(o.attempts - 1, 0) ELSE o.attempts END,
            available_at     = CASE WHEN v.kind = 'release'
                                      OR (v.kind = 'retry'
                                          AND o.attempts < coalesce(o.max_attempts, :default_max_attempts))
                                    THEN now() + make_interval(secs => coalesce(v.delay, 0))
                                    ELSE o.available_at END,
            lease_owner      = NULL,
            lease_expires_at = NULL,
            delivered_at     = CASE WHEN v.kind = 'delivered' THEN now() ELSE o.delivered_at END,
            delivery_ref     = coalesce(v.ref, o.delivery_ref),
            dead_at          = CASE WHEN v.kind = 'dead'
                                      OR (v.kind = 'retry'
                                          AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts))
                                    THEN now() ELSE o.dead_at END,
            last_error       = coalesce(v.error, o.last_error),
            last_error_class = coalesce(v.error_class, o.last_error_class)
          FROM v
         WHERE o.seq = ANY (CAST(:seqs AS bigint[])) AND o.seq = v.seq
           AND o.status = 'leased' AND o.lease_owner = :owner
        RETURNING o.seq, o.status, v.kind
    )
    SELECT count(*) FILTER (WHERE status = 'delivered'),
           count(*) FILTER (WHERE status = 'pending' AND kind <> 'release'),
           count(*) FILTER (WHERE status = 'dead'),
           count(*) FILTER (WHERE status = 'pending' AND kind = 'release'),
           (SELECT array_agg(v.seq ORDER BY v.seq) FROM v WHERE v.seq NOT IN (SELECT seq FROM done)),
           (""" + _OLDEST_PENDING_AGE_SQL + """)
      FROM done
    """
)


def _same_message(channel: str, destination: str, type_: str, key: str, payload_jsonb: str) -> str:
    """SQL that is true when the stored message (`o` in outbox_message, its body
    `b`) is the given one: the one definition of "the same message" for every
    idempotency check (payloads compared as JSON values, not as text)."""
    return (f"o.channel = {channel} AND o.destination = {destination} AND o.type = {type_} "
            f"AND o.key IS NOT DISTINCT FROM {key} AND b.payload::jsonb = {payload_jsonb}")


# Whether the message stored under :message_id is the one in the parameters
# (no row when the id holds no message).
_SAME_MESSAGE_SQL = f"""
    SELECT {_same_message(":channel", ":destination", ":type", "CAST(:key AS text)", "CAST(:payload AS jsonb)")}
      FROM outbox_message_body b JOIN outbox_message o ON o.seq = b.seq
     WHERE b.message_id = CAST(:message_id AS uuid)
"""
SAME_MESSAGE = text(_SAME_MESSAGE_SQL)

# The same for messages given as a JSON array of objects (a bulk chunk).
_SAME_AS_M = _same_message("m.channel", "m.destination", "m.type", "m.key", "m.payload::jsonb")

# Enqueue one message; the message id is the idempotency key. Returns whether
# a row was inserted and, when the id was already taken, whether the stored
# message is the same one (channel, destination, type, key, payload): a
# repeat is a no-op, a different message under the same id is refused by the
# caller. The check reads the statement's snapshot: when another transaction
# wrote the id concurrently (this INSERT waited for it to commit), the row is
# not visible to it and `same` is NULL; the caller then compares again with
# SAME_MESSAGE, a new statement that sees it (READ COMMITTED; at REPEATABLE
# READ or SERIALIZABLE PostgreSQL refuses such an INSERT with a serialization
# failure instead).
INSERT_MESSAGE = text(
    f"""
    WITH body AS (
        INSERT INTO outbox_message_body (message_id, payload, headers)
        VALUES (CAST(:message_id AS uuid), CAST(:payload AS json), CAST(:headers AS json))
        ON CONFLICT (message_id) DO NOTHING
        RETURNING seq, message_id, payload
    ), ins AS (
        INSERT INTO outbox_message
            (seq, message_id, channel, destination, type, key, payload_bytes, max_attempts, available_at)
        SELECT seq, message_id, CAST(:channel AS text), CAST(:destination AS text), CAST(:type AS text),
               CAST(:key AS text), octet_length(payload::text), CAST(:max_attempts AS integer),
               coalesce(CAST(:deliver_at AS timestamptz), now())
          FROM body
        RETURNING seq
    )
    SELECT (SELECT count(*) FROM ins) AS inserted, ({_SAME_MESSAGE_SQL}) AS same
    """
)

# Bulk enqueue: one statement per chunk. The chunk travels as one JSON array
# of objects (`producer.enqueue_events_bulk`), not as parallel text[] arrays:
# pg8000 writes array elements unquoted unless they are exactly "NULL", and
# PostgreSQL reads an unquoted null in any letter case as SQL NULL, so a key
# "null" or a payload of JSON null would be lost. `i` keeps the caller's order
# (seq follows it); a message id given twice in one chunk counts once (the
# producer has checked that both are the same message).
# Returns `(i, same)` for each message this statement did not write and that
# is not a repeat of the stored one: same is false when an existing message
# holds its id with other content, and the caller refuses the call; NULL when
# the holder is not visible (written by a transaction that committed while
# this statement waited; see INSERT_MESSAGE), and the caller compares again
# with SAME_MESSAGES.
INSERT_MESSAGES_BULK = text(
    f"""
    WITH m AS (
        SELECT DISTINCT ON (message_id) *
          FROM json_to_recordset(CAST(:messages AS json))
               AS m(i int, message_id uuid, channel text, destination text, type text, key text,
                    payload text, headers text, max_attempts int, deliver_at timestamptz)
         ORDER BY message_id, i
    ), body AS (
        INSERT INTO outbox_message_body (message_id, payload, headers)
        SELECT message_id, payload::json, headers::json FROM m ORDER BY i
        ON CONFLICT (message_id) DO NOTHING
        RETURNING seq, message_id
    ), ins AS (
        INSERT INTO outbox_message
            (seq, message_id, channel, destination, type, key, payload_bytes, max_attempts, available_at)
        SELECT b.seq, b.message_id, m.channel, m.destination, m.type, m.key, octet_length(m.payload),
               m.max_attempts, coalesce(m.deliver_at, now())
          FROM body b JOIN m ON m.message_id = b.message_id
         ORDER BY b.seq
    )
    SELECT i, same FROM (
        SELECT m.i, CASE WHEN o.seq IS NOT NULL THEN {_SAME_AS_M} END AS same
          FROM m
          LEFT JOIN outbox_message_body b ON b.message_id = m.message_id
          LEFT JOIN outbox_message o ON o.seq = b.seq
         WHERE m.message_id NOT IN (SELECT message_id FROM body)
    ) skipped
     WHERE same IS NOT TRUE
     ORDER BY i
    """
)

# The messages of a bulk chunk (same JSON as INSERT_MESSAGES_BULK) whose id is
# held by a different message, by `i`: the second look after a concurrent writer.
SAME_MESSAGES = text(
    f"""
    SELECT m.i
      FROM json_to_recordset(CAST(:messages AS json))
           AS m(i int, message_id uuid, channel text, destination text, type text, key text, payload text)
      JOIN outbox_message_body b ON b.message_id = m.message_id
      JOIN outbox_message o ON o.seq = b.seq
     WHERE NOT ({_SAME_AS_M})
     ORDER BY m.i
    """
)

# Oldest pending age per channel, seconds, by the database clock (backlog
# metric), when no outcome write read it (see _OLDEST_PENDING_AGE_SQL).
OLDEST_PENDING_AGE = text(_OLDEST_PENDING_AGE_SQL)
