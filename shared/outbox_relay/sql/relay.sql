-- The relay's statements: claim a batch under a lease, record its outcomes.
-- Why each is shaped as it is: docs/design.md, "The claim" and "Recording outcomes".

-- name: holds_back_its_key
-- Whether row `k` of a key holds back the later messages of that key: pending
-- or leased, unless it was never tried and waits for its deliver_at
-- (docs/design.md, "Per-key ordering"). Served by outbox_message_key_active_idx.
k.status IN ('pending', 'leased')
AND NOT (k.status = 'pending' AND k.attempts = 0 AND k.scheduled_at IS NOT NULL AND k.available_at = k.scheduled_at
         AND k.available_at > now())

-- name: key_head
-- The first row that holds back the key of row `m` ("holds_back_its_key"), and
-- under the block policy its first dead letter: the same for every row of a
-- key, so the due scan probes each key once (a Memoize on (destination, key))
-- however many of its rows it passes. Every probe of a key's rows (here and in
-- the claim) takes the key as a range ordered by (key, seq): only
-- outbox_message_key_active_idx / _key_dead_idx give that order, whatever the
-- statistics say (docs/design.md, "Per-key ordering").
SELECT h.seq, h.status, h.available_at, h.lease_owner = :owner AND h.lease_expires_at > now() AS ours,
       CASE WHEN CAST(:block_on_dead AS boolean) THEN (
            SELECT k.seq FROM outbox_message k
             WHERE k.channel = m.channel AND k.destination = m.destination AND k.key >= m.key AND k.key <= m.key
               AND k.status = 'dead'
             ORDER BY k.key, k.seq
             LIMIT 1) END AS dead_seq
  FROM (SELECT k.seq, k.status, k.available_at, k.lease_owner, k.lease_expires_at FROM outbox_message k
         WHERE k.channel = m.channel AND k.destination = m.destination AND k.key >= m.key AND k.key <= m.key
           AND {{holds_back_its_key}}
         ORDER BY k.key, k.seq
         LIMIT 1) h

