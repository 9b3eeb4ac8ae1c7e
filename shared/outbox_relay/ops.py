"""Operating the outbox: statistics, dead-letter inspection, redrive, retention
purge and backlog figures. The `outbox` command line and the maintenance
function both call these; nothing here prints, reads the environment or
builds an engine.

Rules (DESIGN.md):
- database clock only: every age, window and cutoff is computed with `now()`
  in SQL; durations travel as seconds, never as Python timestamps;
- long work runs in bounded batches, each one statement in its own short
  transaction (`engine.begin()` per batch), so no lock is held for long and
  a relay claiming at the same time waits for no one;
- redrive is fenced on `status = 'dead'` in the statement that moves rows:
  a message that is pending, leased or delivered is never touched.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, TypeVar

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from .models import Channel, MessageRow

T = TypeVar("T")

#: Rows a purge deletes per statement (one short transaction each).
PURGE_BATCH = 5000
#: Rows a redrive moves per statement (one short transaction each).
REDRIVE_BATCH = 1000
#: Longest error text `outbox dead list` prints per row (human output).
LIST_ERROR_CHARS = 80

# --------------------------------------------------------------------------
# Named SQL of the operations side (the relay's own statements are in sql.py).
# --------------------------------------------------------------------------

STATS = text(
    """
    SELECT channel,
           count(*) FILTER (WHERE status = 'pending')                              AS pending,
           count(*) FILTER (WHERE status = 'pending' AND available_at <= now())    AS due_now,
           count(*) FILTER (WHERE status = 'leased')                               AS leased,
           count(*) FILTER (WHERE status = 'leased' AND lease_expires_at <= now()) AS expired_leases,
           count(*) FILTER (WHERE status = 'delivered')                            AS delivered,
           count(*) FILTER (WHERE status = 'dead')                                 AS dead,
           count(*) FILTER (WHERE status = 'dead' AND dead_at > now() - interval '1 hour') AS dead_last_hour,
           count(*) FILTER (WHERE status = 'dead' AND dead_at > now() - interval '1 day')  AS dead_last_day,
           coalesce(EXTRACT(EPOCH FROM now() - min(available_at)
                    FILTER (WHERE status = 'pending' AND available_at <= now())), 0)::float8
                                                                                    AS oldest_pending_age_seconds
      FROM outbox_message
     GROUP BY channel
     ORDER BY channel
    """
)

# Backlog per channel, one row per requested channel even when it has no rows
# (zeros keep the dashboard and the backlog alarm fed while the relay is idle).
# Each figure is a scan of its own partial index:
#   pending_depth, oldest_pending_age_seconds: outbox_message_pending_due_idx;
#   dead_count: outbox_message_dead_idx.
# oldest_pending_age_seconds is the relay's OldestPendingAge: the age of the
# oldest pending message that is due (available_at <= now()), 0 when none.
BACKLOG = text(
    """
    SELECT c.channel,
           (SELECT count(*) FROM outbox_message
             WHERE status = 'pending' AND channel = c.channel)                       AS pending_depth,
           (SELECT coalesce(EXTRACT(EPOCH FROM now() - min(available_at)), 0)::float8
              FROM outbox_message
             WHERE status = 'pending' AND channel = c.channel AND available_at <= now())
                                                                                     AS oldest_pending_age_seconds,
           (SELECT count(*) FROM outbox_message
             WHERE status = 'dead' AND channel = c.channel)                          AS dead_count
      FROM unnest(CAST(:channels AS text[])) AS c(channel)
     ORDER BY c.channel
    """
)

# Dead letters, newest first, without payloads (they may be large and personal).
# `since_seconds` (a window ending now) and `since` (a timestamptz) are both
# optional; NULL means no bound. Served by outbox_message_dead_idx.
LIST_DEAD = text(
    """
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
    """
)

# One message, every column (`outbox dead show`).
GET_MESSAGE = text(
    """
    SELECT o.seq, o.message_id, o.channel, o.destination, o.type, o.key, b.payload, b.headers, o.status,
           o.attempts, o.max_attempts, o.available_at, o.lease_owner, o.lease_expires_at,
           o.last_error, o.last_error_class, o.delivery_ref, o.created_at, o.delivered_at, o.dead_at
      FROM outbox_message_body b JOIN outbox_message o ON o.seq = b.seq
     WHERE b.message_id = CAST(:message_id AS uuid)
    """
)

# The database's clock, read once at the start of a redrive: rows that die after
# it (a redriven message failing again) are left for the next redrive, so one
# redrive always ends.
DB_NOW = text("SELECT now()")

# The rows of the messages :message_ids (a uuid[]), found through the body's
# unique index on message_id, then by primary key (migration 0003 moved the
# message id's unique key to outbox_message_body).
_SEQS_OF_MESSAGE_IDS = ("seq = ANY(ARRAY(SELECT seq FROM outbox_message_body "
                        "WHERE message_id = ANY(CAST(:message_ids AS uuid[]))))")

# What a redrive with these filters would move, by channel and error class.
# The filters are those of REDRIVE_BATCH; `message_ids` NULL means any.
REDRIVE_PREVIEW = text(
    f"""
    SELECT channel, last_error_class, count(*) AS n
      FROM outbox_message
     WHERE status = 'dead'
       AND (CAST(:channel AS text) IS NULL OR channel = CAST(:channel AS text))
       AND (CAST(:error_class AS text) IS NULL OR last_error_class = CAST(:error_class AS text))
       AND (CAST(:message_ids AS uuid[]) IS NULL OR {_SEQS_OF_MESSAGE_IDS})
     GROUP BY channel, last_error_class
     ORDER BY channel, last_error_class
    """
)

# Which of the given message ids are dead letters now (dry run of a redrive by ids).
DEAD_AMONG = text(
    f"""
    SELECT message_id FROM outbox_message
     WHERE status = 'dead' AND {_SEQS_OF_MESSAGE_IDS}
    """
)

# Move one batch of dead letters back to pending, due now, attempts reset to 0.
# The fence is `status = 'dead'`, checked where the rows are picked and again
# on the row the UPDATE changes: a message that is pending, leased (being
# relayed) or delivered is never touched, and the claim only takes pending and
# leased rows, so a redriven message and a relay cannot both hold it.
# SKIP LOCKED: two redrives at once move disjoint rows, and neither waits.
# `seq = ANY(ARRAY(…))`: primary-key lookups, never a scan of the table (see PURGE_DELIVERED_BATCH).
# last_error and last_error_class are kept (the history an operator reads with
# `outbox dead show`; the next failure overwrites them); dead_at is cleared.
REDRIVE_BATCH_SQL = text(
    f"""
    WITH picked AS (
        SELECT seq FROM outbox_message
         WHERE status = 'dead'
           AND (dead_at IS NULL OR dead_at <= CAST(:cutoff AS timestamptz))
           AND (CAST(:channel AS text) IS NULL OR channel = CAST(:channel AS text))
           AND (CAST(:error_class AS text) IS NULL OR last_error_class = CAST(:error_class AS text))
           AND (CAST(:message_ids AS uuid[]) IS NULL OR {_SEQS_OF_MESSAGE_IDS})
         ORDER BY dead_at, seq
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
    )
    UPDATE outbox_message o SET
        status           = 'pending',
        attempts         = 0,
        available_at     = now(),
        dead_at          = NULL,
        lease_owner      = NULL,
        lease_expires_at = NULL
     WHERE o.seq = ANY(ARRAY(SELECT seq FROM picked)) AND o.status = 'dead'
    RETURNING o.message_id, o.channel, o.last_error_class
    """
)

# How many delivered rows a purge would delete (progress bar total, dry run).
COUNT_DELIVERED_OLDER = text(
    """
    SELECT count(*) FROM outbox_message
     WHERE status = 'delivered' AND delivered_at < now() - make_interval(secs => :older_than_seconds)
    """
)

COUNT_DEAD_OLDER = text(
    """
    SELECT count(*) FROM outbox_message
     WHERE status = 'dead' AND channel = :channel
       AND dead_at < now() - make_interval(secs => :older_than_seconds)
    """
)

# Delete one batch of delivered rows older than the window: a range scan of
# outbox_message_delivered_at_idx, at most :limit rows, locked with SKIP LOCKED
# (never waits), in one statement and so one short transaction; their bodies
# go with them (trigger of migration 0003). Returns the deleted count per channel.
# `seq = ANY(ARRAY(SELECT …))` makes the DELETE a primary-key lookup of the
# picked rows; a join (`USING doomed`) lets the planner hash-join against a
# sequential scan of the whole table on every batch.
PURGE_DELIVERED_BATCH = text(
    """
    WITH doomed AS (
        SELECT seq FROM outbox_message
         WHERE status = 'delivered'
           AND delivered_at < now() - make_interval(secs => :older_than_seconds)
         ORDER BY delivered_at
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM outbox_message o
         WHERE o.seq = ANY(ARRAY(SELECT seq FROM doomed)) AND o.status = 'delivered'
        RETURNING o.channel
    )
    SELECT channel, count(*) AS n FROM gone GROUP BY channel
    """
)

# The same for dead letters of one channel (outbox_message_dead_idx leads with channel).
PURGE_DEAD_BATCH = text(
    """
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
    """
)


# --------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------

_UNIT_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_FRIENDLY = re.compile(r"(\d+(?:\.\d+)?)([wdhms])", re.IGNORECASE)
_TIMEDELTA = TypeAdapter(timedelta)


def parse_duration(value: str) -> float:
    """Parse a duration and return it in seconds (float, > 0).

    Accepted forms:
    - friendly: a number and a unit, repeatable: ``7d``, ``12h``, ``30m``,
      ``90s``, ``2w``, ``1h30m`` or ``1h 30m`` (w weeks, d days, h hours, m minutes, s seconds);
    - plain seconds: ``3600``;
    - ISO 8601 durations as pydantic parses them: ``P7D``, ``PT12H``, ``P1DT6H``.

    Raises `ValueError` saying which forms are accepted.
    """
    raw = re.sub(r"\s+", "", value)
    seconds: float | None = None
    if re.fullmatch(r"(?:\d+(?:\.\d+)?[wdhms])+", raw, re.IGNORECASE):
        seconds = sum(float(n) * _UNIT_SECONDS[u.lower()] for n, u in _FRIENDLY.findall(raw))
    elif re.fullmatch(r"\d+(?:\.\d+)?", raw):
        seconds = float(raw)
    elif raw[:1] in ("P", "p"):
        try:
            seconds = _TIMEDELTA.validate_python(raw.upper()).total_seconds()
        except ValidationError:
            seconds = None
    if seconds is None:
        raise ValueError(f"{value!r} is not a duration; use e.g. 7d, 12h, 30m, 90s, 1h30m, "
                         "plain seconds, or ISO 8601 (P7D, PT12H)")
    if seconds <= 0:
        raise ValueError(f"{value!r}: a duration must be longer than zero")
    return seconds


def format_seconds(seconds: float) -> str:
    """A short human form of a duration in seconds: ``42s``, ``5m 3s``, ``2h 10m``, ``3d 4h``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


