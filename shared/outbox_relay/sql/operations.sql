-- Operating the outbox: statistics, backlog, dead letters, redrive, retention.
-- Long work runs in bounded batches, one short transaction each (docs/design.md, "Operations").

-- name: stats
-- Counts per channel and status, expired leases, recent dead letters and the
-- oldest due message's age (`outbox stats`): one scan of the table.
SELECT channel,
       count(*) FILTER (WHERE status = 'pending')                              AS pending,
       count(*) FILTER (WHERE status = 'pending' AND available_at <= now())    AS due_now,
       count(*) FILTER (WHERE status = 'leased')                               AS leased,
       count(*) FILTER (WHERE status = 'leased' AND lease_expires_at <= now()) AS expired_leases,
       count(*) FILTER (WHERE status = 'delivered')                            AS delivered,
       count(*) FILTER (WHERE status = 'dead')                                 AS dead,
       count(*) FILTER (WHERE status = 'discarded')                            AS discarded,
       count(*) FILTER (WHERE status = 'dead' AND dead_at > now() - interval '1 hour') AS dead_last_hour,
       count(*) FILTER (WHERE status = 'dead' AND dead_at > now() - interval '1 day')  AS dead_last_day,
       coalesce(EXTRACT(EPOCH FROM now() - min(available_at)
                FILTER (WHERE status = 'pending' AND available_at <= now())), 0)::float8
                                                                                AS oldest_pending_age_seconds
  FROM outbox_message
 GROUP BY channel
 ORDER BY channel

-- name: held_keys
-- Keys whose messages wait (`outbox stats`), per channel, from each key's first
-- message that holds it back (outbox_message_key_active_idx): waiting for a
-- retry of that message, and behind a dead letter (held there under the block
-- policy, skipped under skip).
SELECT channel,
       count(*) FILTER (WHERE waits_for_retry) AS keys_waiting_for_retry,
       count(*) FILTER (WHERE behind_dead) AS keys_behind_dead_letter
  FROM (SELECT h.channel,
               h.status = 'pending' AND h.available_at > now() AS waits_for_retry,
               EXISTS (SELECT 1 FROM outbox_message d
                        WHERE d.channel = h.channel AND d.destination = h.destination AND d.key = h.key
                          AND d.status = 'dead' AND d.seq < h.seq) AS behind_dead
          FROM (SELECT DISTINCT ON (channel, destination, key) channel, destination, key, seq, status, available_at
                  FROM outbox_message k
                 WHERE k.key IS NOT NULL AND {{holds_back_its_key}}
                 ORDER BY channel, destination, key, seq) h) w
 GROUP BY channel

-- name: recent_deliveries
-- Each message delivered in the last :window_seconds, with its channel, its delivery
-- lag (ms, from created_at or the later scheduled_at) and its delivered_at: a range
-- of outbox_message_delivered_at_idx.
SELECT channel, delivered_at,
       EXTRACT(EPOCH FROM delivered_at - greatest(created_at, scheduled_at)) * 1000 AS lag
  FROM outbox_message
 WHERE status = 'delivered' AND delivered_at >= now() - make_interval(secs => :window_seconds)

-- name: recent_delivery_lag
-- Delivery lag (ms) of each channel's messages delivered in the last :window_seconds.
SELECT channel, count(*) AS delivered,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99,
       max(lag) AS max
  FROM ({{recent_deliveries}}) d
 GROUP BY channel

-- name: delivery_lag_series
-- The same deliveries in :buckets slices of the window, oldest first (`outbox stats
-- --chart`): each slice's count and largest lag, per channel.
SELECT channel,
       least(floor(EXTRACT(EPOCH FROM delivered_at - (now() - make_interval(secs => :window_seconds)))
                   * :buckets / :window_seconds)::int, :buckets - 1) AS bucket,
       count(*) AS delivered, max(lag) AS max
  FROM ({{recent_deliveries}}) d
 GROUP BY 1, 2
 ORDER BY 1, 2

-- name: backlog
-- Backlog of each channel in :channels, zeros for one with no rows (the daily
-- metrics): pending depth and oldest age on outbox_message_pending_due_idx,
-- dead count on outbox_message_dead_idx.
SELECT c.channel,
       (SELECT count(*) FROM outbox_message
         WHERE status = 'pending' AND channel = c.channel)                       AS pending_depth,
       ({{oldest_pending_age_of}})                                               AS oldest_pending_age_seconds,
       (SELECT count(*) FROM outbox_message
         WHERE status = 'dead' AND channel = c.channel)                          AS dead_count
  FROM unnest(CAST(:channels AS text[])) AS c(channel)
 ORDER BY c.channel

