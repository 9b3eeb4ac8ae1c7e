"""The lease store: claim a batch, record outcomes, all fenced and on the database clock."""

from __future__ import annotations

import operator
import secrets
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from sqlalchemy import Engine

from . import sql
from .db import run_with_retry
from .models import ClaimedMessage, ErrorClass, OrderingOnDead, Outcome, OutcomeKind, Status
from .publishers.registry import Channel

#: Default byte budget of one claim: 32 MiB of payload JSON text.
DEFAULT_BATCH_MAX_BYTES = 32 * 1024 * 1024
#: Under the block policy, a due message held back by a dead letter of its key is
#: moved this far ahead, seconds, so claims do not scan it again; a redrive or a
#: discard of the dead letter brings it back at once.
DEAD_HOLD_SECONDS = 60.0
#: A key's first message seen locked by another transaction for this long, seconds,
#: is held by no claim (a claim's locks last one statement): the key's rows behind
#: it are then moved ahead, by as long as they have waited, within these bounds.
LOCKED_HEAD_CONFIRM_SECONDS = 0.5
#: A claim whose window is full behind such a head, not yet confirmed, is tried
#: again this soon, seconds: a concurrent claim that holds it has committed by then.
LOCKED_HEAD_RECHECK_SECONDS = 0.05
LOCKED_HOLD_MIN_SECONDS = 1.0
LOCKED_HOLD_MAX_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What one claim returned: its messages in seq order, and what the statement
    saw besides:

    - `scanned`: due rows it claimed or moved out of their key's way (none claimed
      and some moved: claim again, the moved ones are out of the way for good);
    - `due`: due rows the scan returned, those left out of their key's turn too
      (an earlier row of the key locked by another transaction, usually a
      concurrent claim, or leased by another relay); as many as the limit means
      more may be waiting;
    - `suspect`: the claim is one expired lease re-claimed alone (its holder died,
      perhaps because of it): deliver it with nothing else in flight;
    - `cut`: the byte budget left claimable rows behind (more is waiting, however
      few rows the claim returned);
    - `requeued`: expired leases it put back to pending (their first expiry): the
      next claim can take them;
    - `locked_heads`: keys' first messages it found locked by another transaction,
      with later rows of their key in its scan, as ``"seq:xmax"`` (xmax: the
      locking transaction); `unconfirmed`: of those, the ones not yet seen locked
      by that transaction for long enough for their rows to be moved.

    Messages with status DEAD were re-claimed with no attempts left and
    dead-lettered (`lease_expired`) by the claim; the rest are leased.
    """

    messages: tuple[ClaimedMessage, ...] = ()
    scanned: int = 0
    due: int = 0
    suspect: bool = False
    cut: bool = False
    requeued: int = 0
    locked_heads: tuple[str, ...] = ()
    unconfirmed: tuple[str, ...] = ()


def lease_token(request_id: str) -> str:
    """A lease owner token unique to one invocation: the Lambda request id plus
    64 random bits. Never a stable worker or function name: a retried or
    duplicated invocation with the same request id must not pass the fence."""
    return f"{request_id}:{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class RecordResult:
    """What one outcome write did. `lease_lost` counts outcomes that matched no
    row we still hold (taken over after expiry, or redriven): nothing was written."""

    delivered: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    lease_lost: int = 0
    lost_seqs: tuple[int, ...] = ()
    #: Age in seconds of the channel's oldest due pending message (0 when none),
    #: read by the same statement; None when no statement ran.
    oldest_pending_age_seconds: float | None = None
    #: Delivery lag of each message delivered by this write, milliseconds by the
    #: database clock: from its created_at (or later scheduled_at) to the write.
    lags_ms: tuple[int, ...] = ()


class Store(ABC):
    """What the relay loop needs of the lease store. `LeaseStore` is PostgreSQL's;
    `testing.InMemoryStore` is the fake; both pass tests/contract/store."""

    #: The channel's policy for the keys of dead letters.
    ordering_on_dead: OrderingOnDead = OrderingOnDead.SKIP

    @abstractmethod
    def claim(self, owner: str, limit: int, lease_seconds: float,
              max_bytes: int = DEFAULT_BATCH_MAX_BYTES) -> ClaimResult:
        """Claim up to `limit` messages under `owner` for `lease_seconds`, stopping
        once the payloads' JSON text reaches `max_bytes` (at least one is claimed)."""

    @abstractmethod
    def record(self, owner: str, outcomes: Sequence[Outcome]) -> RecordResult:
        """Write `outcomes`, fenced on `owner`'s lease."""

    @abstractmethod
    def oldest_pending_age_seconds(self) -> float:
        """Age of the oldest due pending message, seconds (0 when none)."""

    def release(self, owner: str, seqs: Sequence[int], *, delay_seconds: float = 0.0,
                error_class: ErrorClass | None = None, error: str | None = None) -> RecordResult:
        """Give back messages not delivered, refunding the claim's attempt."""
        return self.record(owner, [Outcome(s, OutcomeKind.RELEASE, error_class, error, None, delay_seconds)
                                   for s in seqs])