-- name: turn_of
-- What the claim may do with due row `m` of a key, from its key's head `h`
-- ("key_head": the first row that holds the key back; `m` itself when it is its
-- key's first, as a due pending row holds its key): NULL claim it (`m` is its
-- key's first); '-infinity' claim it if every earlier row is claimed with it or
-- ours in flight (the head is pending and comes first in the due order, or is
-- ours); 'infinity' leave it (leased by another relay); a time: move it there
-- (the head is pending with a later available_at: waiting for a retry, or
-- released after `m` was due; or a dead letter before it holds the key under the
-- block policy), so that `m` is scanned after the head, never in a window without it.
CASE WHEN h.dead_seq < m.seq THEN now() + make_interval(secs => :dead_hold_seconds)
     WHEN h.seq IS NULL OR h.seq >= m.seq THEN NULL
     WHEN h.status = 'pending' AND h.available_at <= m.available_at THEN '-infinity'
     WHEN h.status = 'pending' THEN h.available_at
     WHEN h.ours THEN '-infinity'
     ELSE 'infinity' END

-- name: part_hash
-- Where row `m` falls among the parts: the first 32 bits of its key's md5 (of its
-- seq's without a key), so a key's rows share a part. The fourth column of
-- outbox_message_pending_due_idx, as written there: a claim of a part passes the
-- other parts' rows in the index, never reading them (decision 0074).
CAST(('x' || left(md5(coalesce(m.key, CAST(m.seq AS text))), 8)) AS bit(32))::bigint

-- name: in_part
-- Whether row `m` is in part :part of :parts: even ranges of "part_hash" (the
-- part is floor(hash * parts / 2^32); store.part_of computes the same).
{{part_hash}} >= (CAST(:part AS bigint) * 4294967296 + CAST(:parts AS bigint) - 1) / CAST(:parts AS bigint)
AND {{part_hash}} < ((CAST(:part AS bigint) + 1) * 4294967296 + CAST(:parts AS bigint) - 1) / CAST(:parts AS bigint)

-- name: claim
-- Claim up to :limit messages of :channel for :lease_seconds under :owner, at most
-- :max_bytes of payload, in one statement (docs/design.md, "The claim"):
-- 1. expired leases (outbox_message_lease_expiry_idx): those holding a delivery
--    reference (an SES event came while they were in flight) are delivered, the
--    send settled; of the rest, those with no attempts left
--    go to dead; those expired for the first time go back to pending (requeued,
--    marked lease_expired); of those that expired again, one, first of its key,
--    is re-claimed alone (a suspect: its holder died, maybe because of it) and
--    nothing else is claimed;
-- 2. else due pending rows oldest first (outbox_message_pending_due_idx), with
--    :parts, only those of part :part ("in_part"), a row
--    with a key only in its key's turn ("turn_of"): rows of a key whose first
--    message waits are moved out of the way, and of a key's rows only those
--    with every earlier one claimed with them or ours in flight are claimed.
-- Both branches FOR UPDATE SKIP LOCKED; what is locked and not claimed is
-- unlocked at the end. Rows behind a key's first message that another
-- transaction has held locked for long (the locked_heads given) are moved ahead ("held").
-- The last six columns: rows of the due scan claimed or moved, whether the
-- claim is a suspect, rows the due scan returned (those out of turn too: an
-- earlier row of their key locked by another transaction, or leased by another
-- relay), whether the byte budget left claimable rows behind, expired leases
-- requeued, and the first rows of keys found locked (comma-separated seq:xmax,
-- xmax being the locking transaction).
-- When nothing was claimed: one row, NULL but for those six.
WITH expired AS (
    SELECT seq, destination, key, attempts >= coalesce(max_attempts, :default_max_attempts) AS exhausted,
           last_error_class IS NOT DISTINCT FROM 'lease_expired' AS again, attempts, lease_owner, available_at,
           delivery_ref, day
      FROM outbox_message
     WHERE status = 'leased' AND channel = :channel AND lease_expires_at <= now()
     ORDER BY lease_expires_at, seq
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
), landed AS (
    -- An SES event proved the send while it was in flight (feedback.sql): nothing to
    -- resend, whatever became of its holder.
    UPDATE outbox_message o SET status = 'delivered', delivered_at = now(), lease_owner = NULL,
           lease_expires_at = NULL
     WHERE o.seq = ANY (ARRAY(SELECT seq FROM expired WHERE delivery_ref IS NOT NULL)) AND o.status = 'leased'
    RETURNING o.seq
), requeued AS (
    -- A first expiry is presumed innocent (its holder died of something else: a
    -- timeout, a deploy, an outage): back to pending where it was in the due
    -- order, its attempt spent, marked; the next claims take it with the rest.
    UPDATE outbox_message o SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL,
           last_error_class = 'lease_expired',
           last_error = 'lease expired: its holder died or overran its lease; back in the queue'
     WHERE o.seq = ANY (ARRAY(SELECT seq FROM expired WHERE NOT exhausted AND NOT again AND delivery_ref IS NULL))
       AND o.status = 'leased'
    RETURNING o.seq
), suspect AS (
    -- A lease that expired again since (its holder died once more, maybe because
    -- of it) is re-claimed alone.
    SELECT e.seq FROM expired e
     WHERE NOT e.exhausted AND e.again AND e.delivery_ref IS NULL
       AND (e.key IS NULL OR (
            (SELECT k.seq FROM outbox_message k
              WHERE k.channel = :channel AND k.destination = e.destination AND k.key >= e.key AND k.key <= e.key
                AND k.seq < e.seq AND {{holds_back_its_key}}
              ORDER BY k.key, k.seq
              LIMIT 1) IS NULL
            AND NOT (CAST(:block_on_dead AS boolean) AND (
                SELECT k.seq FROM outbox_message k
                 WHERE k.channel = :channel AND k.destination = e.destination AND k.key >= e.key AND k.key <= e.key
                   AND k.status = 'dead' AND k.seq < e.seq
                 ORDER BY k.key, k.seq
                 LIMIT 1) IS NOT NULL)))
     LIMIT 1
), due AS (
    SELECT m.seq, m.destination, m.key, m.payload_bytes AS size, t.turn,
           greatest(m.created_at, m.scheduled_at) AS due_since
      FROM outbox_message m
      LEFT JOIN LATERAL ({{key_head}}) h ON m.key IS NOT NULL
      CROSS JOIN LATERAL (SELECT {{turn_of}} AS turn) t
     WHERE m.status = 'pending' AND m.channel = :channel AND m.available_at <= now()
       AND (CAST(:parts AS int) IS NULL OR ({{in_part}}))
       AND (t.turn IS NULL OR t.turn < 'infinity')
       AND NOT EXISTS (SELECT 1 FROM suspect)
     ORDER BY m.available_at, m.seq
     -- A subquery's limit, costed as a tenth of the rows expected, keeps the walk of the due index:
     -- bound, a claim expecting few rows was planned as a scan of the whole partition and a sort
     -- once the index had grown with dead entries (decision 0074).
     LIMIT (SELECT CAST(:limit AS int))
       FOR UPDATE OF m SKIP LOCKED
), candidates AS (
    SELECT seq, destination, key, size, turn FROM due WHERE turn IS NULL OR turn = '-infinity'
), keyed AS (
    -- The candidates of keys with one that is not its key's first row; a key
    -- whose only candidate is its first row needs no check.
    SELECT seq, destination, key, row_number() OVER (PARTITION BY destination, key ORDER BY seq) AS r
      FROM candidates
     WHERE key IS NOT NULL
       AND (destination, key) IN (SELECT destination, key FROM candidates WHERE turn = '-infinity')
), firsts AS MATERIALIZED (
    -- Per key, as many of its first rows holding it back as it has candidates,
    -- ours in flight left out: the r-th candidate is claimed only if it is the
    -- r-th of these, so that every earlier row of its key is claimed with it.
    -- MATERIALIZED: once per key, not once per candidate.
    SELECT f.destination, f.key, ARRAY(
               SELECT k.seq FROM outbox_message k
                WHERE k.channel = :channel AND k.destination = f.destination AND k.key >= f.key AND k.key <= f.key
                  AND {{holds_back_its_key}}
                  AND NOT (k.status = 'leased' AND k.lease_owner = :owner AND k.lease_expires_at > now())
                ORDER BY k.key, k.seq
                LIMIT f.n) AS seqs
      FROM (SELECT destination, key, count(*) AS n FROM keyed GROUP BY destination, key) f
), out_of_turn AS (
    SELECT c.seq FROM keyed c JOIN firsts f ON f.destination = c.destination AND f.key = c.key
     WHERE f.seqs[c.r] IS DISTINCT FROM c.seq
), locked AS (
    -- Keys whose first message is pending and due but not in the scan: another
    -- transaction holds it locked (SKIP LOCKED passed it). A concurrent claim
    -- does so for milliseconds; an operator's or the application's session, for long.
    SELECT h.destination, h.key, h.seq || ':' || h.xmax AS head
      FROM outbox_message h
     WHERE h.seq = ANY (ARRAY(SELECT seqs[1] FROM firsts WHERE seqs[1] NOT IN (SELECT seq FROM due)))
       AND h.status = 'pending' AND h.available_at <= now()
), held AS (
    -- Rows out of turn behind a head that the relay has seen locked by the same
    -- transaction (xmax) for longer than any claim holds a row
    -- (locked_heads, as seq:xmax): moved ahead by as long as they
    -- have waited, within bounds, so that claims stop scanning them and the
    -- other keys flow; the hold grows while the lock lasts.
    SELECT d.seq, now() + make_interval(secs => least(:locked_hold_max_seconds, greatest(
               :locked_hold_min_seconds, extract(epoch FROM now() - d.due_since)))) AS until
      FROM out_of_turn c JOIN due d ON d.seq = c.seq
      JOIN locked l ON l.destination = d.destination AND l.key = d.key
     WHERE l.head = ANY (CAST(:locked_heads AS text[]))
), moves AS (
    SELECT seq, turn AS until FROM due WHERE turn > '-infinity'
    UNION ALL
    SELECT seq, until FROM held
), moved AS (
    UPDATE outbox_message o SET available_at = v.until
      FROM moves v
     WHERE o.seq = ANY (ARRAY(SELECT seq FROM moves)) AND o.seq = v.seq AND o.status = 'pending'
    RETURNING o.seq
), budget AS (
    SELECT seq, size, sum(size) OVER (ORDER BY seq) AS running FROM candidates
     WHERE seq NOT IN (SELECT seq FROM out_of_turn)
), picked AS (
    -- Candidates by seq while the bytes before them stay under the budget (the
    -- first always fits; by seq, so a key's rows are cut after, never before, its others).
    SELECT seq FROM budget WHERE running - size < :max_bytes
    UNION ALL
    SELECT seq FROM suspect
    UNION ALL
    SELECT seq FROM expired WHERE exhausted AND delivery_ref IS NULL
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
 WHERE o.seq = ANY (ARRAY(SELECT seq FROM picked)) AND o.status IN ('pending', 'leased')
RETURNING o.seq, o.day, o.message_id, o.status, o.destination, o.type, o.key, o.attempts,
          coalesce(o.max_attempts, :default_max_attempts) AS max_attempts,
          to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at
), expiry_history AS (
    -- The expired attempts this claim dealt with, as lines of their messages' history
    -- (outbox_message_history), the texts as the rows record them; an expired lease
    -- left for a later claim is written then. A requeued row keeps its place: its due time.
    INSERT INTO outbox_message_history (seq, day, event, attempt, error_class, error, ref, actor, next_at)
    SELECT e.seq, e.day, CASE WHEN e.delivery_ref IS NOT NULL THEN 'settled' WHEN e.exhausted THEN 'dead'
                       ELSE 'lease_expired' END,
           e.attempts, 'lease_expired',
           CASE WHEN e.delivery_ref IS NOT NULL
                THEN 'lease expired: its holder died or overran its lease; an SES event had proved the send'
                WHEN e.exhausted THEN 'lease expired with no attempts left (' || e.attempts || ' made); '
                                      || 'the holder died or overran its lease'
                WHEN e.again THEN 'lease expired again: its holder died or overran its lease; re-claimed alone'
                ELSE 'lease expired: its holder died or overran its lease; back in the queue' END,
           e.delivery_ref, e.lease_owner,
           CASE WHEN NOT e.exhausted AND NOT e.again AND e.delivery_ref IS NULL THEN e.available_at END
      FROM expired e
     WHERE e.seq = ANY (ARRAY(SELECT seq FROM requeued UNION ALL SELECT seq FROM suspect
                              UNION ALL SELECT seq FROM claimed WHERE status = 'dead'
                              UNION ALL SELECT seq FROM landed))
)
-- First column: the generated values joined by spaces (none can hold one),
-- split by store._message; the body by primary key.
SELECT concat_ws(' ', c.seq, c.status, c.attempts, c.max_attempts, c.message_id, c.created_at),
       c.destination, c.type, c.key, b.payload::text, b.headers::text,
       s.scanned, s.suspect, s.due, s.cut, s.requeued, s.locked
  FROM (SELECT (SELECT count(*) FROM due) - (SELECT count(*) FROM out_of_turn) + (SELECT count(*) FROM held)
                   AS scanned,
               (SELECT string_agg(head::text, ',') FROM locked) AS locked,
               (SELECT count(*) FROM requeued) AS requeued,
               EXISTS (SELECT 1 FROM suspect) AS suspect, (SELECT count(*) FROM due) AS due,
               EXISTS (SELECT 1 FROM budget WHERE running - size >= :max_bytes) AS cut) s
  LEFT JOIN claimed c ON true
  LEFT JOIN LATERAL (SELECT payload, headers FROM outbox_message_body WHERE seq = c.seq AND day = c.day) b ON true

-- name: oldest_pending_age_of
-- Age in seconds of the oldest due pending message of channel `c.channel` (0 when
-- none), by the database clock: the front of outbox_message_pending_due_idx.
SELECT coalesce(EXTRACT(EPOCH FROM now() - min(available_at)), 0)::float8
  FROM outbox_message
 WHERE status = 'pending' AND channel = c.channel AND available_at <= now()

-- name: oldest_pending_age
-- The OldestPendingAge metric of :channel, when no outcome write read it.
SELECT ({{oldest_pending_age_of}}) FROM (SELECT CAST(:channel AS text) AS channel) c

-- name: record_outcomes
-- Record one group of outcomes in one statement, fenced on the lease: parallel
-- arrays (one element per message) joined to their rows by primary key; rows
-- no longer ours are reported as lost. A row that already holds a delivery
-- reference took it from an SES event while in flight (feedback.sql,
-- record_email_event): it is delivered whatever this attempt's outcome, and its
-- history says it was settled. Also reads :channel's oldest pending age,
-- and returns each delivered message's delivery lag in milliseconds (from
-- created_at, or the later scheduled_at) as one comma-separated text. Each
-- outcome but a delivery is also a line of its message's history.
WITH v AS MATERIALIZED (
    -- The fence rides with each outcome as a join condition, so the rows to write are
    -- estimated from the seqs alone: on the rows, a new token was estimated at one row,
    -- and the nested loop chosen for it read every value for every row.
    SELECT v.*, CAST('leased' AS text) AS status, CAST(:owner AS text) AS owner FROM unnest(
        CAST(:seqs AS bigint[]), CAST(:kinds AS text[]), CAST(:error_classes AS text[]),
        CAST(:errors AS text[]), CAST(:refs AS text[]), CAST(:delays AS float8[])
    ) AS v(seq, kind, error_class, error, ref, delay)
), done AS (
    -- No event is missed: a row an event is writing is waited for and read again,
    -- and an event written after this finds the row no longer leased and settles it.
    UPDATE outbox_message o SET
        status           = CASE WHEN v.kind = 'delivered' OR o.delivery_ref IS NOT NULL THEN 'delivered'
                                WHEN v.kind = 'dead' THEN 'dead'
                                WHEN v.kind = 'retry'
                                     AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts) THEN 'dead'
                                ELSE 'pending' END,
        attempts         = CASE WHEN v.kind = 'release' AND o.delivery_ref IS NULL THEN greatest(o.attempts - 1, 0)
                                ELSE o.attempts END,
        available_at     = CASE WHEN o.delivery_ref IS NOT NULL THEN o.available_at
                                WHEN v.kind IN ('release', 'settle')
                                  OR (v.kind = 'retry'
                                      AND o.attempts < coalesce(o.max_attempts, :default_max_attempts))
                                THEN now() + make_interval(secs => coalesce(v.delay, 0))
                                ELSE o.available_at END,
        lease_owner      = NULL,
        lease_expires_at = NULL,
        delivered_at     = CASE WHEN v.kind = 'delivered' OR o.delivery_ref IS NOT NULL THEN now()
                                ELSE o.delivered_at END,
        delivery_ref     = coalesce(v.ref, o.delivery_ref),
        dead_at          = CASE WHEN o.delivery_ref IS NOT NULL THEN o.dead_at
                                WHEN v.kind = 'dead'
                                  OR (v.kind = 'retry'
                                      AND o.attempts >= coalesce(o.max_attempts, :default_max_attempts))
                                THEN now() ELSE o.dead_at END,
        last_error       = coalesce(v.error, o.last_error),
        last_error_class = coalesce(v.error_class, o.last_error_class)
      FROM v
     WHERE o.seq = ANY (CAST(:seqs AS bigint[])) AND o.seq = v.seq
       AND o.status = v.status AND o.lease_owner = v.owner
       -- The live partition only, planned by the seqs: `= 'leased'` would offer the lease
       -- index, estimated near-empty, and a nested loop over every outcome for every row.
       AND o.status IN ('pending', 'leased')
    RETURNING o.seq, o.day, o.status, v.kind, o.attempts, o.available_at, v.error_class, v.error, o.delivery_ref,
              CASE WHEN o.status = 'delivered'
                   THEN EXTRACT(EPOCH FROM now() - greatest(o.created_at, o.scheduled_at)) END AS lag
), history AS (
    -- Each attempt that did not deliver, as a line of its message's history
    -- (outbox_message_history), in the same statement; a delivery is the row itself
    -- (delivered_at, delivery_ref), so the common case writes nothing more. A released
    -- attempt was refunded just now: its number is one more. An attempt an SES event
    -- settled is a `settled` line with the event's SES id and this attempt's error.
    INSERT INTO outbox_message_history (seq, day, event, attempt, error_class, error, ref, actor, next_at)
    SELECT d.seq, d.day,
           CASE WHEN d.status = 'delivered' THEN 'settled'
                ELSE CASE d.kind WHEN 'release' THEN 'released' WHEN 'settle' THEN 'ambiguous'
                                 WHEN 'retry' THEN CASE WHEN d.status = 'dead' THEN 'dead' ELSE 'retry' END
                                 ELSE d.kind END END,
           CASE WHEN d.kind = 'release' AND d.status = 'pending' THEN d.attempts + 1 ELSE d.attempts END,
           d.error_class, d.error, CASE WHEN d.status = 'delivered' THEN d.delivery_ref END, :owner,
           CASE WHEN d.status = 'pending' THEN d.available_at END
      FROM done d
     WHERE d.kind <> 'delivered'
)
SELECT count(*) FILTER (WHERE status = 'delivered'),
       count(*) FILTER (WHERE status = 'pending' AND kind <> 'release'),
       count(*) FILTER (WHERE status = 'dead'),
       count(*) FILTER (WHERE status = 'pending' AND kind = 'release'),
       (SELECT array_agg(v.seq ORDER BY v.seq) FROM v WHERE v.seq NOT IN (SELECT seq FROM done)),
       (SELECT ({{oldest_pending_age_of}}) FROM (SELECT CAST(:channel AS text) AS channel) c),
       string_agg(round(lag * 1000)::bigint::text, ',') FILTER (WHERE lag IS NOT NULL)
  FROM done