-- name: list_dead
-- Dead letters, newest first, without payloads; every filter optional (NULL:
-- no bound). outbox_message_dead_idx.
SELECT seq, message_id, channel, destination, type, attempts,
       max_attempts, last_error_class, last_error, dead_at, created_at,
       EXTRACT(EPOCH FROM now() - dead_at)::float8 AS dead_for_seconds
  FROM outbox_message
 WHERE status = 'dead'
   AND (CAST(:channel AS text) IS NULL OR channel = CAST(:channel AS text))
   AND (CAST(:error_class AS text) IS NULL OR last_error_class = CAST(:error_class AS text))
   AND (CAST(:since_seconds AS float8) IS NULL
        OR dead_at >= now() - make_interval(secs => CAST(:since_seconds AS float8)))
   AND (CAST(:since AS timestamptz) IS NULL OR dead_at >= CAST(:since AS timestamptz))
 ORDER BY dead_at DESC, seq DESC
 LIMIT :limit

-- name: get_message
-- One message, every column (`outbox dead show`), by the body's message_id key.
SELECT o.seq, o.message_id, o.channel, o.destination, o.type, o.key, b.payload, b.headers, o.status,
       o.attempts, o.max_attempts, o.available_at, o.lease_owner, o.lease_expires_at,
       o.last_error, o.last_error_class, o.delivery_ref, o.created_at, o.delivered_at, o.dead_at
  FROM outbox_message_body b JOIN outbox_message o ON o.seq = b.seq AND o.day = b.day
 WHERE b.message_id = CAST(:message_id AS uuid)

-- name: history_of
-- One message's history (outbox_message_history), oldest first: its primary key.
SELECT at, event, attempt, error_class, error, ref, actor, next_at
  FROM outbox_message_history
 WHERE seq = :seq
 ORDER BY seq, id

-- name: db_now
-- The database's clock, read once when a redrive starts: what dies after it is
-- left for the next redrive, so one redrive always ends.
SELECT now()

-- name: seqs_of_message_ids
-- The rows of :message_ids (a uuid[]), through the body's message_id key, then by primary key.
seq = ANY(ARRAY(SELECT seq FROM outbox_message_body WHERE message_id = ANY(CAST(:message_ids AS uuid[]))))

-- name: redrive_preview
-- What a redrive with these filters would move, by channel and error class
-- (the filters of redrive_batch; NULL means any). outbox_message_dead_idx.
SELECT channel, last_error_class, count(*) AS n
  FROM outbox_message
 WHERE status = 'dead'
   AND (CAST(:channel AS text) IS NULL OR channel = CAST(:channel AS text))
   AND (CAST(:error_class AS text) IS NULL OR last_error_class = CAST(:error_class AS text))
   AND (CAST(:message_ids AS uuid[]) IS NULL OR {{seqs_of_message_ids}})
 GROUP BY channel, last_error_class
 ORDER BY channel, last_error_class