# --------------------------------------------------------------------------
# Transactions
# --------------------------------------------------------------------------

def _in_transaction(engine: Engine, work: Callable[[Any], T]) -> T:
    """Run `work(connection)` in one short transaction; once more on a new
    connection if the pooled one turns out to be dead (a thawed Lambda
    container). Only idempotent units of work are passed here: each batch
    re-selects its rows by status, so running it again is harmless."""
    try:
        with engine.begin() as conn:
            return work(conn)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        with engine.begin() as conn:
            return work(conn)


# --------------------------------------------------------------------------
# Statistics and backlog
# --------------------------------------------------------------------------

def queue_stats(engine: Engine) -> dict[str, Any]:
    """Counts per channel and status, expired leases, dead in the last hour/day,
    and the oldest due pending message's age in seconds (database clock).

    Returns ``{"channels": [{"channel": …, "pending": …, …}], "totals": {…}}``.
    """
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(STATS)]
    for r in rows:
        r["oldest_pending_age_seconds"] = round(float(r["oldest_pending_age_seconds"]), 3)
    totals: dict[str, Any] = {}
    for key in ("pending", "due_now", "leased", "expired_leases", "delivered", "dead",
                "dead_last_hour", "dead_last_day"):
        totals[key] = sum(r[key] for r in rows)
    totals["oldest_pending_age_seconds"] = max((r["oldest_pending_age_seconds"] for r in rows), default=0.0)
    return {"channels": rows, "totals": totals}


