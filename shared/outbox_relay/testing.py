"""An in-memory lease store for tests of the relay loop without a database: `sql/relay.sql`'s claim
and outcome write, rule for rule, on a dict (tests/contract/store keeps it to PostgreSQL's). Time
is a number the test moves; `lock` holds a row as another transaction would (SKIP LOCKED skips it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import accumulate
from typing import Sequence

from .ids import uuid7
from .models import ClaimedMessage, OrderingOnDead, Outcome, OutcomeKind, Status
from .store import (
    DEAD_HOLD_SECONDS,
    DEFAULT_BATCH_MAX_BYTES,
    LOCKED_HOLD_MAX_SECONDS,
    LOCKED_HOLD_MIN_SECONDS,
    ClaimResult,
    LockedHeads,
    Part,
    RecordResult,
    Store,
    part_of,
)

REQUEUED = "lease expired: its holder died or overran its lease; back in the queue"


@dataclass
class StoredMessage:
    seq: int
    destination: str = "s"
    type: str = "t"
    key: str | None = None
    payload_json: str = "{}"
    headers_json: str | None = None
    status: Status = Status.PENDING
    attempts: int = 0
    max_attempts: int | None = None
    created_at: float = 0.0
    scheduled_at: float | None = None
    available_at: float = 0.0
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    last_error_class: str | None = None
    last_error: str | None = None
    delivery_ref: str | None = None
    locked_by: int | None = None
    message_id: str = field(default_factory=lambda: str(uuid7()))  # as the producer makes them


class InMemoryStore(Store):
    def __init__(self, *, default_max_attempts: int = 5, ordering_on_dead: OrderingOnDead = OrderingOnDead.SKIP,
                 now: float = 1000.0) -> None:
        self.default_max_attempts, self.now = default_max_attempts, now
        self.ordering_on_dead = OrderingOnDead(ordering_on_dead)
        self.rows: dict[int, StoredMessage] = {}
        self.locked_heads = LockedHeads(clock=lambda: self.now)
        self.locked_hold_seconds = (LOCKED_HOLD_MIN_SECONDS, LOCKED_HOLD_MAX_SECONDS)

    def add(self, *, deliver_at: float | None = None, **fields) -> StoredMessage:
        """`deliver_at`: seconds from now."""
        seq = max(self.rows, default=0) + 1
        scheduled = self.now + deliver_at if deliver_at is not None else None
        row = StoredMessage(seq, created_at=self.now, scheduled_at=scheduled,
                            available_at=fields.pop("available_at", scheduled or self.now), **fields)
        self.rows[seq] = row
        return row

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def lock(self, seq: int, xmax: int) -> None:
        self.rows[seq].locked_by = xmax

    def unlock(self, seq: int) -> None:
        self.rows[seq].locked_by = None

    def redrive(self, seqs: Sequence[int]) -> int:
        """As `outbox dead redrive`: the never-tried rows a claim moved ahead behind them are due now too."""
        moved = [self.rows[seq] for seq in seqs if self.rows[seq].status is Status.DEAD]
        for row in moved:
            row.status, row.attempts, row.available_at = Status.PENDING, 0, self.now
        firsts: dict[tuple[str, str], int] = {}
        for row in moved:
            if row.key is not None:
                k = (row.destination, row.key)
                firsts[k] = min(firsts.get(k, row.seq), row.seq)
        for (destination, key), first in firsts.items():
            for k in self._key_rows(destination, key):
                if (k.seq > first and k.status is Status.PENDING and k.attempts == 0
                        and k.available_at > self.now and k.available_at != k.scheduled_at):
                    k.available_at = self.now
        return len(moved)

    def claim(self, owner: str, limit: int, lease_seconds: float,
              max_bytes: int = DEFAULT_BATCH_MAX_BYTES, part: Part | None = None) -> ClaimResult:
        if limit <= 0:
            return ClaimResult()
        now, block = self.now, self.ordering_on_dead is OrderingOnDead.BLOCK
        confirmed = set(self.locked_heads.confirmed())
        # Every step reads the rows as the statement began (a data-modifying CTE
        # sees the snapshot, not its siblings' changes); the changes come last.
        expired = sorted((r for r in self.rows.values() if r.status is Status.LEASED and r.locked_by is None
                          and r.lease_expires_at <= now), key=lambda r: (r.lease_expires_at, r.seq))[:limit]
        exhausted = [r for r in expired if r.attempts >= self._max(r)]
        requeued = [r for r in expired if r not in exhausted and r.last_error_class != "lease_expired"]
        suspect = next((r for r in expired if r not in exhausted and r not in requeued
                        and (r.key is None or (self._first_holding(r) is None
                                               and not (block and self._dead_before(r))))), None)
        due, turns = [], {}
        if suspect is None:
            for r in sorted(self.rows.values(), key=lambda r: (r.available_at, r.seq)):
                if len(due) >= limit:
                    break
                if r.status is not Status.PENDING or r.available_at > now or r.locked_by is not None:
                    continue
                if part is not None and part_of(r.seq if r.key is None else r.key, part[1]) != part[0]:
                    continue
                turn = self._turn_of(r, owner, block) if r.key is not None else None
                if turn != math.inf:
                    due.append(r)
                    turns[r.seq] = turn
        candidates = [r for r in due if turns[r.seq] in (None, -math.inf)]
        keys = {(r.destination, r.key) for r in candidates if turns[r.seq] == -math.inf}
        by_key: dict[tuple[str, str], list[StoredMessage]] = {}
        for r in sorted(candidates, key=lambda r: r.seq):
            if (r.destination, r.key) in keys:
                by_key.setdefault((r.destination, r.key), []).append(r)
        out_of_turn, heads = set(), {}
        for k, rows in by_key.items():
            firsts = [h.seq for h in self._key_rows(*k) if self._holds_back(h)
                      and not (h.status is Status.LEASED and h.lease_owner == owner and h.lease_expires_at > now)]
            firsts = firsts[:len(rows)]
            out_of_turn |= {r.seq for i, r in enumerate(rows) if i >= len(firsts) or firsts[i] != r.seq}
            head = self.rows[firsts[0]] if firsts else None
            if head is not None and head not in due and head.status is Status.PENDING and head.available_at <= now:
                heads[k] = f"{head.seq}:{head.locked_by or 0}"  # xmax 0: no transaction holds it
        moves = {r.seq: turns[r.seq] for r in due if turns[r.seq] not in (None, -math.inf)}
        low, high = self.locked_hold_seconds
        held = [r for r in due if r.seq in out_of_turn and heads.get((r.destination, r.key)) in confirmed]
        for r in held:
            moves[r.seq] = now + min(high, max(low, now - max(r.created_at, r.scheduled_at or r.created_at)))
        budget = sorted((r for r in candidates if r.seq not in out_of_turn), key=lambda r: r.seq)
        before = accumulate((len(r.payload_json.encode()) for r in budget), initial=0)  # bytes before each
        picked = [r for r, size in zip(budget, before) if size < max_bytes]
        cut = len(picked) < len(budget)
        picked += ([suspect] if suspect else []) + exhausted
        # The changes.
        for r in requeued:
            r.status, r.lease_owner, r.lease_expires_at = Status.PENDING, None, None
            r.last_error_class, r.last_error = "lease_expired", REQUEUED
        for seq, until in moves.items():
            self.rows[seq].available_at = until
        messages = []
        for r in picked:
            if r.status is Status.LEASED and r.attempts >= self._max(r):
                r.status, r.lease_owner, r.lease_expires_at = Status.DEAD, None, None
                r.last_error_class = "lease_expired"
                r.last_error = (f"lease expired with no attempts left ({r.attempts} made); "
                                "the holder died or overran its lease")
            else:
                r.status, r.attempts = Status.LEASED, r.attempts + 1
                r.lease_owner, r.lease_expires_at = owner, now + lease_seconds
            messages.append(ClaimedMessage(r.seq, r.message_id, r.status, r.destination, r.type, r.key,
                                           r.payload_json, r.headers_json, r.attempts, self._max(r),
                                           _iso(r.created_at)))
        locked = tuple(heads.values())
        self.locked_heads.seen(locked)
        return ClaimResult(tuple(sorted(messages, key=lambda m: m.seq)), len(due) - len(out_of_turn) + len(held),
                           len(due), suspect is not None, cut, len(requeued), locked,
                           tuple(h for h in locked if h not in confirmed))

    def record(self, owner: str, outcomes: Sequence[Outcome]) -> RecordResult:
        oldest = self.oldest_pending_age_seconds()
        counts = dict.fromkeys(("delivered", "retried", "dead", "released"), 0)
        lost, lags = [], []
        for o in outcomes:
            r = self.rows.get(o.seq)
            if r is None or r.status is not Status.LEASED or r.lease_owner != owner:
                lost.append(o.seq)
                continue
            r.lease_owner = r.lease_expires_at = None
            r.delivery_ref = o.delivery_ref or r.delivery_ref
            r.last_error = o.error or r.last_error
            r.last_error_class = o.error_class.value if o.error_class else r.last_error_class
            if o.kind is OutcomeKind.DELIVERED:
                r.status = Status.DELIVERED
                counts["delivered"] += 1
                lags.append(round((self.now - max(r.created_at, r.scheduled_at or r.created_at)) * 1000))
            elif o.kind is OutcomeKind.DEAD or (o.kind is OutcomeKind.RETRY and r.attempts >= self._max(r)):
                r.status = Status.DEAD
                counts["dead"] += 1
            else:
                r.status, r.available_at = Status.PENDING, self.now + (o.delay_seconds or 0.0)
                if o.kind is OutcomeKind.RELEASE:
                    r.attempts = max(r.attempts - 1, 0)
                    counts["released"] += 1
                else:
                    counts["retried"] += 1
        return RecordResult(**counts, lease_lost=len(lost), lost_seqs=tuple(sorted(lost)),
                            oldest_pending_age_seconds=oldest, lags_ms=tuple(lags))

    def oldest_pending_age_seconds(self) -> float:
        due = [r.available_at for r in self.rows.values() if r.status is Status.PENDING and r.available_at <= self.now]
        return self.now - min(due) if due else 0.0

    # The rules `sql/relay.sql` names.
    def _max(self, r: StoredMessage) -> int:
        return r.max_attempts if r.max_attempts is not None else self.default_max_attempts

    def _key_rows(self, destination: str, key: str) -> list[StoredMessage]:
        return sorted((r for r in self.rows.values() if r.destination == destination and r.key == key),
                      key=lambda r: r.seq)

    def _holds_back(self, k: StoredMessage) -> bool:
        """holds_back_its_key."""
        return k.status in (Status.PENDING, Status.LEASED) and not (
            k.status is Status.PENDING and k.attempts == 0 and k.scheduled_at is not None
            and k.available_at == k.scheduled_at and k.available_at > self.now)

    def _first_holding(self, m: StoredMessage) -> StoredMessage | None:
        return next((k for k in self._key_rows(m.destination, m.key) if k.seq < m.seq and self._holds_back(k)), None)

    def _dead_before(self, m: StoredMessage) -> bool:
        return any(k.status is Status.DEAD and k.seq < m.seq for k in self._key_rows(m.destination, m.key))

    def _turn_of(self, m: StoredMessage, owner: str, block: bool) -> float | None:
        """turn_of: None claim; -inf claim with the earlier ones; inf leave; a time: move it there."""
        if block and self._dead_before(m):
            return self.now + DEAD_HOLD_SECONDS
        k = self._first_holding(m)
        if k is None:
            return None
        if k.status is Status.PENDING:
            return -math.inf if k.available_at <= m.available_at else k.available_at
        if k.lease_owner == owner and k.lease_expires_at > self.now:
            return -math.inf
        return math.inf


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

