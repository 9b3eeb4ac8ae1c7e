"""One batch of an invocation, in the order it happens: the claim under a lease
(`claim_batch`, after the gate), the publish (`Batch.deliver`), and the outcome
write (`Batch.record`, `to_outcome`, `write_outcomes`); docs/design.md,
"Message lifecycle". The invocation's loop (`modes`) runs one or more.

Every batch keeps the same rules: the gate before its claim; nothing started
after the deadline; outcomes fenced on the lease token; whatever was not the
message's fault released with its attempt refunded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .backoff import Backoff
from .errors import DownstreamUnavailable, StopBatch
from .key_turns import KeyTurns
from .models import ClaimedMessage, DeliveryResult, ErrorClass, Mode, Outcome, OutcomeKind, Status
from .observability import logger as log
from .publishers.base import Deadline, Publisher
from .store import RecordResult, Store
from .summary import Summary
from .tracing import batch_span, context_of, trace_id


@dataclass(frozen=True, slots=True)
class RelayPolicy:
    """Tunables of one invocation. Times in seconds."""

    batch_size: int
    lease_seconds: float
    backoff: Backoff
    throttle_delay_seconds: float = 2.0
    batch_max_bytes: int = 32 * 1024 * 1024
    mode: Mode = Mode.BATCH
    poll_interval_seconds: float = 0.1
    poll_max_interval_seconds: float = 0.1


#: A recorder runs outcome writes: call it with a function of no argument; it
#: returns when the write is done (batch mode) or queued (drain, latency).
Recorder = Callable[[Callable[[], RecordResult]], None]
#: Why nothing was claimed: the deadline (or the lease) leaves no time for a batch.
NO_TIME = "not enough time left before the deadline"


def claim_batch(store: Store, publisher: Publisher, policy: RelayPolicy, deadline: Deadline, owner: str,
                summary: Summary, recorder: Recorder, *, max_bytes: int | None = None,
                turns: KeyTurns | None = None) -> Batch | str:
    """Check the gate and claim one batch; a reason string instead when nothing
    may be claimed (gate closed, no time left before the deadline or the lease).
    With `turns`, the batch keeps the writes committed before its claim began."""
    if deadline.seconds_left() <= 0:
        return NO_TIME
    summary.polls += 1
    reason = publisher.gate()
    if reason is not None:
        summary.gate_closed = True
        return reason
    seconds = min(deadline.seconds_left(), policy.lease_seconds - deadline.margin_seconds)
    limit = publisher.claim_limit(policy.batch_size, seconds)
    if limit <= 0:
        return NO_TIME
    epoch = turns.committed if turns is not None else None
    claimed = store.claim(owner, limit, policy.lease_seconds,
                          policy.batch_max_bytes if max_bytes is None else max_bytes)
    summary.claimed += len(claimed)
    summary.last_claim_found = bool(claimed)
    if claimed:
        summary.batches += 1
        if getattr(claimed, "suspect", False):
            summary.suspects += 1
    return Batch(claimed, limit, store=store, owner=owner, policy=policy, summary=summary, recorder=recorder,
                 epoch=epoch)


#: Why a message was released because an earlier one of its key was not delivered.
KEY_HELD = "not attempted: an earlier message of its key was not delivered in this invocation"


class Batch:
    """One claimed batch: which of its messages are not recorded yet, and how
    their outcomes reach the store (through `recorder`).

    `full` says more may be waiting (the claim's scan reached its limit, or the
    byte budget left claimable rows behind);
    `suspect` that it is one expired lease re-claimed alone (see `store.Claim`);
    `not_attempted` counts messages the publisher gave back untried (their key
    stopped at an earlier failure): they are due again at once; `epoch` is the
    invocation's committed outcome writes when the claim began (`KeyTurns`)."""

    def __init__(self, claimed: Sequence[ClaimedMessage], limit: int, *, store: Store, owner: str,
                 policy: RelayPolicy, summary: Summary, recorder: Recorder, epoch: int | None = None) -> None:
        self.claimed = claimed
        self.limit = limit
        self.epoch = epoch
        self.scanned = getattr(claimed, "scanned", len(claimed))
        self.due = getattr(claimed, "due", len(claimed))
        self.cut = bool(getattr(claimed, "cut", False))
        self.requeued = int(getattr(claimed, "requeued", 0))
        self.suspect = bool(getattr(claimed, "suspect", False))
        self.unconfirmed = tuple(getattr(claimed, "unconfirmed", ()))
        self.leased = [m for m in claimed if m.status is Status.LEASED]
        self._turns: KeyTurns | None = None
        self.not_attempted = 0
        self.bytes = sum(len(m.payload_json) for m in self.leased)
        self._by_seq = {m.seq: m for m in self.leased}
        self._unrecorded = set(self._by_seq)
        self._store, self._owner, self._policy = store, owner, policy
        self._summary, self._recorder = summary, recorder
        self.stopped: str | None = None
        dead_on_claim = len(claimed) - len(self.leased)
        if dead_on_claim:
            summary.add(RecordResult(dead=dead_on_claim))
            summary.count_errors(ErrorClass.LEASE_EXPIRED, dead_on_claim)

    @property
    def full(self) -> bool:
        """More may be waiting: the scan reached the limit, the byte budget cut the batch,
        or the claim requeued expired leases."""
        return self.cut or self.requeued > 0 or max(self.due, self.scanned, len(self.claimed)) >= self.limit

    @property
    def moved_from_full(self) -> bool:
        """It claimed nothing but moved held-back rows out of a full window, or put
        expired leases back in the queue: the next claim finds something new."""
        return not self.claimed and ((self.scanned > 0 and self.full) or self.requeued > 0)

    @property
    def waiting_on_a_lock(self) -> bool:
        """It claimed and moved nothing, its window full of rows behind keys' first
        messages that another transaction holds locked, not yet for long enough to
        tell from a concurrent claim: claim again shortly (`LOCKED_HEAD_RECHECK_SECONDS`);
        once the lock has lasted `LOCKED_HEAD_CONFIRM_SECONDS`, a claim moves them."""
        return not self.claimed and self.scanned == 0 and self.full and bool(self.unconfirmed)

    def record(self, results: Sequence[DeliveryResult]) -> None:
        """The publisher's callback: record these results (one outcome write)."""
        outcomes, notes = [], []
        turns = self._turns
        for r in results:
            if r.seq not in self._unrecorded:
                continue
            self._unrecorded.discard(r.seq)
            message = self._by_seq[r.seq]
            outcome = to_outcome(r, message, self._policy)
            outcomes.append(outcome)
            dead = outcome.kind is OutcomeKind.DEAD or (outcome.kind is OutcomeKind.RETRY
                                                        and message.attempts >= message.max_attempts)
            if dead:
                # Ids only: the error text and the payload may hold personal data.
                log.warning("message dead-lettered", extra={
                    "message_id": message.message_id, "trace_id": trace_id(context_of(message.headers_json)[0]),
                    "error_class": r.error_class.value if r.error_class else None})
            if turns is not None:
                notes.append((message, r.error_class is None, dead))
            if r.error_class is not None:
                self._summary.count_errors(r.error_class)
                if r.error_class is ErrorClass.NOT_ATTEMPTED:
                    self.not_attempted += 1
        if outcomes:
            write = self._submit(outcomes)
            for message, delivered, dead in notes:
                turns.note(message, delivered, dead, write=write)

    def release_rest(self, error_class: ErrorClass, error: str) -> None:
        """Give back every message not recorded yet, attempts refunded."""
        if not self._unrecorded:
            return
        rest = sorted(self._unrecorded)
        self._unrecorded.clear()
        self._summary.count_errors(error_class, len(rest))
        write = self._submit([Outcome(s, OutcomeKind.RELEASE, error_class, error) for s in rest])
        if self._turns is not None:
            for seq in rest:
                self._turns.note(self._by_seq[seq], False, write=write)

    def _submit(self, outcomes: list[Outcome]) -> int:
        """Hand one outcome write to the recorder; its number in `KeyTurns` (0 without)."""
        # The write holds the outcomes only, not the batch: a batch waiting for its
        # write keeps no payload in memory.
        store, owner, summary, turns = self._store, self._owner, self._summary, self._turns
        if turns is None:
            self._recorder(lambda: write_outcomes(store, owner, summary, outcomes))
            return 0
        number = turns.next_write()

        def write() -> RecordResult:
            result = write_outcomes(store, owner, summary, outcomes)
            turns.write_committed(number)
            return result

        self._recorder(write)
        return number

    def deliver(self, publisher: Publisher, deadline: Deadline, turns: KeyTurns | None = None) -> None:
        """Deliver the leased messages, then release what was not recorded.

        With `turns` (the invocation's earlier batches), messages of a key with an
        earlier message not delivered are released first, and what this batch
        does not deliver is noted there. Downstream unavailable and StopBatch end
        this batch (`stopped`); any other exception propagates after the rest was
        released (when the store answers)."""
        release_class, release_error = ErrorClass.NOT_ATTEMPTED, "not attempted before the deadline"
        self._turns = turns
        try:
            messages = self.leased
            held = turns.held(messages, self.epoch) if turns is not None and messages else None
            if held:
                self.record([DeliveryResult(m.seq, error_class=ErrorClass.NOT_ATTEMPTED, error=KEY_HELD)
                             for m in messages if m.key is not None and (m.destination, m.key) in held])
                messages = [m for m in messages if m.key is None or (m.destination, m.key) not in held]
            if messages and not deadline.passed():
                with batch_span(publisher.channel.value, messages):
                    publisher.deliver(messages, deadline, self.record)
        except DownstreamUnavailable as exc:
            self.stopped = "downstream_unavailable"
            release_class, release_error = ErrorClass.DOWNSTREAM_UNAVAILABLE, str(exc)
            log.warning("downstream unavailable mid-batch; releasing", extra={"error_class": type(exc).__name__})
        except StopBatch as exc:
            self.stopped = "stop_batch"
            release_class, release_error = ErrorClass.CONFIGURATION, str(exc)
            log.error("batch stopped: downstream refused our account or identity",
                      extra={"error_class": type(exc).__name__})
        except Exception as exc:
            release_error = f"not recorded: the relay raised {type(exc).__name__}"
            raise
        finally:
            self.release_rest(release_class, release_error)
        if self.stopped:
            self._summary.stopped = self.stopped