@dataclass(frozen=True, slots=True)
class Backlog:
    """Backlog of one channel. `pending_depth` counts pending messages, due or
    deferred (backoff, `deliver_at`); leased ones are in flight and not counted.
    `oldest_pending_age_seconds` is the age of the oldest due one (0 when none)."""

    channel: Channel
    pending_depth: int
    oldest_pending_age_seconds: float
    dead_count: int


def backlog(engine: Engine, channels: Iterable[Channel] = tuple(Channel)) -> list[Backlog]:
    """Backlog figures for each of `channels` (every channel by default), in one
    statement; channels with no rows get zeros."""
    names = [Channel(c).value for c in channels]
    rows = _in_transaction(engine, lambda c: c.execute(BACKLOG, {"channels": names}).fetchall())
    return [Backlog(Channel(ch), int(depth), round(float(age), 3), int(dead)) for ch, depth, age, dead in rows]


# --------------------------------------------------------------------------
# Dead letters
# --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter as `outbox dead list` shows it (no payload)."""

    seq: int
    message_id: uuid.UUID
    channel: str
    destination: str
    type: str
    attempts: int
    max_attempts: int | None
    last_error_class: str | None
    last_error: str | None
    dead_at: datetime | None
    created_at: datetime
    dead_for_seconds: float | None
    """Seconds since `dead_at`, by the database clock."""

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def list_dead(engine: Engine, *, channel: Channel | None = None, error_class: str | None = None,
              since_seconds: float | None = None, since: datetime | None = None,
              limit: int = 50) -> list[DeadLetter]:
    """Dead letters, newest first, at most `limit` (1..10,000).

    Args:
        channel: only this channel.
        error_class: only this `last_error_class` (e.g. ``"permanent"``).
        since_seconds: only those dead within this many seconds before the database's now().
        since: only those dead at or after this timezone-aware time.

    Raises `ValueError` for a limit out of range or a naive `since`.
    """
    if not 1 <= limit <= 10_000:
        raise ValueError("limit must be between 1 and 10000")
    if since is not None and since.tzinfo is None:
        raise ValueError("since must be timezone-aware")
    params = {
        "channel": Channel(channel).value if channel else None,
        "error_class": error_class,
        "since_seconds": since_seconds,
        "since": since,
        "limit": limit,
    }
    rows = _in_transaction(engine, lambda c: c.execute(LIST_DEAD, params).fetchall())
    return [DeadLetter(*r) for r in rows]