-- name: poller_is_live
-- Whether registration `p` is running: it has not left and renewed itself in time.
p.left_at IS NULL AND p.expires_at > now()

-- name: recent_pollers
-- The registrations of :channel that may still be running (a Lambda invocation
-- lasts at most 15 minutes), and the newest older one (what covered the channel
-- last when none is): outbox_poller_channel_started_idx.
SELECT p.* FROM outbox_poller p
 WHERE p.channel = :channel AND p.started_at > now() - interval '15 minutes'
UNION ALL
(SELECT p.* FROM outbox_poller p
  WHERE p.channel = :channel AND p.started_at <= now() - interval '15 minutes'
  ORDER BY p.started_at DESC
  LIMIT 1)

-- name: register_poller
-- Register latency-mode poller :owner of :channel until :ttl_seconds from now
-- (renewed by renew_poller) with its deadline :deadline_seconds away; purge the
-- channel's registrations older than a week. Returns the seconds no poller was
-- running before it (NULL for the channel's first: nothing to measure from; a
-- dead one covered until it last renewed), how many others are live, and its
-- slot: :slot when it was started for one (a successor takes its predecessor's,
-- an added poller the one asked for), else the first of the :slots kept that no
-- live poller holds, else the oldest live poller's (which leaves for it).
WITH recent AS (
    {{recent_pollers}}
), prior AS (
    SELECT max(CASE WHEN {{poller_is_live}} THEN now() ELSE coalesce(p.left_at, p.seen_at) END) AS covered,
           count(*) FILTER (WHERE {{poller_is_live}}) AS live
      FROM recent p
     WHERE p.owner <> :owner
), place AS (
    SELECT coalesce(CAST(:slot AS int),
                    (SELECT s FROM generate_series(0, :slots - 1) s
                      WHERE NOT EXISTS (SELECT 1 FROM recent p
                                         WHERE p.slot = s AND p.owner <> :owner AND {{poller_is_live}})
                      ORDER BY s LIMIT 1),
                    (SELECT p.slot FROM recent p WHERE p.slot < :slots AND p.owner <> :owner AND {{poller_is_live}}
                      ORDER BY p.started_at, p.owner LIMIT 1),
                    0) AS slot
), purge AS (
    DELETE FROM outbox_poller WHERE channel = :channel AND started_at < now() - interval '7 days'
), me AS (
    -- Run again after a lost reply, it keeps the registration it made.
    INSERT INTO outbox_poller (owner, channel, started_at, seen_at, expires_at, deadline_at, gap_seconds, slot,
                               parts_by_range)
    SELECT :owner, :channel, now(), now(), now() + make_interval(secs => :ttl_seconds),
           now() + make_interval(secs => :deadline_seconds),
           CASE WHEN prior.covered IS NOT NULL THEN greatest(EXTRACT(EPOCH FROM now() - prior.covered), 0)::float8 END,
           place.slot, true
      FROM prior, place
    ON CONFLICT (owner) DO UPDATE SET seen_at = now(), expires_at = now() + make_interval(secs => :ttl_seconds)
    RETURNING gap_seconds, slot
)
SELECT me.gap_seconds, prior.live, me.slot FROM me, prior

