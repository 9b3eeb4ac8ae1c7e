"""In-memory fakes of the lease store and a publisher, for unit tests of the
relay loop's branches without sockets (`outbox_relay.store.Store`,
`outbox_relay.publishers.base.Publisher`).

`FakeStore` keeps rows with the lifecycle's rules (docs/design.md, "Message
lifecycle"): a claim leases pending rows (attempts + 1) to its owner, an
outcome write is fenced on the owner's lease, a release refunds the attempt.
Time is a number the test moves (`now`), never the wall clock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Callable, Sequence

from outbox_relay.errors import DownstreamUnavailable
from outbox_relay.models import Channel, ClaimedMessage, DeliveryResult, ErrorClass, Outcome, OutcomeKind, Status
from outbox_relay.publishers.base import Deadline, RecordResults
from outbox_relay.store import RecordResult


@dataclass
class Row:
    seq: int
    destination: str = "s"
    key: str | None = None
    status: Status = Status.PENDING
    attempts: int = 0
    max_attempts: int = 3
    available_at: float = 0.0
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    last_error_class: str | None = None
    last_error: str | None = None
    delivery_ref: str | None = None
    message_id: str = field(default_factory=lambda: str(uuid.uuid4()))


class FakeStore:
    """The store's contract in memory. `claims` and `records` log every call."""

    def __init__(self, n: int = 0, **row_fields) -> None:
        self.now = 1000.0
        self.rows: dict[int, Row] = {}
        self.claims: list[tuple[str, int]] = []
        self.claim_bytes: list[int] = []
        self.records: list[list[Outcome]] = []
        self.steal: set[int] = set()  # seqs whose lease another holder took (outcomes for them are lost)
        self.fail_record: BaseException | None = None
        for _ in range(n):
            self.add(**row_fields)

    def add(self, **fields) -> Row:
        seq = len(self.rows) + 1
        row = Row(seq, available_at=fields.pop("available_at", self.now), **fields)
        self.rows[seq] = row
        return row

    def claim(self, owner: str, limit: int, lease_seconds: float, max_bytes: int = 1 << 30) -> list[ClaimedMessage]:
        self.claims.append((owner, limit))
        self.claim_bytes.append(max_bytes)
        out = []
        for row in sorted(self.rows.values(), key=lambda r: (r.available_at, r.seq)):
            if len(out) >= limit:
                break
            expired = row.status is Status.LEASED and row.lease_expires_at is not None \
                and row.lease_expires_at <= self.now
            if row.status is Status.PENDING and row.available_at <= self.now or expired:
                if expired and row.attempts >= row.max_attempts:
                    row.status, row.lease_owner, row.lease_expires_at = Status.DEAD, None, None
                    row.last_error_class = ErrorClass.LEASE_EXPIRED.value
                else:
                    row.status, row.attempts = Status.LEASED, row.attempts + 1
                    row.lease_owner, row.lease_expires_at = owner, self.now + lease_seconds
                out.append(ClaimedMessage(row.seq, row.message_id, row.status, row.destination, "t", row.key,
                                          '{"n":%d}' % row.seq, None, row.attempts, row.max_attempts,
                                          "2026-01-01T00:00:00.000000Z"))
        return out

    def record(self, owner: str, outcomes: Sequence[Outcome]) -> RecordResult:
        if self.fail_record is not None:
            raise self.fail_record
        self.records.append(list(outcomes))
        counts = dict(delivered=0, retried=0, dead=0, released=0)
        lost = []
        for o in outcomes:
            row = self.rows[o.seq]
            if row.status is not Status.LEASED or row.lease_owner != owner or o.seq in self.steal:
                lost.append(o.seq)
                continue
            row.lease_owner = row.lease_expires_at = None
            if o.error_class is not None:
                row.last_error_class, row.last_error = o.error_class.value, o.error
            if o.kind is OutcomeKind.DELIVERED:
                row.status, row.delivery_ref = Status.DELIVERED, o.delivery_ref
                counts["delivered"] += 1
            elif o.kind is OutcomeKind.DEAD or (o.kind is OutcomeKind.RETRY and row.attempts >= row.max_attempts):
                row.status = Status.DEAD
                counts["dead"] += 1
            elif o.kind is OutcomeKind.RETRY:
                row.status, row.available_at = Status.PENDING, self.now + o.delay_seconds
                counts["retried"] += 1
            else:
                row.status, row.available_at = Status.PENDING, self.now + o.delay_seconds
                row.attempts = max(0, row.attempts - 1)
                counts["released"] += 1
        return RecordResult(**counts, lease_lost=len(lost), lost_seqs=tuple(sorted(lost)),
                            oldest_pending_age_seconds=self.oldest_pending_age_seconds())

    def release(self, owner: str, seqs: Sequence[int], *, delay_seconds: float = 0.0,
                error_class=None, error: str | None = None) -> RecordResult:
        return self.record(owner, [Outcome(s, OutcomeKind.RELEASE, error_class, error, None, delay_seconds)
                                   for s in seqs])

    def oldest_pending_age_seconds(self) -> float:
        due = [r.available_at for r in self.rows.values() if r.status is Status.PENDING and r.available_at <= self.now]
        return self.now - min(due) if due else 0.0

    def status_of(self) -> dict[int, tuple[str, int]]:
        return {seq: (r.status.value, r.attempts) for seq, r in self.rows.items()}


