"""In-memory fakes of the lease store and a publisher, for unit tests of the
relay loop's branches without sockets (`outbox_relay.store.Store`,
`outbox_relay.publishers.base.Publisher`).

`FakeStore` is the shipped `outbox_relay.testing.InMemoryStore` (held to
`LeaseStore` by tests/contract/store) with its calls logged. Time is a number
the test moves (`now`, `advance`), never the wall clock.
"""

from __future__ import annotations

from typing import Callable, Sequence

from outbox_relay.errors import DownstreamUnavailable
from outbox_relay.models import ClaimedMessage, DeliveryResult, ErrorClass, Outcome
from outbox_relay.publishers.base import Deadline, Publisher, RecordResults
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import ClaimResult, Part, RecordResult
from outbox_relay.testing import InMemoryStore, StoredMessage


class FakeStore(InMemoryStore):
    """The shipped in-memory store (`outbox_relay.testing`), with every call logged:
    `claims` (owner, limit), `claim_bytes`, `records`; `steal` holds seqs whose lease
    another holder took (their outcomes are lost); `fail_record` is raised by the next
    outcome writes."""

    def __init__(self, n: int = 0, **row_fields) -> None:
        super().__init__(default_max_attempts=3)
        self.claims: list[tuple[str, int]] = []
        self.claim_bytes: list[int] = []
        self.parts: list[Part | None] = []
        self.records: list[list[Outcome]] = []
        self.steal: set[int] = set()
        self.fail_record: BaseException | None = None
        for _ in range(n):
            self.add(**row_fields)

    def add(self, **fields) -> StoredMessage:
        fields.setdefault("payload_json", '{"n":%d}' % (max(self.rows, default=0) + 1))
        return super().add(**fields)

    def claim(self, owner: str, limit: int, lease_seconds: float, max_bytes: int = 1 << 30,
              part: Part | None = None) -> ClaimResult:
        self.claims.append((owner, limit))
        self.claim_bytes.append(max_bytes)
        self.parts.append(part)
        return super().claim(owner, limit, lease_seconds, max_bytes, part)

    def record(self, owner: str, outcomes: Sequence[Outcome]) -> RecordResult:
        if self.fail_record is not None:
            raise self.fail_record
        self.records.append(list(outcomes))
        for seq in self.steal:
            self.rows[seq].lease_owner = "another holder"
        return super().record(owner, outcomes)

    def status_of(self) -> dict[int, tuple[str, int]]:
        return {seq: (r.status.value, r.attempts) for seq, r in self.rows.items()}


Script = Callable[[ClaimedMessage], DeliveryResult | None]


class FakePublisher(Publisher):
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