-- name: renew_poller
-- Renew :owner's registration for :ttl_seconds and read the channel's other
-- registrations: live ones of its slot newer than it (it should leave), live ones in all,
-- older live ones that have not renewed since :aware_after (they may not have
-- seen it yet), expired ones whose leases nobody took over, and the channel's
-- oldest pending age (what adds a poller, and lets an added one go), and its
-- slot's place among the live slots and their count (its part of the messages; one
-- part while a live poller does not take parts as ranges of part_hash, as none did
-- before migration 0018: its parts and ours would leave keys in no one's). One round trip
-- a heartbeat; `registered` is false when the row is gone or was taken over
-- (another poller found it expired and took its leases: it must stop).
WITH me AS (
    UPDATE outbox_poller SET seen_at = now(), expires_at = now() + make_interval(secs => :ttl_seconds)
     WHERE owner = :owner
    RETURNING owner, channel, started_at, taken_over_at, slot
), recent AS (
    {{recent_pollers}}
)
SELECT now()::text,
       EXISTS (SELECT 1 FROM me WHERE me.taken_over_at IS NULL),
       count(*) FILTER (WHERE {{poller_is_live}} AND p.slot = me.slot AND (p.started_at, p.owner) > (me.started_at, me.owner)),
       count(*) FILTER (WHERE {{poller_is_live}} AND p.owner <> me.owner),
       count(*) FILTER (WHERE {{poller_is_live}} AND (p.started_at, p.owner) < (me.started_at, me.owner)
                          AND p.seen_at <= CAST(:aware_after AS timestamptz)),
       count(*) FILTER (WHERE p.left_at IS NULL AND p.taken_over_at IS NULL AND p.expires_at <= now()
                          AND p.owner <> me.owner),
       (SELECT ({{oldest_pending_age_of}}) FROM (SELECT CAST(:channel AS text) AS channel) c),
       CASE WHEN bool_and(p.parts_by_range) FILTER (WHERE {{poller_is_live}}) IS NOT FALSE
            THEN count(DISTINCT p.slot) FILTER (WHERE {{poller_is_live}} AND p.slot < me.slot) ELSE 0 END,
       CASE WHEN bool_and(p.parts_by_range) FILTER (WHERE {{poller_is_live}}) IS NOT FALSE
            THEN count(DISTINCT p.slot) FILTER (WHERE {{poller_is_live}} AND p.slot <> me.slot) + 1 ELSE 1 END
  FROM me LEFT JOIN recent p ON true

