"""One relay invocation: check the gate, claim under a lease, deliver, record, until the mode
(OUTBOX_MODE) says done (docs/design.md, "Invocation modes" and "The pipeline").

Drain and latency pipeline where the publisher allows: the next batch is claimed while this one
is delivered and the previous one's outcomes are written. Safe because a batch is delivered
only after its claim committed; writes run one at a time, in order, fenced; at most one earlier
batch's writes run during a delivery and each claim takes half the byte budget (bounded memory
and loss); a batch claimed ahead and not delivered is released, refunded; `KeyTurns` releases a
key's later messages when an earlier one was not delivered; a suspect is delivered with nothing
else in flight; a failed write stops the invocation (its leases expire). Latency mode rides
through a lost database: claims and writes are tried again, backing off, until the deadline.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from .backoff import Backoff
from .db import UNREACHABLE_MAX_WAIT, database_unreachable
from .errors import DownstreamUnavailable, StopBatch
from .key_turns import KeyTurns
from .models import DeliveryResult, ErrorClass, Mode, OrderingOnDead
from .observability import logger as log
from .publishers.base import Deadline, Publisher
from .publishers.registry import spec_for
from .recording import Batch, Recorder
from .store import DEFAULT_BATCH_MAX_BYTES, LOCKED_HEAD_RECHECK_SECONDS, Part, RecordResult, Store
from .summary import Summary
from .tracing import batch_span


@dataclass(frozen=True, slots=True)
class RelayPolicy:
    batch_size: int
    lease_seconds: float
    backoff: Backoff
    throttle_delay_seconds: float = 2.0
    batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES
    mode: Mode = Mode.BATCH
    poll_interval_seconds: float = 0.1
    poll_max_interval_seconds: float = 0.1


#: The first idle wait is the poll interval over this, doubling: a producer's short pause costs a
#: few quick polls, not a whole interval of lag; a quiet table settles at one poll per interval.
IDLE_RAMP = 8
#: A claim of any key that found nothing is not repeated sooner than this many times its own
#: duration, up to the most: behind a deep backlog that other pollers hold, it passes every row to
#: find nothing; the registry gives a dead poller's part to the others within its TTL anyway.
ANYWHERE_BACKOFF, ANYWHERE_BACKOFF_MAX_SECONDS = 10, 30.0
NO_TIME = "not enough time left before the deadline"
DATABASE_UNREACHABLE = "database unreachable"
KEY_HELD = "not attempted: an earlier message of its key was not delivered in this invocation"


class RelayLoop:
    """`run` is the loop, the methods after it its steps. `on_progress(summary)` after every claim
    but in batch mode (metrics flush); while `may_claim()` is false (a handover), it waits."""

    def __init__(self, store: Store, publisher: Publisher, policy: RelayPolicy, deadline: Deadline, owner: str, *,
                 on_progress: Callable[[Summary], None] | None = None, sleep: Callable[[float], Any] = time.sleep,
                 may_claim: Callable[[], bool] | None = None, part: Callable[[], Part | None] | None = None) -> None:
        self.store, self.publisher, self.policy = store, publisher, policy
        self.part, self.anywhere = part, False
        self.anywhere_before = float("inf")  # seconds left when the next claim of any key may be made
        self.deadline, self.owner, self.sleep, self.may_claim = deadline, owner, sleep, may_claim
        self.base_owner, self.tokens = owner, 0
        self.summary = Summary(channel=publisher.channel.value, mode=policy.mode.value, lease_owner=owner)
        self.system = spec_for(publisher.channel).messaging_system
        # Batch mode reports once, at its end, and keeps no turns: every earlier write has committed
        # when a claim begins, so no failure of this invocation can hold a key back (decision 0033).
        self.one_batch, self.polls = policy.mode is Mode.BATCH, policy.mode is Mode.LATENCY
        self.on_progress = None if self.one_batch else on_progress
        self.turns = None if self.one_batch else KeyTurns(skip_dead=store.ordering_on_dead is OrderingOnDead.SKIP)
        # Latency mode's writes ride through a lost database while the invocation has time.
        self.recorder = Recorder(store, self.summary, policy.backoff, policy.throttle_delay_seconds, self.turns,
                                 queued=not self.one_batch, retry_within=deadline if self.polls else None)
        ahead = publisher.pipelined and not self.one_batch
        # Two batches may be in memory at once (one delivered, one claimed ahead).
        self.max_bytes = max(1, policy.batch_max_bytes // 2) if ahead else policy.batch_max_bytes
        self.claims = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-claim") if ahead else None
        self.next_batch: Future | None = None
        self.idle = self.first_wait = policy.poll_interval_seconds / IDLE_RAMP
        self.unreachable_since: float | None = None
        self.unreachable_wait = 0.0

    def run(self) -> Summary:
        """The summary; what is not a delivery outcome is raised once the unrecorded rest was released."""
        started = time.perf_counter()
        self.publisher.begin(self.deadline)
        try:
            self._loop()
        except BaseException:
            self.close(quiet=True)
            raise
        self.close(quiet=False)
        self.summary.duration_ms = round((time.perf_counter() - started) * 1000.0, 3)
        return self.summary

    def _loop(self) -> None:
        summary, go = self.summary, True
        while go:
            if self.next_batch is None and self.may_claim is not None and not self.may_claim():
                go = self.wait_idle()
                continue
            batch = self.next_batch.result() if self.next_batch is not None else self.claim()
            self.next_batch = None
            self.reached(batch)
            if self.on_progress is not None:
                self.on_progress(summary)
            if batch == DATABASE_UNREACHABLE:
                summary.gate_closed = True
                go = self.wait_unreachable()
            elif isinstance(batch, str):  # the gate is closed, or no time is left
                if batch == NO_TIME or not self.polls:
                    if summary.claimed == 0:
                        summary.skipped = batch
                    return
                go = self.wait_idle()
            elif not batch.claim.messages:
                go = self.again_after_nothing(batch)
            else:
                go = self.deliver_next(batch)

    def deliver_next(self, batch: Batch) -> bool:
        """Deliver a batch that claimed messages; whether to claim again."""
        self.idle = self.first_wait
        suspect = batch.claim.suspect
        # Only a full batch says more is waiting: a claim ahead of a partial one would find nothing and
        # wait the idle interval. Never ahead of a suspect (its claim may count as full).
        if self.claims is not None and batch.full and not suspect:
            self.next_batch = self.claims.submit(self.claim)
        # A suspect may crash this process: nothing else may be lost with it.
        self.recorder.wait_until(0 if suspect else 1)
        self.deliver(batch)
        if batch.stopped is not None:
            self.release_ahead("claimed ahead; the batch before it stopped")
            return batch.stopped != "stop_batch" and self.polls and self.wait_idle()
        if not self.again_after(batch):
            return False
        if batch.not_attempted:
            # What a key's failure gave back is due again now: claim it once it is recorded.
            self.recorder.wait_until(0)
        return True

    def claim(self) -> Batch | str:
        """One batch, or why nothing may be claimed (gate closed, no time, database unreachable)."""
        deadline, policy, summary = self.deadline, self.policy, self.summary
        if deadline.seconds_left() <= 0:
            return NO_TIME
        summary.polls += 1
        reason = self.publisher.gate()
        if reason is not None:
            summary.gate_closed = True
            return reason
        seconds = min(deadline.seconds_left(), policy.lease_seconds - deadline.margin_seconds)
        limit = self.publisher.claim_limit(policy.batch_size, seconds)
        if limit <= 0:
            return NO_TIME
        # The writes committed before this claim began: their failures are in its view.
        epoch = self.turns.committed if self.turns is not None else None
        owner, anywhere, started = self.owner, self.anywhere, deadline.seconds_left()
        try:
            part = None if anywhere or self.part is None else self.part()
            claim = self.store.claim(owner, limit, policy.lease_seconds, self.max_bytes, part)
        except Exception as exc:
            if not self.polls or not database_unreachable(exc):
                raise
            # Its answer may be lost after it committed: a new token, so that rows we never saw do not
            # count as ours in flight (a key's later ones would pass them); the registry takes them over.
            self.tokens += 1
            self.owner = f"{self.base_owner}/{self.tokens}"
            return DATABASE_UNREACHABLE
        # Nothing claimable in its part: the next claim, at once, takes any key (a part whose poller
        # died or is busy), the one after it its part again; not soon again after one found nothing.
        left = deadline.seconds_left()
        if anywhere and not claim.messages:
            self.anywhere_before = left - min(ANYWHERE_BACKOFF * (started - left), ANYWHERE_BACKOFF_MAX_SECONDS)
        self.anywhere = part is not None and not claim.messages and left <= self.anywhere_before
        batch = Batch(claim, limit, owner, epoch)
        summary.claimed += len(claim.messages)
        summary.last_claim_found = bool(claim.messages)
        if claim.messages:
            summary.batches += 1
            summary.suspects += claim.suspect
        dead_on_claim = len(claim.messages) - len(batch.leased)
        if dead_on_claim:
            summary.add(RecordResult(dead=dead_on_claim))
            summary.count_errors(ErrorClass.LEASE_EXPIRED, dead_on_claim)
        return batch

    def deliver(self, batch: Batch) -> None:
        """Deliver the leased messages but those held by their key; release what was not recorded."""
        recorder, publisher = self.recorder, self.publisher
        release_class, release_error = ErrorClass.NOT_ATTEMPTED, "not attempted before the deadline"
        try:
            messages = batch.leased
            held = self.turns.held(messages, batch.epoch) if self.turns is not None and messages else None
            if held:
                recorder.record(batch, [DeliveryResult(m.seq, error_class=ErrorClass.NOT_ATTEMPTED, error=KEY_HELD)
                                        for m in messages if m.key is not None and (m.destination, m.key) in held])
                messages = [m for m in messages if m.key is None or (m.destination, m.key) not in held]
            if messages and not self.deadline.passed():
                with batch_span(self.system, messages):
                    publisher.deliver(messages, self.deadline, lambda results: recorder.record(batch, results))
        except DownstreamUnavailable as exc:
            batch.stopped = "downstream_unavailable"
            release_class, release_error = ErrorClass.DOWNSTREAM_UNAVAILABLE, str(exc)
            log.warning("downstream unavailable mid-batch; releasing", extra={"error_class": type(exc).__name__})
        except StopBatch as exc:
            batch.stopped = "stop_batch"
            release_class, release_error = ErrorClass.CONFIGURATION, str(exc)
            log.error("batch stopped: downstream refused our account or identity",
                      extra={"error_class": type(exc).__name__})
        except Exception as exc:
            release_error = f"not recorded: the relay raised {type(exc).__name__}"
            raise
        finally:
            recorder.release(batch, release_class, release_error)
        if batch.stopped:
            self.summary.stopped = batch.stopped

    def reached(self, batch: Batch | str) -> None:
        now = time.monotonic()
        if batch == DATABASE_UNREACHABLE:
            if self.unreachable_since is None:
                self.unreachable_since = now
                log.warning("database unreachable; waiting for it (gate closed)")
            return
        if self.unreachable_since is not None:
            self.summary.database_unreachable_seconds += now - self.unreachable_since
            log.info("database reachable again", extra={"unreachable_seconds": round(now - self.unreachable_since, 3)})
            self.unreachable_since = None
            self.unreachable_wait = 0.0

    def again_after_nothing(self, batch: Batch) -> bool:
        """Whether to claim again (waiting first where that is the rule); False ends the invocation."""
        if self.one_batch:
            # Not yet the batch: shortly behind an unconfirmed locked head; at once after moves or requeues.
            return ((batch.waiting_on_a_lock and self.wait_for(LOCKED_HEAD_RECHECK_SECONDS))
                    or batch.claim.scanned > 0 or batch.claim.requeued > 0)
        # Moved rows leave the window for good, so the next claim scans past them;
        # a full window of rows out of turn alone would only be scanned again.
        if batch.moved_from_full or self.anywhere:
            return True
        if batch.waiting_on_a_lock:
            # Its rows are moved out of the scan once the lock outlasts any claim's.
            return self.wait_for(LOCKED_HEAD_RECHECK_SECONDS)
        return self.polls and self.wait_idle()

    def again_after(self, batch: Batch) -> bool:
        """After a suspect (not yet the batch), in latency mode, or in drain mode after a full batch or
        one that gave messages back untried."""
        claim = batch.claim
        if claim.suspect or self.polls:
            return True
        if self.one_batch and not batch.leased:
            # Only dead letters (expired with no attempts left): not yet the batch.
            return claim.scanned > 0 or claim.requeued > 0
        return not self.one_batch and (batch.full or batch.not_attempted > 0)

    def wait_unreachable(self) -> bool:
        left = self.deadline.seconds_left()
        if left <= 0:
            return False
        self.unreachable_wait = min(max(self.unreachable_wait * 2, 0.05), UNREACHABLE_MAX_WAIT)
        self.sleep(min(self.unreachable_wait, left))
        return True

    def wait_for(self, seconds: float) -> bool:
        if self.deadline.seconds_left() <= seconds:
            return False
        self.sleep(seconds)
        return True

    def wait_idle(self) -> bool:
        left = self.deadline.seconds_left()
        if left <= 0:
            return False
        self.sleep(min(self.idle, left))
        self.idle = min(self.idle * 2, max(self.policy.poll_interval_seconds, self.policy.poll_max_interval_seconds))
        return True

    def release_ahead(self, error: str) -> None:
        future, self.next_batch = self.next_batch, None
        if future is not None:
            batch = future.result()
            if isinstance(batch, Batch):
                self.recorder.release(batch, ErrorClass.NOT_ATTEMPTED, error)

    def close(self, *, quiet: bool) -> None:
        """`quiet`: an error is on its way out already; a further failure is logged, not raised."""
        if self.unreachable_since is not None:  # an outage still going on counts until now
            self.summary.database_unreachable_seconds += time.monotonic() - self.unreachable_since
            self.unreachable_since = None
        errors: list[Exception] = []
        try:
            for step in (lambda: self.release_ahead("claimed ahead; not delivered before the deadline"),
                         self.recorder.close):
                try:
                    step()
                except Exception as exc:
                    errors.append(exc)
        finally:
            if self.claims is not None:
                self.claims.shutdown(wait=True)
        if errors and not quiet:
            raise errors[0]
        for exc in errors:
            log.error("could not release or record after an error", extra={"error_type": type(exc).__name__})