def get_message(engine: Engine, message_id: uuid.UUID | str) -> MessageRow | None:
    """The whole row of one message (any status), or None when there is none.

    Raises `ValueError` when `message_id` is not a UUID."""
    mid = uuid.UUID(str(message_id))
    row = _in_transaction(engine, lambda c: c.execute(GET_MESSAGE, {"message_id": str(mid)}).first())
    return MessageRow.from_mapping(row._mapping) if row is not None else None


# --------------------------------------------------------------------------
# Redrive
# --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RedriveSelection:
    """Which dead letters to redrive. Filters combine (AND); `everything` must
    be set explicitly to redrive every dead letter, and no filter may be set with it."""

    message_ids: tuple[uuid.UUID, ...] = ()
    channel: Channel | None = None
    error_class: str | None = None
    everything: bool = False

    def __post_init__(self) -> None:
        filtered = bool(self.message_ids) or self.channel is not None or self.error_class is not None
        if self.everything and filtered:
            raise ValueError("redrive everything takes no ids, channel or error class")
        if not self.everything and not filtered:
            raise ValueError("say what to redrive: message ids, a channel, an error class, or everything")

    def params(self) -> dict[str, Any]:
        return {
            "channel": Channel(self.channel).value if self.channel else None,
            "error_class": self.error_class,
            "message_ids": [str(m) for m in self.message_ids] if self.message_ids else None,
        }