def to_outcome(result: DeliveryResult, message: ClaimedMessage, policy: RelayPolicy) -> Outcome:
    """Decide what to record for one delivery result.

    delivered → DELIVERED; permanent → DEAD; transient → RETRY after
    `backoff.delay(attempts)` (dead in SQL once attempts reach the maximum);
    throttled → RELEASE (refund) after `retry_after_seconds` or the throttle
    delay; suppressed → DEAD; ambiguous → SETTLE (pending after the settle
    window in `retry_after_seconds`, attempt kept); downstream unavailable, configuration, not attempted → RELEASE (refund).
    """
    cls = result.error_class
    if cls is None:
        return Outcome.delivered(result.seq, result.delivery_ref)
    if cls is ErrorClass.PERMANENT:
        return Outcome(result.seq, OutcomeKind.DEAD, cls, result.error)
    if cls is ErrorClass.TRANSIENT:
        delay = result.retry_after_seconds if result.retry_after_seconds is not None \
            else policy.backoff.delay(message.attempts)
        return Outcome(result.seq, OutcomeKind.RETRY, cls, result.error, None, delay)
    if cls is ErrorClass.SUPPRESSED:
        return Outcome(result.seq, OutcomeKind.DEAD, cls, result.error)
    if cls is ErrorClass.AMBIGUOUS:
        # Not dead even on its last attempt: SES may have it; the feedback settles it (decision 0047).
        return Outcome(result.seq, OutcomeKind.SETTLE, cls, result.error, None, result.retry_after_seconds or 0.0)
    if cls is ErrorClass.THROTTLED:
        delay = result.retry_after_seconds if result.retry_after_seconds is not None \
            else policy.throttle_delay_seconds
        return Outcome(result.seq, OutcomeKind.RELEASE, cls, result.error, None, delay)
    return Outcome(result.seq, OutcomeKind.RELEASE, cls, result.error, None, result.retry_after_seconds or 0.0)


def write_outcomes(store: Store, owner: str, summary: Summary, outcomes: list[Outcome]) -> RecordResult:
    """One outcome write, added to the summary; a lost lease is logged."""
    result = store.record(owner, outcomes)
    summary.add(result)
    if result.lease_lost:
        log.warning("lease lost", extra={"lease_lost": result.lease_lost, "seqs": list(result.lost_seqs)[:20]})
    return result
