"""One invocation of the relay, read top to bottom: `RelayLoop.run` checks the
gate, claims a batch under a lease, delivers it, hands every result to the
recorder (`recording.Recorder`), and decides whether to claim again, until the
mode says the invocation is done (OUTBOX_MODE; docs/design.md, "Invocation
modes" and "The pipeline"). The summary is built here.

- `batch`: one batch, strictly in sequence: claim, deliver, record, nothing
  claimed ahead. A claim that is not yet the batch (a suspect, or one that only
  moved rows out of their key's way or requeued expired leases) is followed by
  another, as is one waiting on a locked head not yet confirmed (after
  `LOCKED_HEAD_RECHECK_SECONDS`);
- `drain`: batches back to back while each comes back full and time remains;
- `latency`: batches until the deadline; when a claim finds nothing, wait and
  claim again: an eighth of the poll interval first, doubling to the interval
  (and, while idle, up to its maximum), back to the start once a claim finds rows.

Drain and latency pipeline where the publisher allows it (`Publisher.pipelined`):
the next batch is claimed (its own thread, its own database connection) while
this one is delivered, and the previous one's outcomes are written (the
recorder's thread). The rules that make this safe:

- a batch is delivered only after its claim returned, so after its lease committed;
- outcome writes run one at a time, in order, each fenced on the lease token;
- while a batch is delivered, at most one earlier batch's writes are still
  running, and each claim takes half the byte budget, so what is in memory and
  what a crash could leave unrecorded stay bounded;
- a batch claimed ahead and never delivered (the invocation ended, the downstream
  went away) is released with its attempts refunded;
- a claim may take the next messages of a key whose earlier ones are still ours in
  flight; batches are delivered in order, and `KeyTurns` releases those whose
  earlier message was not delivered;
- a suspect (an expired lease, re-claimed alone) is delivered with nothing else in
  flight: every earlier write done, nothing claimed ahead;
- a write that fails stops the invocation: the error propagates, and what was
  not recorded comes back when its lease expires.

Latency mode rides through a lost database (a failover, a restart): a claim that
cannot reach PostgreSQL counts as a closed gate, and the invocation claims again
after a capped backoff (`UNREACHABLE_MAX_WAIT`) until its deadline; an outcome
write is tried again the same way, for as long as the invocation has time.
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
from .store import DEFAULT_BATCH_MAX_BYTES, LOCKED_HEAD_RECHECK_SECONDS, RecordResult, Store
from .summary import Summary
from .tracing import batch_span


@dataclass(frozen=True, slots=True)
class RelayPolicy:
    """Tunables of one invocation. Times in seconds."""

    batch_size: int
    lease_seconds: float
    backoff: Backoff
    throttle_delay_seconds: float = 2.0
    batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES
    mode: Mode = Mode.BATCH
    poll_interval_seconds: float = 0.1
    poll_max_interval_seconds: float = 0.1


#: After a claim that found messages, the first idle wait is the poll interval divided by
#: this, doubling from there: a producer that paused for a moment costs a few quick polls,
#: not a whole interval of lag; a quiet table settles at one poll per interval.
IDLE_RAMP = 8
#: Why nothing was claimed: the deadline (or the lease) leaves no time for a batch.
NO_TIME = "not enough time left before the deadline"
#: Why a claim claimed nothing: the database could not be reached.
DATABASE_UNREACHABLE = "database unreachable"
#: Why a message was released because an earlier one of its key was not delivered.
KEY_HELD = "not attempted: an earlier message of its key was not delivered in this invocation"


class RelayLoop:
    """Claim, deliver, record, until the mode says the invocation is done (the
    module's docstring). `run` is the loop; the methods after it are its steps.

    `on_progress(summary)` is called after every claim in drain and latency modes
    (the invocation flushes its metrics from there); `sleep` waits (tests pass a
    fake); in latency mode, while `may_claim()` is false the invocation waits
    instead of claiming (a handover's older poller)."""

    def __init__(self, store: Store, publisher: Publisher, policy: RelayPolicy, deadline: Deadline, owner: str, *,
                 on_progress: Callable[[Summary], None] | None = None,
                 sleep: Callable[[float], Any] = time.sleep,
                 may_claim: Callable[[], bool] | None = None) -> None:
        self.store, self.publisher, self.policy = store, publisher, policy
        self.deadline, self.owner, self.sleep, self.may_claim = deadline, owner, sleep, may_claim
        self.base_owner, self.tokens = owner, 0
        self.summary = Summary(channel=publisher.channel.value, mode=policy.mode.value, lease_owner=owner)
        self.system = spec_for(publisher.channel).messaging_system
        # Batch mode ends once it has its batch; latency mode polls until its deadline.
        self.one_batch, self.polls = policy.mode is Mode.BATCH, policy.mode is Mode.LATENCY
        # Batch mode reports once, at its end (the handler's metrics flush).
        self.on_progress = None if self.one_batch else on_progress
        # Batch mode: every earlier write has committed when a claim begins, so no failure
        # of this invocation can hold a key back (decision 0033); nothing to keep.
        self.turns = None if self.one_batch else KeyTurns(
            skip_dead=store.ordering_on_dead is OrderingOnDead.SKIP)
        # Batch mode records each batch before its next claim, in this thread. Latency
        # mode's writes ride through a lost database while the invocation has time.
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
        """Run the invocation and return its summary.

        Raises whatever the store or publisher raise that is not a delivery outcome
        (a bug, the database down outside latency mode), once what was claimed and
        not recorded was released (attempts refunded) where the database still answers."""
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
        summary = self.summary
        while True:
            if self.next_batch is None and self.may_claim is not None and not self.may_claim():
                if not self.wait_idle():
                    return
                continue
            batch = self.next_batch.result() if self.next_batch is not None else self.claim()
            self.next_batch = None
            self.reached(batch)
            if self.on_progress is not None:
                self.on_progress(summary)
            if batch == DATABASE_UNREACHABLE:
                summary.gate_closed = True
                if not self.wait_unreachable():
                    return
                continue
            if isinstance(batch, str):  # the gate is closed, or no time is left
                if batch == NO_TIME or not self.polls:
                    if summary.claimed == 0:
                        summary.skipped = batch
                    return
                if not self.wait_idle():
                    return
                continue
            if not batch.claim.messages:
                if not self.again_after_nothing(batch):
                    return
                continue
            self.idle = self.first_wait
            suspect = batch.claim.suspect
            # Only a full batch says more is waiting: a claim ahead of a partial one would
            # find nothing and make the loop wait the idle interval. Never ahead of a
            # suspect (its claim may also have requeued leases, and count as full).
            if self.claims is not None and batch.full and not suspect:
                self.next_batch = self.claims.submit(self.claim)
            # A suspect may crash this process: nothing else may be lost with it.
            self.recorder.wait_until(0 if suspect else 1)
            self.deliver(batch)
            if batch.stopped is not None:
                self.release_ahead("claimed ahead; the batch before it stopped")
                if batch.stopped == "stop_batch" or not self.polls or not self.wait_idle():
                    return
                continue
            if not self.again_after(batch):
                return
            if batch.not_attempted:
                # What a key's failure gave back is due again now: claim it once it is recorded.
                self.recorder.wait_until(0)

    def claim(self) -> Batch | str:
        """Check the gate and claim one batch; a reason string instead when nothing
        may be claimed (gate closed, no time left before the deadline or the lease,
        the database unreachable in latency mode)."""
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
        owner = self.owner
        try:
            claim = self.store.claim(owner, limit, policy.lease_seconds, self.max_bytes)
        except Exception as exc:
            if not self.polls or not database_unreachable(exc):
                raise
            # The claim may have committed and its answer been lost: rows leased under
            # this token that we never saw. Claim under a new token from now on, so
            # that those do not count as ours in flight (a key's later messages would
            # pass them); the registry takes them over under the invocation's token.
            self.tokens += 1
            self.owner = f"{self.base_owner}/{self.tokens}"
            return DATABASE_UNREACHABLE
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
        """Deliver the batch's leased messages, then release what was not recorded.

        Messages of a key with an earlier message this invocation did not deliver
        are released first. Downstream unavailable and StopBatch end the batch
        (`batch.stopped`); any other exception propagates after the rest was
        released (when the store answers)."""
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
        """Note whether the database answered this claim: the time it did not is counted."""
        now = time.monotonic()
        if batch == DATABASE_UNREACHABLE:
            if self.unreachable_since is None:
                self.unreachable_since = now
                log.warning("database unreachable; waiting for it (gate closed)")
            return
        if self.unreachable_since is not None:
            self.summary.database_unreachable_seconds += now - self.unreachable_since
            log.info("database reachable again",
                     extra={"unreachable_seconds": round(now - self.unreachable_since, 3)})
            self.unreachable_since = None
            self.unreachable_wait = 0.0

    def again_after_nothing(self, batch: Batch) -> bool:
        """Whether to claim again after a claim that claimed nothing (waiting first
        where that is the rule); False ends the invocation."""
        claim = batch.claim
        if self.one_batch:
            # Not yet the batch. Behind a locked head not yet confirmed, claim again
            # shortly; after moving rows out of their key's way (for good) or
            # requeuing expired leases, at once.
            if batch.waiting_on_a_lock and self.wait_for(LOCKED_HEAD_RECHECK_SECONDS):
                return True
            return claim.scanned > 0 or claim.requeued > 0
        # Moved rows leave the window for good, so the next claim scans past them;
        # a full window of rows out of turn alone would only be scanned again.
        if batch.moved_from_full:
            return True
        if batch.waiting_on_a_lock:
            # Its rows are moved out of the scan once the lock outlasts any claim's.
            return self.wait_for(LOCKED_HEAD_RECHECK_SECONDS)
        return self.polls and self.wait_idle()

    def again_after(self, batch: Batch) -> bool:
        """Whether to claim again after a batch that was delivered: after a suspect (not
        yet the batch), in latency mode until the deadline, in drain mode after a full
        batch or one that gave messages back untried (due again now)."""
        claim = batch.claim
        if claim.suspect or self.polls:
            return True
        if self.one_batch and not batch.leased:
            # Only dead letters (expired leases with no attempts left): not yet the batch,
            # as after a claim that claimed nothing.
            return claim.scanned > 0 or claim.requeued > 0
        return not self.one_batch and (batch.full or batch.not_attempted > 0)

    def wait_unreachable(self) -> bool:
        """Back off before the next try (doubling up to `UNREACHABLE_MAX_WAIT`, never
        past the deadline); False when no time is left."""
        left = self.deadline.seconds_left()
        if left <= 0:
            return False
        self.unreachable_wait = min(max(self.unreachable_wait * 2, 0.05), UNREACHABLE_MAX_WAIT)
        self.sleep(min(self.unreachable_wait, left))
        return True

    def wait_for(self, seconds: float) -> bool:
        """Sleep `seconds` if the deadline leaves them; False (no sleep) when it does not."""
        if self.deadline.seconds_left() <= seconds:
            return False
        self.sleep(seconds)
        return True

    def wait_idle(self) -> bool:
        """Sleep the idle wait (never past the deadline), then double it up to the
        poll interval and, while idle, to its maximum; False when no time is left."""
        left = self.deadline.seconds_left()
        if left <= 0:
            return False
        self.sleep(min(self.idle, left))
        self.idle = min(self.idle * 2, max(self.policy.poll_interval_seconds, self.policy.poll_max_interval_seconds))
        return True

    def release_ahead(self, error: str) -> None:
        """Give back a batch claimed ahead and not delivered, attempts refunded."""
        future, self.next_batch = self.next_batch, None
        if future is not None:
            batch = future.result()
            if isinstance(batch, Batch):
                self.recorder.release(batch, ErrorClass.NOT_ATTEMPTED, error)

    def close(self, *, quiet: bool) -> None:
        """Release what was claimed ahead and wait for every write. With `quiet`
        (an error is already on its way out) a further failure is logged, not raised."""
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