@dataclass
class RedriveResult:
    """What a redrive did (or, with `dry_run`, would do).

    `by_channel` and `by_error_class` count the messages moved (or matched);
    `not_dead` lists requested ids that were not dead letters when the redrive
    ran (unknown, or pending, leased, delivered: left alone)."""

    dry_run: bool
    moved: int = 0
    batches: int = 0
    by_channel: dict[str, int] = field(default_factory=dict)
    by_error_class: dict[str, int] = field(default_factory=dict)
    not_dead: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "moved": self.moved, "batches": self.batches,
                "by_channel": self.by_channel, "by_error_class": self.by_error_class,
                "not_dead": self.not_dead}


def count_redrive(engine: Engine, selection: RedriveSelection) -> int:
    """How many dead letters `selection` matches now (for a progress bar's total)."""
    rows = _in_transaction(engine, lambda c: c.execute(REDRIVE_PREVIEW, selection.params()).fetchall())
    return sum(int(n) for _, _, n in rows)


def redrive(engine: Engine, selection: RedriveSelection, *, dry_run: bool = False,
            batch_size: int = REDRIVE_BATCH,
            on_batch: Callable[[int], None] | None = None) -> RedriveResult:
    """Move dead letters back to pending: attempts 0, due now (`available_at = now()`).

    Batches of at most `batch_size` rows, one statement each (`REDRIVE_BATCH_SQL`),
    each its own transaction, until no matching dead letter older than the
    redrive's start is left. Only rows with `status = 'dead'` move (the fence);
    concurrent redrives skip each other's rows (SKIP LOCKED).

    Args:
        selection: which dead letters.
        dry_run: count what would move, by channel and error class; change nothing.
        batch_size: rows per statement (1..10,000).
        on_batch: called with the number moved after every batch (progress).

    Returns a `RedriveResult`. Raises `ValueError` for a bad `batch_size`.
    """
    if not 1 <= batch_size <= 10_000:
        raise ValueError("batch_size must be between 1 and 10000")
    params = selection.params()
    result = RedriveResult(dry_run=dry_run)
    seen: set[str] = set()
    if dry_run:
        for channel, error_class, n in _in_transaction(
                engine, lambda c: c.execute(REDRIVE_PREVIEW, params).fetchall()):
            result.moved += int(n)
            result.by_channel[channel] = result.by_channel.get(channel, 0) + int(n)
            key = error_class or "none"
            result.by_error_class[key] = result.by_error_class.get(key, 0) + int(n)
        if selection.message_ids:
            found = _in_transaction(engine, lambda c: c.execute(DEAD_AMONG, params).scalars().all())
            seen = {str(m) for m in found}
    else:
        cutoff = _in_transaction(engine, lambda c: c.execute(DB_NOW).scalar_one())
        batch_params = params | {"cutoff": cutoff, "limit": batch_size}
        while True:
            rows = _in_transaction(engine, lambda c: c.execute(REDRIVE_BATCH_SQL, batch_params).fetchall())
            if not rows:
                break
            result.batches += 1
            result.moved += len(rows)
            for message_id, channel, error_class in rows:
                seen.add(str(message_id))
                result.by_channel[channel] = result.by_channel.get(channel, 0) + 1
                key = error_class or "none"
                result.by_error_class[key] = result.by_error_class.get(key, 0) + 1
            if on_batch is not None:
                on_batch(len(rows))
    result.not_dead = [str(m) for m in selection.message_ids if str(m) not in seen]
    return result