-- name: dead_among
-- Which of :message_ids are dead letters now (a redrive's dry run by ids).
SELECT message_id FROM outbox_message
 WHERE status = 'dead' AND {{seqs_of_message_ids}}

-- name: bring_back_held_keys
-- The later messages of the keys of `moved` (rows just taken out of dead) that
-- the claim moved ahead while the dead letter held their key (OUTBOX_ORDERING_ON_DEAD=block):
-- due now again. Never tried ones only, so no retry's backoff is cut short.
-- One range of outbox_message_key_active_idx per key.
UPDATE outbox_message o SET available_at = now()
 WHERE o.seq = ANY (ARRAY(
        SELECT k.seq
          FROM (SELECT channel, destination, key, min(seq) AS seq FROM moved
                 WHERE key IS NOT NULL GROUP BY channel, destination, key) r
         CROSS JOIN LATERAL (
               SELECT k.seq FROM outbox_message k
                WHERE k.channel = r.channel AND k.destination = r.destination AND k.key = r.key
                  AND k.seq > r.seq AND k.status IN ('pending', 'leased') AND k.status = 'pending'
                  AND k.attempts = 0 AND k.available_at > now()
                  AND k.available_at IS DISTINCT FROM k.scheduled_at) k))
   AND o.status = 'pending' AND o.available_at > now()

-- name: redrive_batch
-- Move one batch of dead letters (dead before :cutoff) back to pending, due now,
-- attempts 0; fenced on status = 'dead' where picked and where changed; SKIP LOCKED.
-- The last error is kept for `outbox dead show`; what their keys held back comes back;
-- each message's history gets a line.
-- outbox_message_dead_idx (by message id: the message_id key); keys: outbox_message_key_active_idx.
WITH picked AS (
    SELECT seq FROM outbox_message
     WHERE status = 'dead'
       AND (dead_at IS NULL OR dead_at <= CAST(:cutoff AS timestamptz))
       AND (CAST(:channel AS text) IS NULL OR channel = CAST(:channel AS text))
       AND (CAST(:error_class AS text) IS NULL OR last_error_class = CAST(:error_class AS text))
       AND (CAST(:message_ids AS uuid[]) IS NULL OR {{seqs_of_message_ids}})
     ORDER BY dead_at, seq
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE outbox_message o SET
        status           = 'pending',
        attempts         = 0,
        available_at     = now(),
        dead_at          = NULL,
        lease_owner      = NULL,
        lease_expires_at = NULL
     WHERE o.seq = ANY(ARRAY(SELECT seq FROM picked)) AND o.status = 'dead'
    RETURNING o.seq, o.day, o.message_id, o.channel, o.destination, o.key, o.last_error_class
), held AS (
    {{bring_back_held_keys}}
), history AS (
    INSERT INTO outbox_message_history (seq, day, event, actor, next_at)
    SELECT seq, day, 'redriven', 'operator', now() FROM moved
)
SELECT message_id, channel, last_error_class FROM moved

-- name: discard_dead
-- Give up the dead letters among :message_ids for good (status discarded, kept
-- until the dead retention purges them): they hold back no key any more, and
-- what their keys held back comes back. Fenced on status = 'dead'. By the
-- message_id key; the keys through outbox_message_key_active_idx.
WITH moved AS (
    UPDATE outbox_message o SET status = 'discarded'
     WHERE {{seqs_of_message_ids}} AND o.status = 'dead'
    RETURNING o.seq, o.day, o.message_id, o.channel, o.destination, o.key
), held AS (
    {{bring_back_held_keys}}
), history AS (
    INSERT INTO outbox_message_history (seq, day, event, actor)
    SELECT seq, day, 'discarded', 'operator' FROM moved
)
SELECT message_id FROM moved

-- name: count_delivered_older
-- How many delivered rows a purge would delete (dry run, progress total).
-- outbox_message_delivered_at_idx.
SELECT count(*) FROM outbox_message
 WHERE status = 'delivered' AND delivered_at < now() - make_interval(secs => :older_than_seconds)

-- name: count_dead_older
-- How many dead letters of :channel a purge would delete. outbox_message_dead_idx.
SELECT count(*) FROM outbox_message
 WHERE status = 'dead' AND channel = :channel
   AND dead_at < now() - make_interval(secs => :older_than_seconds)

-- name: purge_delivered_batch
-- Delete at most :limit delivered rows older than the window (outbox_message_delivered_at_idx,
-- SKIP LOCKED), bodies with them (trigger); the count per channel. :day_zero: only day 0's
-- (the maintenance run: the other days go whole, by drop_day).
WITH doomed AS (
    SELECT seq FROM outbox_message
     WHERE status = 'delivered' AND (NOT CAST(:day_zero AS boolean) OR day = 0)
       AND delivered_at < now() - make_interval(secs => :older_than_seconds)
     ORDER BY delivered_at
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM outbox_message o
     WHERE o.seq = ANY(ARRAY(SELECT seq FROM doomed)) AND o.status = 'delivered'
       AND (NOT CAST(:day_zero AS boolean) OR o.day = 0)
    RETURNING o.channel
)
SELECT channel, count(*) AS n FROM gone GROUP BY channel

-- name: count_discarded_older
-- How many discarded dead letters of :channel a purge would delete.
-- outbox_message_discarded_idx.
SELECT count(*) FROM outbox_message
 WHERE status = 'discarded' AND channel = :channel
   AND dead_at < now() - make_interval(secs => :older_than_seconds)

-- name: purge_discarded_batch
-- Delete at most :limit discarded dead letters of :channel older than the dead
-- retention (outbox_message_discarded_idx, SKIP LOCKED); the count per channel.
WITH doomed AS (
    SELECT seq FROM outbox_message
     WHERE status = 'discarded' AND channel = :channel
       AND dead_at < now() - make_interval(secs => :older_than_seconds)
     ORDER BY dead_at
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM outbox_message o
     WHERE o.seq = ANY(ARRAY(SELECT seq FROM doomed)) AND o.status = 'discarded'
    RETURNING o.channel
)
SELECT channel, count(*) AS n FROM gone GROUP BY channel

-- name: purge_dead_batch
-- The same for the dead letters of :channel (outbox_message_dead_idx).
WITH doomed AS (
    SELECT seq FROM outbox_message
     WHERE status = 'dead' AND channel = :channel
       AND dead_at < now() - make_interval(secs => :older_than_seconds)
     ORDER BY dead_at
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM outbox_message o
     WHERE o.seq = ANY(ARRAY(SELECT seq FROM doomed)) AND o.status = 'dead'
    RETURNING o.channel
)
SELECT channel, count(*) AS n FROM gone GROUP BY channel

-- name: pollers
-- Latency-mode pollers per channel (`outbox stats`): how many are live now, and
-- the newest registration that found a window without a poller before it
-- (outbox_poller_channel_started_idx; registrations are kept a week).
SELECT c.channel,
       (SELECT count(*) FROM outbox_poller p
         WHERE p.channel = c.channel AND p.started_at > now() - interval '15 minutes' AND {{poller_is_live}}) AS live,
       g.gap_seconds AS last_gap_seconds,
       EXTRACT(EPOCH FROM now() - g.started_at)::float8 AS last_gap_ended_seconds_ago
  FROM (SELECT DISTINCT channel FROM outbox_poller) c
  LEFT JOIN LATERAL (SELECT p.gap_seconds, p.started_at FROM outbox_poller p
                      WHERE p.channel = c.channel AND p.gap_seconds > 0
                      ORDER BY p.started_at DESC
                      LIMIT 1) g ON true
 ORDER BY c.channel

-- name: days_managed
-- Whether the day functions are here: not between an online prepare of 0016 and its swap.
SELECT to_regprocedure('outbox_open_day(integer)') IS NOT NULL

-- name: open_days
-- Open the days from the first not yet open through :margin_days ahead (outbox_open_day:
-- their three partitions). Only days beyond tomorrow's tomorrow: ids up to a day ahead are
-- accepted (outbox__insert_v1), and one accepted before its day opened went to day 0 for good.
SELECT count(*) FILTER (WHERE outbox_open_day(d))
  FROM generate_series(greatest(coalesce((SELECT max(day) FROM outbox_day), 0) + 1,
                                (current_date - DATE '1970-01-01') + 3),
                       (current_date - DATE '1970-01-01') + CAST(:margin_days AS int)) d

-- name: expired_days
-- Open days that ended before the delivered window began, oldest first.
SELECT day FROM outbox_day
 WHERE (day + 1) * 86400.0 <= EXTRACT(EPOCH FROM now() - make_interval(secs => :older_than_seconds))
 ORDER BY day

-- name: drop_day
-- Close day :day, move what must stay to day 0 (not delivered, or delivered within the
-- window), drop its three partitions (outbox_drop_day). Rows kept.
SELECT outbox_drop_day(CAST(:day AS int), now() - make_interval(secs => :older_than_seconds))

-- name: partitions
-- The open days and each table's size (`outbox stats`, the maintenance metrics): every
-- partition's, from the catalog.
SELECT (SELECT count(*) FROM outbox_day) AS days,
       (SELECT min(day) FROM outbox_day) AS oldest_day,
       (SELECT max(day) FROM outbox_day) AS newest_day,
       (SELECT max(day) FROM outbox_day) - (current_date - DATE '1970-01-01') AS margin_days,
       (SELECT coalesce(sum(pg_total_relation_size(r.relid)), 0) FROM pg_partition_tree('outbox_message') r)
           AS message_bytes,
       (SELECT coalesce(sum(pg_total_relation_size(r.relid)), 0) FROM pg_partition_tree('outbox_message_body') r)
           AS body_bytes,
       (SELECT coalesce(sum(pg_total_relation_size(r.relid)), 0) FROM pg_partition_tree('outbox_message_history') r)
           AS history_bytes