class LeaseStore(Store):
    """Claims and outcome writes for one channel, one statement each.

    `engine` is the relay's (`db.create_relay_engine`: each statement in a short
    transaction of its own, which a transaction pooler keeps on one server connection);
    `default_max_attempts` applies to messages enqueued without their own;
    `ordering_on_dead` is the channel's policy for the keys of dead letters.
    """

    def __init__(self, engine: Engine, channel: Channel, *, default_max_attempts: int, error_max_chars: int = 1000,
                 ordering_on_dead: OrderingOnDead = OrderingOnDead.SKIP):
        self.engine = engine
        self.channel = channel
        self.default_max_attempts = default_max_attempts
        self.error_max_chars = error_max_chars
        self.ordering_on_dead = OrderingOnDead(ordering_on_dead)
        self.locked_heads = LockedHeads()
        #: Bounds of the hold of rows behind a key's first message locked for long, seconds.
        self.locked_hold_seconds = (LOCKED_HOLD_MIN_SECONDS, LOCKED_HOLD_MAX_SECONDS)

    def claim(self, owner: str, limit: int, lease_seconds: float,
              max_bytes: int = DEFAULT_BATCH_MAX_BYTES) -> ClaimResult:
        """Claim up to `limit` messages for `lease_seconds` (seconds) under `owner`,
        stopping once the payloads' JSON text claimed reaches `max_bytes` (bytes; at
        least one message is always claimed).

        One statement (`sql.relay.claim`): expired leases first (requeued on their
        first expiry; one that expired again alone: the claim is then `suspect`),
        else due pending rows oldest first, those with a key in their key's turn. Returned messages with status DEAD were
        re-claimed with no attempts left and dead-lettered (`lease_expired`)
        by the same statement; the rest are LEASED to `owner`.
        """
        if limit <= 0:
            return ClaimResult()
        confirmed = self.locked_heads.confirmed()
        params = self.claim_parameters(owner, limit, lease_seconds, max_bytes, locked_heads=confirmed)
        rows = run_with_retry(self.engine, lambda conn: conn.execute(sql.relay.claim, params).fetchall())
        if not rows:
            return ClaimResult()
        # Every row carries the statement's counts; with nothing claimed, one row of
        # counts alone (its message columns NULL).
        _, _, _, _, _, _, scanned, suspect, due, cut, requeued, locked = rows[0]
        messages = sorted((_message(r) for r in rows if r[0]), key=_seq_of)
        locked_heads = tuple(locked.split(",")) if locked else ()
        self.locked_heads.seen(locked_heads)
        return ClaimResult(tuple(messages), int(scanned), int(due), bool(suspect), bool(cut), int(requeued),
                           locked_heads,
                           # Those this claim was not told to move (confirmed since it began, maybe): claim again.
                           tuple(h for h in locked_heads if h not in confirmed))

    def claim_parameters(self, owner: str, limit: int, lease_seconds: float,
                         max_bytes: int = DEFAULT_BATCH_MAX_BYTES, *,
                         locked_heads: Sequence[str] | None = None) -> dict[str, object]:
        """The bound values of `sql.relay.claim` for these arguments (also for EXPLAIN)."""
        return {
            "channel": self.channel.value,
            "limit": int(limit),
            "owner": owner,
            "lease_seconds": float(lease_seconds),
            "default_max_attempts": self.default_max_attempts,
            "max_bytes": int(max_bytes),
            "block_on_dead": self.ordering_on_dead is OrderingOnDead.BLOCK,
            "dead_hold_seconds": DEAD_HOLD_SECONDS,
            "locked_heads": text_array_literal(self.locked_heads.confirmed() if locked_heads is None
                                               else locked_heads),
            "locked_hold_min_seconds": float(self.locked_hold_seconds[0]),
            "locked_hold_max_seconds": float(self.locked_hold_seconds[1]),
        }

    def record(self, owner: str, outcomes: Sequence[Outcome]) -> RecordResult:
        """Write `outcomes` for messages leased to `owner`, in one statement.

        Fenced: a row is changed only while `status = 'leased' AND lease_owner
        = owner`; others are counted in `lease_lost` and left as they are.
        Error texts are truncated to `error_max_chars`. The same statement
        reads the channel's oldest pending age (seconds, as
        `oldest_pending_age_seconds` gives it, before this write).
        """
        if not outcomes:
            return RecordResult()
        cap = self.error_max_chars
        params = {
            "owner": owner,
            "channel": self.channel.value,
            "default_max_attempts": self.default_max_attempts,
            "seqs": array_literal([o.seq for o in outcomes]),
            "kinds": array_literal([o.kind.value for o in outcomes]),
            "error_classes": text_array_literal([o.error_class.value if o.error_class else None for o in outcomes]),
            "errors": text_array_literal([truncate(o.error, cap) for o in outcomes]),
            "refs": text_array_literal([o.delivery_ref for o in outcomes]),
            "delays": (array_literal([float(o.delay_seconds) for o in outcomes])
                       if any(o.delay_seconds for o in outcomes) else None),
        }

        def work(conn):
            return conn.execute(sql.relay.record_outcomes, params).one()

        delivered, retried, dead, released, lost, oldest, lags = run_with_retry(self.engine, work)
        lost_seqs = tuple(lost or ())
        return RecordResult(delivered, retried, dead, released, len(lost_seqs), lost_seqs, float(oldest),
                            tuple(map(int, lags.split(","))) if lags else ())

    def oldest_pending_age_seconds(self) -> float:
        """Age in seconds of the oldest due pending message (0 when none), by the database clock."""
        return float(run_with_retry(
            self.engine, lambda c: c.execute(sql.relay.oldest_pending_age, {"channel": self.channel.value}).scalar_one()
        ))


