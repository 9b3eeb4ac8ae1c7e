"""What becomes of a claimed batch's messages: each result turned into an outcome
(`to_outcome`) and written, fenced on the lease token, by the loop's `Recorder`."""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

from .backoff import Backoff
from .db import retry_while_unreachable
from .key_turns import KeyTurns
from .models import ClaimedMessage, DeliveryResult, ErrorClass, Outcome, OutcomeKind, Status
from .observability import logger as log
from .publishers.base import Deadline
from .store import ClaimResult, RecordResult, Store
from .summary import Summary
from .tracing import context_of, trace_id


class Batch:
    """`epoch`: the committed outcome writes when the claim began (`KeyTurns`)."""

    def __init__(self, claim: ClaimResult, limit: int, owner: str, epoch: int | None = None) -> None:
        self.claim, self.limit, self.owner, self.epoch = claim, limit, owner, epoch
        self.leased = [m for m in claim.messages if m.status is Status.LEASED]
        self.by_seq = {m.seq: m for m in self.leased}
        self.unrecorded = set(self.by_seq)
        self.not_attempted = 0
        self.stopped: str | None = None

    @property
    def full(self) -> bool:
        """More may be waiting."""
        c = self.claim
        return c.cut or c.requeued > 0 or max(c.due, c.scanned, len(c.messages)) >= self.limit

    @property
    def moved_from_full(self) -> bool:
        c = self.claim
        return not c.messages and ((c.scanned > 0 and self.full) or c.requeued > 0)

    @property
    def waiting_on_a_lock(self) -> bool:
        """A full window behind locked heads, not yet told from a concurrent claim's: claim again shortly."""
        c = self.claim
        return not c.messages and c.scanned == 0 and self.full and bool(c.unconfirmed)


def to_outcome(result: DeliveryResult, message: ClaimedMessage, backoff: Backoff,
               throttle_delay_seconds: float) -> Outcome:
    """By base.py's contract; any other class is released, refunded."""
    cls = result.error_class
    if cls is None:
        return Outcome.delivered(result.seq, result.delivery_ref)
    if cls is ErrorClass.PERMANENT or cls is ErrorClass.SUPPRESSED:
        return Outcome(result.seq, OutcomeKind.DEAD, cls, result.error)
    if cls is ErrorClass.TRANSIENT:
        delay = result.retry_after_seconds if result.retry_after_seconds is not None \
            else backoff.delay(message.attempts)
        return Outcome(result.seq, OutcomeKind.RETRY, cls, result.error, None, delay)
    if cls is ErrorClass.AMBIGUOUS:
        # Not dead even on its last attempt: SES may have it; the feedback settles it (decision 0047).
        return Outcome(result.seq, OutcomeKind.SETTLE, cls, result.error, None, result.retry_after_seconds or 0.0)
    if cls is ErrorClass.THROTTLED:
        delay = result.retry_after_seconds if result.retry_after_seconds is not None else throttle_delay_seconds
        return Outcome(result.seq, OutcomeKind.RELEASE, cls, result.error, None, delay)
    return Outcome(result.seq, OutcomeKind.RELEASE, cls, result.error, None, result.retry_after_seconds or 0.0)


class Recorder:
    """Outcome writes, one fenced statement each, in order: at once or `queued` on a thread (a failure
    raised at the next call); `retry_within`: retried while the database is unreachable."""

    def __init__(self, store: Store, summary: Summary, backoff: Backoff, throttle_delay_seconds: float,
                 turns: KeyTurns | None, *, queued: bool, retry_within: Deadline | None = None,
                 sleep: Callable[[float], Any] = time.sleep) -> None:
        self.store, self.summary, self.backoff, self.turns = store, summary, backoff, turns
        self.throttle_delay_seconds, self.retry_within, self.sleep = throttle_delay_seconds, retry_within, sleep
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-record") if queued else None
        self.pending: deque[Future] = deque()

    def record(self, batch: Batch, results: Sequence[DeliveryResult]) -> None:
        outcomes, notes = [], []
        for r in results:
            if r.seq not in batch.unrecorded:
                continue
            batch.unrecorded.discard(r.seq)
            message = batch.by_seq[r.seq]
            outcome = to_outcome(r, message, self.backoff, self.throttle_delay_seconds)
            outcomes.append(outcome)
            dead = outcome.kind is OutcomeKind.DEAD or (outcome.kind is OutcomeKind.RETRY
                                                        and message.attempts >= message.max_attempts)
            if dead:
                # Ids only: the error text and the payload may hold personal data.
                log.warning("message dead-lettered", extra={
                    "message_id": message.message_id, "trace_id": trace_id(context_of(message.headers_json)[0]),
                    "error_class": r.error_class.value if r.error_class else None})
            notes.append((message, r.error_class is None, dead))
            if r.error_class is not None:
                self.summary.count_errors(r.error_class)
                if r.error_class is ErrorClass.NOT_ATTEMPTED:
                    batch.not_attempted += 1
        if outcomes:
            self._write(batch.owner, outcomes, notes)

    def release(self, batch: Batch, error_class: ErrorClass, error: str) -> None:
        if not batch.unrecorded:
            return
        rest = sorted(batch.unrecorded)
        batch.unrecorded.clear()
        self.summary.count_errors(error_class, len(rest))
        self._write(batch.owner, [Outcome(s, OutcomeKind.RELEASE, error_class, error) for s in rest],
                    [(batch.by_seq[s], False, False) for s in rest])

    def _write(self, owner: str, outcomes: list[Outcome], notes: list[tuple[ClaimedMessage, bool, bool]]) -> None:
        # The write holds the outcomes, not the batch: no payload waits in memory.
        store, summary, turns = self.store, self.summary, self.turns
        number = turns.next_write() if turns is not None else 0

        def write() -> RecordResult:
            result = store.record(owner, outcomes)
            summary.add(result)
            if result.lease_lost:
                log.warning("lease lost", extra={"lease_lost": result.lease_lost, "seqs": list(result.lost_seqs)[:20]})
            if turns is not None:
                turns.write_committed(number)
            return result

        if turns is not None:
            for message, delivered, dead in notes:
                turns.note(message, delivered, dead, write=number)
        if self.executor is None:
            write()
            return
        self._reap()
        self.pending.append(self.executor.submit(self._retrying, write) if self.retry_within is not None
                            else self.executor.submit(write))

    def _retrying(self, write: Callable[[], RecordResult]) -> RecordResult:
        deadline = self.retry_within
        return retry_while_unreachable(write, time_left=lambda: deadline.remaining_ms() / 1000.0, reserve=1.0,
                                       sleep=self.sleep)

    def _reap(self) -> None:
        while self.pending and self.pending[0].done():
            self.pending.popleft().result()

    def wait_until(self, pending: int) -> None:
        while len(self.pending) > pending:
            self.pending.popleft().result()

    def close(self) -> None:
        try:
            self.wait_until(0)
        finally:
            if self.executor is not None:
                self.executor.shutdown(wait=True)
