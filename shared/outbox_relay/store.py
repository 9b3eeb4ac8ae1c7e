"""The lease store: claim a batch, record outcomes, all fenced and on the database clock."""

from __future__ import annotations

import hashlib
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

DEFAULT_BATCH_MAX_BYTES = 32 * 1024 * 1024  # of payload JSON text
#: Block policy: a message behind its key's dead letter moves this far ahead so claims stop
#: scanning it; a redrive or discard brings it back at once.
DEAD_HOLD_SECONDS = 60.0
#: A key's first message locked this long is no claim's (a claim locks for one statement): the
#: rows behind it are moved ahead by as long as they waited, within the hold bounds.
LOCKED_HEAD_CONFIRM_SECONDS = 0.5
#: A full window behind an unconfirmed locked head is claimed again this soon: a concurrent claim
#: holding it has committed by then.
LOCKED_HEAD_RECHECK_SECONDS = 0.05
LOCKED_HOLD_MIN_SECONDS = 1.0
LOCKED_HOLD_MAX_SECONDS = 30.0

#: (part, parts): a claim that takes only rows in `part` of `parts` (`part_of`).
Part = tuple[int, int]


def part_of(key: str | int, parts: int) -> int:
    """A row's part of `parts` from its key (its seq without one), as relay.sql's `in_part`: even
    ranges of the first 32 bits of the key's md5."""
    return int(hashlib.md5(str(key).encode()).hexdigest()[:8], 16) * parts >> 32


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One claim's messages in seq order (DEAD ones: expired with no attempts left, dead-lettered
    by the claim) and what it saw: `scanned` due rows claimed or moved out of their key's way
    (moved for good: claim again); `due` rows the scan returned, out of turn too (the limit
    reached: more may wait); `suspect`, deliver it alone; `cut` by the byte budget; `requeued`
    first expiries; `locked_heads` keys' first messages locked by another transaction
    (``"seq:xmax"``) and, of those, the `unconfirmed` ones, not yet locked long enough to move."""

    messages: tuple[ClaimedMessage, ...] = ()
    scanned: int = 0
    due: int = 0
    suspect: bool = False
    cut: bool = False
    requeued: int = 0
    locked_heads: tuple[str, ...] = ()
    unconfirmed: tuple[str, ...] = ()


def lease_token(request_id: str) -> str:
    """The request id plus 64 random bits: a retried invocation with the same id must not pass the fence."""
    return f"{request_id}:{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class RecordResult:
    """What one outcome write did; `lease_lost`: outcomes of rows no longer ours, not written."""

    delivered: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    lease_lost: int = 0
    lost_seqs: tuple[int, ...] = ()
    oldest_pending_age_seconds: float | None = None  # None: no statement ran
    lags_ms: tuple[int, ...] = ()  # each delivery's lag by the database clock


class Store(ABC):
    """What the relay loop needs of the lease store; `LeaseStore` and `testing.InMemoryStore`
    both pass tests/contract/store."""

    ordering_on_dead: OrderingOnDead = OrderingOnDead.SKIP

    @abstractmethod
    def claim(self, owner: str, limit: int, lease_seconds: float,
              max_bytes: int = DEFAULT_BATCH_MAX_BYTES, part: Part | None = None) -> ClaimResult: ...

    @abstractmethod
    def record(self, owner: str, outcomes: Sequence[Outcome]) -> RecordResult: ...

    @abstractmethod
    def oldest_pending_age_seconds(self) -> float: ...

    def release(self, owner: str, seqs: Sequence[int], *, delay_seconds: float = 0.0,
                error_class: ErrorClass | None = None, error: str | None = None) -> RecordResult:
        """Give back messages not delivered, refunding the claim's attempt."""
        return self.record(owner, [Outcome(s, OutcomeKind.RELEASE, error_class, error, None, delay_seconds)
                                   for s in seqs])