_seq_of = operator.attrgetter("seq")
_new_message = tuple.__new__
_STATUS = {s.value: s for s in Status}


def _message(row) -> ClaimedMessage:
    """A message from a row of `sql.relay.claim`: a first column "seq status attempts
    max_attempts message_id created_at" (generated values, never with a space; one
    text column decodes faster than six), then destination, type, key, payload, headers."""
    head, destination, type_, key, payload, headers = row[:6]
    seq, status, attempts, max_attempts, message_id, created_at = head.split(" ")
    return _new_message(ClaimedMessage, (int(seq), message_id, _STATUS[status], destination, type_, key, payload,
                                         headers, int(attempts), int(max_attempts), created_at))


class LockedHeads:
    """Keys' first messages that claims found locked by another transaction, each
    as ``"seq:xmax"`` (the row and the transaction holding it), and since when
    (this process's monotonic clock: it measures only how long this relay has
    seen the lock, no stored time). One seen locked by the same transaction
    across `LOCKED_HEAD_CONFIRM_SECONDS` is confirmed: no claim holds a row that
    long (two claims that each held it briefly are two transactions), so the
    claim then moves its key's rows out of the scan. One per store, shared by a
    process's invocations."""

    def __init__(self, confirm_seconds: float = LOCKED_HEAD_CONFIRM_SECONDS,
                 forget_seconds: float = LOCKED_HOLD_MAX_SECONDS * 2, clock=time.monotonic) -> None:
        self.confirm_seconds, self.forget_seconds, self._clock = confirm_seconds, forget_seconds, clock
        self._seen: dict[str, list[float]] = {}  # "seq:xmax" -> [first seen, last seen]
        self._lock = threading.Lock()

    def confirmed(self) -> list[str]:
        now = self._clock()
        with self._lock:
            return [h for h, (first, _) in self._seen.items() if now - first >= self.confirm_seconds]

    def seen(self, heads: Sequence[str]) -> tuple[str, ...]:
        """Note `heads` found locked now; return those not yet confirmed. A head not
        seen for `forget_seconds` (its rows moved out of the scan longer than the
        longest hold, or its lock gone) starts over."""
        now = self._clock()
        with self._lock:
            for h in [h for h, (_, last) in self._seen.items() if now - last > self.forget_seconds]:
                del self._seen[h]
            for h in heads:
                self._seen.setdefault(h, [now, now])[1] = now
            return tuple(h for h in heads if now - self._seen[h][0] < self.confirm_seconds)


def array_literal(values: Sequence[int | float | str]) -> str:
    """A PostgreSQL array literal of numbers or of words that need no quoting
    (outcome kinds), e.g. ``'{1,2,3}'``; cast it in SQL (`CAST(:x AS bigint[])`)."""
    return "{" + ",".join(map(str, values)) + "}"


def text_array_literal(values: Sequence[str | None]) -> str | None:
    """A PostgreSQL text[] literal with every element quoted (so a text "null"
    stays text), None elements as NULL; None when every element is None.

    NUL characters, which PostgreSQL text cannot hold, are dropped."""
    if all(v is None for v in values):
        return None
    return "{" + ",".join(
        "NULL" if v is None else
        '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", "") + '"'
        for v in values
    ) + "}"


def truncate(text: str | None, limit: int) -> str | None:
    """Cut `text` to at most `limit` characters, marking the cut."""
    if text is None or len(text) <= limit:
        return text
    marker = f"… [truncated, {len(text)} chars]"
    return text[: max(0, limit - len(marker))] + marker