# --------------------------------------------------------------------------
# Retention purge
# --------------------------------------------------------------------------

@dataclass
class PurgeResult:
    """What a purge deleted. `complete` is False when `keep_going` stopped it
    early (a Lambda deadline); the next run carries on where it stopped."""

    delivered: int = 0
    dead: int = 0
    batches: int = 0
    complete: bool = True
    by_channel: dict[str, int] = field(default_factory=dict)
    largest_batch: int = 0

    @property
    def total(self) -> int:
        return self.delivered + self.dead

    def as_dict(self) -> dict[str, Any]:
        return {"delivered": self.delivered, "dead": self.dead, "total": self.total,
                "batches": self.batches, "largest_batch": self.largest_batch,
                "complete": self.complete, "by_channel": self.by_channel}


def count_purge(engine: Engine, *, delivered_older_than_seconds: float,
                dead_older_than_seconds: float | None = None) -> dict[str, int]:
    """How many rows a purge with these windows would delete now:
    ``{"delivered": n, "dead": m}``."""

    def work(conn: Any) -> dict[str, int]:
        delivered = conn.execute(COUNT_DELIVERED_OLDER,
                                 {"older_than_seconds": float(delivered_older_than_seconds)}).scalar_one()
        dead = 0
        if dead_older_than_seconds is not None:
            for ch in Channel:
                dead += conn.execute(COUNT_DEAD_OLDER, {"channel": ch.value,
                                                        "older_than_seconds": float(dead_older_than_seconds)}
                                     ).scalar_one()
        return {"delivered": int(delivered), "dead": int(dead)}

    return _in_transaction(engine, work)


def purge(engine: Engine, *, delivered_older_than_seconds: float, dead_older_than_seconds: float | None = None,
          batch_size: int = PURGE_BATCH, on_batch: Callable[[str, int], None] | None = None,
          keep_going: Callable[[], bool] | None = None) -> PurgeResult:
    """Delete delivered messages older than `delivered_older_than_seconds` (by
    `delivered_at`) and, when given, dead letters older than
    `dead_older_than_seconds` (by `dead_at`). Windows are seconds before the
    database's now().

    Works in batches of at most `batch_size` rows, each one statement and its
    own short transaction; there is never a table-wide DELETE, and rows are
    locked with SKIP LOCKED so neither the purge nor a relay waits on the
    other. `on_batch(kind, n)` is called after each batch (kind ``"delivered"``
    or ``"dead"``); `keep_going()` is asked before each batch and stops the
    purge when it returns False (the result then says `complete=False`).

    Raises `ValueError` for a window that is not positive or a bad batch size.
    """
    if delivered_older_than_seconds <= 0 or (dead_older_than_seconds is not None and dead_older_than_seconds <= 0):
        raise ValueError("retention windows must be longer than zero")
    if not 1 <= batch_size <= 50_000:
        raise ValueError("batch_size must be between 1 and 50000")
    result = PurgeResult()

    def run(kind: str, statement: Any, params: dict[str, Any]) -> bool:
        while True:
            if keep_going is not None and not keep_going():
                result.complete = False
                return False
            rows = _in_transaction(engine, lambda c: c.execute(statement, params).fetchall())
            n = sum(int(count) for _, count in rows)
            if n == 0:
                return True
            result.batches += 1
            result.largest_batch = max(result.largest_batch, n)
            setattr(result, kind, getattr(result, kind) + n)
            for channel, count in rows:
                result.by_channel[channel] = result.by_channel.get(channel, 0) + int(count)
            if on_batch is not None:
                on_batch(kind, n)
            if n < batch_size:
                return True

    if not run("delivered", PURGE_DELIVERED_BATCH,
               {"older_than_seconds": float(delivered_older_than_seconds), "limit": batch_size}):
        return result
    if dead_older_than_seconds is not None:
        for ch in Channel:
            if not run("dead", PURGE_DEAD_BATCH, {"channel": ch.value, "limit": batch_size,
                                                  "older_than_seconds": float(dead_older_than_seconds)}):
                return result
    return result