-- name: take_over_pollers
-- Take over the leases of :channel's pollers whose registration expired (dead:
-- killed, out of memory, timed out), under its token or a token it derived from
-- it ("<token>/<n>"): they expire now, so the next claim requeues them (a first
-- expiry), fenced as any expired lease. Each dead registration is taken over
-- once. Leased rows through outbox_message_lease_expiry_idx.
WITH dead AS (
    UPDATE outbox_poller p SET taken_over_at = now()
     WHERE p.channel = :channel AND p.started_at > now() - interval '15 minutes'
       AND p.left_at IS NULL AND p.taken_over_at IS NULL AND p.expires_at <= now()
    RETURNING p.owner
), freed AS (
    UPDATE outbox_message o SET lease_expires_at = now()
     WHERE o.status = 'leased' AND o.channel = :channel AND o.lease_expires_at > now()
       AND (o.lease_owner IN (SELECT owner FROM dead)
            OR split_part(o.lease_owner, '/', 1) IN (SELECT owner FROM dead))
    RETURNING o.seq
)
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM freed)

-- name: request_successor
-- Note that :owner starts its successor (once: the poller asks once; run again
-- after a lost reply it answers the same), and only while no newer poller of its
-- slot is live (that one is the successor already) and no other live poller of
-- its slot started one within :lead_seconds that has not registered yet (it is
-- on its way: a cold start longer than the lead would otherwise chain them).
UPDATE outbox_poller me SET successor_requested_at = coalesce(me.successor_requested_at, now())
 WHERE me.owner = :owner
   AND NOT EXISTS (SELECT 1 FROM outbox_poller p
                    WHERE p.channel = me.channel AND p.started_at >= me.started_at AND p.owner <> me.owner
                      AND p.slot = me.slot AND (p.started_at, p.owner) > (me.started_at, me.owner)
                      AND {{poller_is_live}})
   AND NOT EXISTS (SELECT 1 FROM outbox_poller p
                    WHERE p.channel = me.channel AND p.owner <> me.owner AND p.slot = me.slot AND {{poller_is_live}}
                      AND p.started_at > now() - interval '15 minutes'
                      AND p.successor_requested_at > now() - make_interval(secs => :lead_seconds)
                      AND NOT EXISTS (SELECT 1 FROM outbox_poller n
                                       WHERE n.channel = p.channel AND n.slot = p.slot
                                         AND n.started_at > p.successor_requested_at))
