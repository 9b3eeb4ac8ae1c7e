-- The producer API's statements: enqueue in the caller's transaction.
-- The message id is the idempotency key (docs/design.md, "Enqueue").

-- name: same_message_as_m
-- The one definition of "the same message" for every idempotency check: the
-- stored message `o` with body `b` equals `m` (payloads compared as JSON values).
o.channel = m.channel AND o.destination = m.destination AND o.type = m.type
AND o.key IS NOT DISTINCT FROM m.key AND b.payload::jsonb = m.payload::jsonb

-- name: insert_message
-- Enqueue one message: body and state in one statement (the body's unique index
-- on (message_id, day) decides: an id lives in one day, outbox_id_day; no conflict
-- target, so that the old tables' key on message_id decides during an online
-- migration, docs/decisions/0069). Returns
-- whether a row was written and, when the id was taken, whether the holder is the same message (NULL: not visible to this snapshot).
-- A deliver_at in the past means now, so a backlog's age counts from the enqueue.
WITH m AS (
    SELECT CAST(:message_id AS uuid) AS message_id, CAST(:channel AS text) AS channel,
           CAST(:destination AS text) AS destination, CAST(:type AS text) AS type,
           CAST(:key AS text) AS key, CAST(:payload AS text) AS payload
), body AS (
    INSERT INTO outbox_message_body (message_id, payload, headers, day)
    VALUES (CAST(:message_id AS uuid), CAST(:payload AS json), CAST(:headers AS json),
            outbox_id_day(CAST(:message_id AS uuid)))
    ON CONFLICT DO NOTHING
    RETURNING seq, message_id, payload, day
), ins AS (
    INSERT INTO outbox_message
        (seq, message_id, channel, destination, type, key, payload_bytes, max_attempts, available_at, scheduled_at,
         day)
    SELECT seq, message_id, CAST(:channel AS text), CAST(:destination AS text), CAST(:type AS text),
           CAST(:key AS text), octet_length(payload::text), CAST(:max_attempts AS integer),
           greatest(CAST(:deliver_at AS timestamptz), now()),
           CASE WHEN CAST(:deliver_at AS timestamptz) > now() THEN CAST(:deliver_at AS timestamptz) END, day
      FROM body
    RETURNING seq
)
SELECT (SELECT count(*) FROM ins) AS inserted,
       (SELECT {{same_message_as_m}}
          FROM m JOIN outbox_message_body b ON b.message_id = m.message_id
          JOIN outbox_message o ON o.seq = b.seq AND o.day = b.day) AS same

-- name: same_message
-- The second look after a concurrent writer: is the message now stored under
-- :message_id the given one? (No row: the id holds no message.) By the message_id key.
SELECT {{same_message_as_m}}
  FROM (SELECT CAST(:message_id AS uuid) AS message_id, CAST(:channel AS text) AS channel,
               CAST(:destination AS text) AS destination, CAST(:type AS text) AS type,
               CAST(:key AS text) AS key, CAST(:payload AS text) AS payload) m
  JOIN outbox_message_body b ON b.message_id = m.message_id
  JOIN outbox_message o ON o.seq = b.seq AND o.day = b.day

-- name: insert_messages_bulk
-- Enqueue one chunk, given as one JSON array of objects; `i` keeps the caller's
-- order. Returns the positions `i` of the messages not written, their ids held
-- already ("same_messages" tells repeats from other messages). Conflicts on the
-- message_id key; no other index is read, so the plan's cost stays the chunk's
-- and it is never compiled with JIT (docs/decisions/0073).
WITH m AS (
    SELECT DISTINCT ON (message_id) *
      FROM json_to_recordset(CAST(:messages AS json))
           AS m(i int, message_id uuid, channel text, destination text, type text, key text,
                payload text, headers text, max_attempts int, deliver_at timestamptz)
     ORDER BY message_id, i
), body AS (
    INSERT INTO outbox_message_body (message_id, payload, headers, day)
    SELECT message_id, payload::json, headers::json, outbox_id_day(message_id) FROM m ORDER BY i
    ON CONFLICT DO NOTHING
    RETURNING seq, message_id, day
), ins AS (
    INSERT INTO outbox_message
        (seq, message_id, channel, destination, type, key, payload_bytes, max_attempts, available_at, scheduled_at,
         day)
    SELECT b.seq, b.message_id, m.channel, m.destination, m.type, m.key, octet_length(m.payload),
           m.max_attempts, greatest(m.deliver_at, now()), CASE WHEN m.deliver_at > now() THEN m.deliver_at END,
           b.day
      FROM body b JOIN m ON m.message_id = b.message_id
     ORDER BY b.seq
)
SELECT i FROM m WHERE message_id NOT IN (SELECT message_id FROM body) ORDER BY i

-- name: same_messages
-- The second look at a bulk chunk (the same JSON) for the positions :positions it
-- did not write, in a statement of its own so that it sees a writer that committed
-- while the chunk waited: those whose id is held by a different message. One
-- lookup by the message_id key per position, so that the plan is costed for them.
SELECT m.i
  FROM json_to_recordset(CAST(:messages AS json))
       AS m(i int, message_id uuid, channel text, destination text, type text, key text, payload text)
 WHERE m.i = ANY (CAST(:positions AS int[]))
   AND EXISTS (SELECT 1 FROM outbox_message_body b JOIN outbox_message o ON o.seq = b.seq AND o.day = b.day
                WHERE b.message_id = m.message_id AND NOT ({{same_message_as_m}}))
 ORDER BY m.i
