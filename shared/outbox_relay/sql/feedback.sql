-- SES feedback: events recorded against their messages, the suppression list.
-- Why they are shaped as they are: docs/design.md, "SES feedback".

-- name: record_email_event
-- Record one SES event against its message, found by the outbox-message-id tag
-- (the body's message_id key) or else by the SES message id the relay stored
-- (outbox_message_ses_ref_idx). Only when the event is new (the unique
-- (ses_message_id, event_type, event_key) makes a redelivery insert nothing):
-- settle the send, since any event proves SES accepted it: a message waiting
-- (pending, or dead) is delivered now (a line of its history says so; and the
-- later rows of its key held back behind it are freed); one in flight (leased)
-- keeps its lease and takes the SES id, which its outcome write or the claim of
-- its expired lease reads as delivered. And add :suppress (address hashes) to the
-- suppression list. Returns whether the message was found, and how many events,
-- settled messages, addresses, freed rows and messages in flight were concerned.
WITH target AS (
    SELECT t.seq, t.message_id, t.day FROM (
        SELECT o.seq, o.message_id, o.day, 1 AS rank FROM outbox_message o
         WHERE (o.seq, o.day) = (SELECT b.seq, b.day FROM outbox_message_body b
                                  WHERE b.message_id = CAST(:tag_id AS uuid)
                                    AND b.day = outbox_id_day(CAST(:tag_id AS uuid)))
           AND o.channel = 'ses'
        UNION ALL
        SELECT o.seq, o.message_id, o.day, 2 FROM outbox_message o
         WHERE o.channel = 'ses' AND o.delivery_ref IS NOT NULL AND o.delivery_ref = :ses_id
    ) t
     ORDER BY t.rank
     LIMIT 1
), inserted AS (
    INSERT INTO outbox_email_event (message_id, ses_message_id, event_type, event_at, subtype, recipients,
                                    configuration_set, event_key)
    SELECT t.message_id, :ses_id, :event_type, CAST(:event_at AS timestamptz), :subtype,
           coalesce(CAST(:recipients AS text[]), '{}'), :configuration_set, :event_key
      FROM target t
    ON CONFLICT ON CONSTRAINT outbox_email_event_once DO NOTHING
    RETURNING message_id
), settled AS (
    -- One UPDATE whatever the state: run after a concurrent outcome write or claim
    -- committed, it acts on the row as that left it (pending now, leased anew, dead).
    UPDATE outbox_message o SET
        status       = CASE WHEN o.status = 'leased' THEN 'leased' ELSE 'delivered' END,
        delivered_at = CASE WHEN o.status = 'leased' THEN o.delivered_at ELSE now() END,
        dead_at      = CASE WHEN o.status = 'leased' THEN o.dead_at END,
        delivery_ref = coalesce(o.delivery_ref, :ses_id)
     WHERE o.seq = (SELECT seq FROM target) AND EXISTS (SELECT 1 FROM inserted)
       AND o.status IN ('pending', 'leased', 'dead')
    RETURNING o.seq, o.day, o.status, o.destination, o.key, o.available_at, o.attempts
), settled_history AS (
    INSERT INTO outbox_message_history (seq, day, event, attempt, ref, actor)
    SELECT s.seq, s.day, 'settled', s.attempts, :ses_id, 'feedback' FROM settled s WHERE s.status = 'delivered'
), key_freed AS (
    -- Later rows of its key that claims moved to the end of its window (turn_of) are due
    -- now (outbox_message_key_active_idx); a row scheduled later keeps its time.
    UPDATE outbox_message k SET available_at = now()
      FROM settled s
     WHERE s.status = 'delivered' AND s.key IS NOT NULL AND k.channel = 'ses' AND k.destination = s.destination
       AND k.key >= s.key AND k.key <= s.key AND k.seq > s.seq
       AND k.status = 'pending' AND k.available_at = s.available_at
       AND (k.scheduled_at IS NULL OR k.scheduled_at <= now())
    RETURNING k.seq
), suppressed AS (
    INSERT INTO outbox_suppression (address_hash, reason, detail, message_id)
    SELECT h, :suppress_reason, :subtype, i.message_id
      FROM inserted i, unnest(coalesce(CAST(:suppress AS text[]), '{}')) h
    ON CONFLICT (address_hash) DO NOTHING
    RETURNING address_hash
)
SELECT (SELECT count(*) FROM target), (SELECT count(*) FROM inserted),
       (SELECT count(*) FROM settled WHERE status = 'delivered'), (SELECT count(*) FROM suppressed),
       (SELECT count(*) FROM key_freed), (SELECT count(*) FROM settled WHERE status = 'leased')

-- name: suppressed_among
-- Which of :hashes (address hashes) are on the suppression list, with the reason (primary key).
SELECT address_hash, reason FROM outbox_suppression WHERE address_hash = ANY (CAST(:hashes AS text[]))

-- name: suppression_add
-- An operator adds an address hash (kept if it is there already, with its first reason).
INSERT INTO outbox_suppression (address_hash, reason, detail)
VALUES (:address_hash, 'manual', :detail)
ON CONFLICT (address_hash) DO NOTHING
RETURNING created_at

-- name: suppression_remove
-- An operator takes an address hash off the list.
DELETE FROM outbox_suppression WHERE address_hash = :address_hash RETURNING reason

-- name: suppression_list
-- The list, newest first, at most :limit rows.
SELECT address_hash, reason, detail, message_id, created_at FROM outbox_suppression
 ORDER BY created_at DESC, address_hash
 LIMIT :limit

-- name: email_events_of
-- Every feedback event of one message, in the order they happened (outbox_email_event_message_idx).
SELECT event_type, event_at, subtype, ses_message_id, configuration_set, cardinality(recipients) AS recipients,
       received_at
  FROM outbox_email_event
 WHERE message_id = CAST(:message_id AS uuid)
 ORDER BY event_at, id

-- name: purge_email_events
-- Events received before :older_than_seconds ago, at most :limit of them (outbox_email_event_received_idx).
DELETE FROM outbox_email_event
 WHERE id = ANY (ARRAY(SELECT id FROM outbox_email_event
                        WHERE received_at < now() - make_interval(secs => :older_than_seconds)
                        ORDER BY received_at LIMIT :limit))

-- name: feedback_stats
-- Per channel (`outbox stats`): messages waiting after an ambiguous send and
-- dead-lettered as suppressed (one scan of the table), and messages with a
-- bounce or a complaint recorded (one scan of the events).
SELECT m.channel, m.ambiguous, m.suppressed,
       coalesce(e.bounced, 0) AS bounced, coalesce(e.complained, 0) AS complained
  FROM (SELECT channel,
               count(*) FILTER (WHERE status = 'pending' AND last_error_class = 'ambiguous') AS ambiguous,
               count(*) FILTER (WHERE status = 'dead' AND last_error_class = 'suppressed') AS suppressed
          FROM outbox_message GROUP BY channel) m
  LEFT JOIN (SELECT CAST('ses' AS text) AS channel,
                    count(DISTINCT message_id) FILTER (WHERE event_type = 'bounce') AS bounced,
                    count(DISTINCT message_id) FILTER (WHERE event_type = 'complaint') AS complained
               FROM outbox_email_event) e ON e.channel = m.channel
 ORDER BY m.channel