Script = Callable[[ClaimedMessage], DeliveryResult | None]


class FakePublisher:
    """A publisher whose answers the test scripts.

    `answer(m)` gives each message's result (None: not reported, as when the
    deadline came); `raise_after` raises that exception after reporting the
    first `report_first` results (a downstream lost mid-batch)."""

    channel = Channel.REDIS

    def __init__(self, answer: Script | None = None, *, gate: str | None = None, limit: int | None = None,
                 raise_after: BaseException | None = None, report_first: int = 0, pipelined: bool = False) -> None:
        self.pipelined = pipelined
        self.gates = 0
        self.begun = 0
        self.answer = answer or (lambda m: DeliveryResult.delivered(m.seq, f"{m.seq}-0"))
        self.gate_reason = gate
        self.limit = limit
        self.raise_after = raise_after
        self.report_first = report_first
        self.delivered: list[list[int]] = []

    def begin(self, deadline: Deadline) -> None:
        self.begun += 1

    def gate(self) -> str | None:
        self.gates += 1
        return self.gate_reason

    def claim_limit(self, batch_size: int, seconds_available: float) -> int:
        if seconds_available <= 0:
            return 0
        return batch_size if self.limit is None else min(batch_size, self.limit)

    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None:
        # The contract's deadline rule (publishers/base.py): nothing starts once it has passed.
        if deadline.passed():
            return
        self.delivered.append([m.seq for m in messages])
        if self.raise_after is not None:
            first = [self._answers(messages[: self.report_first])]
            record([r for r in first[0] if r is not None])
            raise self.raise_after
        results = [r for r in self._answers(messages) if r is not None]
        record(results)

    def _answers(self, messages: Sequence[ClaimedMessage]) -> list[DeliveryResult | None]:
        """The script's answers, except that a key stops at its first failure in the batch:
        its later messages are not attempted, as the contract asks of every publisher."""
        stopped: set[str] = set()
        out: list[DeliveryResult | None] = []
        for m in messages:
            if m.key is not None and m.key in stopped:
                out.append(DeliveryResult(m.seq, error_class=ErrorClass.NOT_ATTEMPTED,
                                          error="fake: an earlier message of its key failed in this batch"))
                continue
            result = self.answer(m)
            if m.key is not None and (result is None or result.error_class is not None):
                stopped.add(m.key)
            out.append(result)
        return out


class FakeClock:
    """Time for a deadline and the idle waits: `sleep` moves it (and calls `on_sleep`)."""

    def __init__(self, seconds: float = 60.0, margin: float = 5.0) -> None:
        self.now = 0.0
        self.end = seconds
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[float], None] | None = None
        self.deadline = Deadline(lambda: max(0, int((self.end - self.now) * 1000)), margin)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.now)


def unavailable() -> DownstreamUnavailable:
    return DownstreamUnavailable("redis connection failed mid-batch (ConnectionError)")