class LeaseStore(Store):
    """Claims and outcome writes for one channel, one statement each, on the relay's engine."""

    def __init__(self, engine: Engine, channel: Channel, *, default_max_attempts: int, error_max_chars: int = 1000,
                 ordering_on_dead: OrderingOnDead = OrderingOnDead.SKIP):
        self.engine, self.channel, self.default_max_attempts = engine, channel, default_max_attempts
        self.error_max_chars, self.ordering_on_dead = error_max_chars, OrderingOnDead(ordering_on_dead)
        self.locked_heads = LockedHeads()
        self.locked_hold_seconds = (LOCKED_HOLD_MIN_SECONDS, LOCKED_HOLD_MAX_SECONDS)

    def claim(self, owner: str, limit: int, lease_seconds: float,
              max_bytes: int = DEFAULT_BATCH_MAX_BYTES, part: Part | None = None) -> ClaimResult:
        if limit <= 0:
            return ClaimResult()
        confirmed = self.locked_heads.confirmed()
        params = self.claim_parameters(owner, limit, lease_seconds, max_bytes, locked_heads=confirmed, part=part)
        rows = run_with_retry(self.engine, lambda conn: conn.execute(sql.relay.claim, params).fetchall())
        if not rows:
            return ClaimResult()
        # Every row carries the statement's counts; with nothing claimed, one row of counts alone.
        _, _, _, _, _, _, scanned, suspect, due, cut, requeued, locked = rows[0]
        messages = sorted((_message(r) for r in rows if r[0]), key=_seq_of)
        locked_heads = tuple(locked.split(",")) if locked else ()
        self.locked_heads.seen(locked_heads)
        # Unconfirmed: those this claim was not told to move (confirmed since it began, maybe): claim again.
        return ClaimResult(tuple(messages), int(scanned), int(due), bool(suspect), bool(cut), int(requeued),
                           locked_heads, tuple(h for h in locked_heads if h not in confirmed))

    def claim_parameters(self, owner: str, limit: int, lease_seconds: float,
                         max_bytes: int = DEFAULT_BATCH_MAX_BYTES, *,
                         locked_heads: Sequence[str] | None = None, part: Part | None = None) -> dict[str, object]:
        """The bound values of `sql.relay.claim` for these arguments (also for EXPLAIN)."""
        return {"channel": self.channel.value, "limit": int(limit), "owner": owner,
                "lease_seconds": float(lease_seconds), "default_max_attempts": self.default_max_attempts,
                "max_bytes": int(max_bytes), "block_on_dead": self.ordering_on_dead is OrderingOnDead.BLOCK,
                "dead_hold_seconds": DEAD_HOLD_SECONDS,
                "locked_heads": text_array_literal(self.locked_heads.confirmed() if locked_heads is None
                                                  else locked_heads),
                "locked_hold_min_seconds": float(self.locked_hold_seconds[0]),
                "locked_hold_max_seconds": float(self.locked_hold_seconds[1]),
                "part": part[0] if part else None, "parts": part[1] if part else None}

    def record(self, owner: str, outcomes: Sequence[Outcome]) -> RecordResult:
        if not outcomes:
            return RecordResult()
        cap = self.error_max_chars
        params = {"owner": owner, "channel": self.channel.value, "default_max_attempts": self.default_max_attempts,
                  "seqs": array_literal([o.seq for o in outcomes]),
                  "kinds": array_literal([o.kind.value for o in outcomes]),
                  "error_classes": text_array_literal([o.error_class.value if o.error_class else None
                                                       for o in outcomes]),
                  "errors": text_array_literal([truncate(o.error, cap) for o in outcomes]),
                  "refs": text_array_literal([o.delivery_ref for o in outcomes]),
                  "delays": (array_literal([float(o.delay_seconds) for o in outcomes])
                             if any(o.delay_seconds for o in outcomes) else None)}
        delivered, retried, dead, released, lost, oldest, lags = run_with_retry(
            self.engine, lambda conn: conn.execute(sql.relay.record_outcomes, params).one())
        lost_seqs = tuple(lost or ())
        return RecordResult(delivered, retried, dead, released, len(lost_seqs), lost_seqs, float(oldest),
                            tuple(map(int, lags.split(","))) if lags else ())

    def oldest_pending_age_seconds(self) -> float:
        return float(run_with_retry(self.engine, lambda c: c.execute(
            sql.relay.oldest_pending_age, {"channel": self.channel.value}).scalar_one()))


_seq_of = operator.attrgetter("seq")
_new_message = tuple.__new__
_STATUS = {s.value: s for s in Status}


def _message(row) -> ClaimedMessage:
    """A claim row: "seq status attempts max_attempts message_id created_at" as one text column
    (generated values, never a space: it decodes faster than six), then the message's texts."""
    head, destination, type_, key, payload, headers = row[:6]
    seq, status, attempts, max_attempts, message_id, created_at = head.split(" ")
    return _new_message(ClaimedMessage, (int(seq), message_id, _STATUS[status], destination, type_, key, payload,
                                         headers, int(attempts), int(max_attempts), created_at))


class LockedHeads:
    """Locked key heads (``"seq:xmax"``) and since when, on this process's monotonic clock (how
    long this relay has seen the lock, no stored time). One locked by the same transaction for
    `LOCKED_HEAD_CONFIRM_SECONDS` is no claim's: its key's rows are then moved out of the scan."""

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
        """Note `heads` locked now; those not yet confirmed. One unseen for `forget_seconds` starts over."""
        now = self._clock()
        with self._lock:
            for h in [h for h, (_, last) in self._seen.items() if now - last > self.forget_seconds]:
                del self._seen[h]
            for h in heads:
                self._seen.setdefault(h, [now, now])[1] = now
            return tuple(h for h in heads if now - self._seen[h][0] < self.confirm_seconds)


def array_literal(values: Sequence[int | float | str]) -> str:
    """``'{1,2,3}'``, of numbers or words that need no quoting; cast it in SQL."""
    return "{" + ",".join(map(str, values)) + "}"


def text_array_literal(values: Sequence[str | None]) -> str | None:
    """A text[] literal, every element quoted (a text "null" stays text), NUL characters (which
    PostgreSQL text cannot hold) dropped; None when every element is None."""
    if all(v is None for v in values):
        return None
    return "{" + ",".join(
        "NULL" if v is None else
        '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", "") + '"'
        for v in values
    ) + "}"


def truncate(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    marker = f"… [truncated, {len(text)} chars]"
    return text[: max(0, limit - len(marker))] + marker