RETURNING me.owner

-- name: add_poller
-- Note that :owner asks for a poller to be added to its channel (its backlog is
-- old), in the first of :max_slots slots that no live poller holds. Refused (no
-- row) when every slot is held, or another add of the channel was asked for
-- within :cooldown_seconds, or within :lead_seconds with no poller registered
-- since (on its way): one add at a time, however many pollers see the backlog.
WITH recent AS (
    {{recent_pollers}}
), free AS (
    SELECT s FROM generate_series(0, :max_slots - 1) s
     WHERE NOT EXISTS (SELECT 1 FROM recent p WHERE p.slot = s AND {{poller_is_live}})
     ORDER BY s LIMIT 1
)
UPDATE outbox_poller me SET add_requested_at = now()
  FROM free
 WHERE me.owner = :owner AND me.left_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM recent p
                    WHERE p.add_requested_at > now() - make_interval(secs => :cooldown_seconds)
                       OR (p.add_requested_at > now() - make_interval(secs => :lead_seconds)
                           AND NOT EXISTS (SELECT 1 FROM recent n WHERE n.started_at > p.add_requested_at)))
RETURNING free.s

-- name: leave_poller
-- :owner stops polling: its registration no longer counts as live.
UPDATE outbox_poller SET left_at = now(), seen_at = now() WHERE owner = :owner AND left_at IS NULL
