"""One invocation: one loop of claim, publish and outcome write, whatever the
mode (OUTBOX_MODE; docs/design.md, "Invocation modes" and "The pipeline").

`run_invocation` runs `_Loop.run`, which claims a batch (`batch.claim_batch`),
publishes it (`batch.Batch.deliver`) and hands its outcomes to the recorder
(`batch.Batch.record`, then `batch.write_outcomes`). The mode is a parameter of
that loop:

- `batch`: one batch, strictly in sequence: claim, deliver, record, nothing
  claimed ahead. A claim that is not yet the batch (a suspect, or one that only
  moved rows out of their key's way or requeued expired leases) is followed by
  another, as is one waiting on a locked head not yet confirmed (after
  `LOCKED_HEAD_RECHECK_SECONDS`);
- `drain`: batches back to back while each comes back full and time remains;
- `latency`: batches until the deadline; when a claim finds nothing, wait and
  claim again: an eighth of the poll interval first, doubling to the interval
  (and, while idle, up to its maximum), back to the start once a claim finds rows.

Drain and latency pipeline where the publisher allows it (`Publisher.pipelined`;
"The pipeline" in docs/design.md). Three things overlap: the next batch is
claimed (its own thread, its own database connection) while this one is
published (the calling thread), and the previous one's outcomes are written (a
third thread, a second database connection). The rules that make this safe:

- a batch is published only after its claim returned, so after its lease committed;
- outcome writes run one at a time, in order, each fenced on the lease token;
- while a batch is published, at most one earlier batch's writes are still
  running, and each claim takes half the byte budget, so what is in memory and
  what a crash could leave unrecorded stay bounded;
- a batch claimed ahead and never published (the invocation ended, the downstream
  went away) is released with its attempts refunded;
- a claim may take the next messages of a key whose earlier ones are still ours in
  flight; batches are published in order, and `key_turns.KeyTurns` releases those whose
  earlier message was not delivered;
- a suspect (an expired lease, re-claimed alone) is published with nothing else in
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
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from .batch import NO_TIME, Batch, RelayPolicy, claim_batch
from .db import UNREACHABLE_MAX_WAIT, database_unreachable, retry_while_unreachable
from .key_turns import KeyTurns
from .models import ErrorClass, Mode, OrderingOnDead
from .observability import logger as log
from .publishers import base as contract
from .publishers.base import Deadline, Publisher
from .store import LOCKED_HEAD_RECHECK_SECONDS, RecordResult, Store
from .summary import Summary, finish

Write = Callable[[], RecordResult]
#: After a claim that found messages, the first idle wait is the poll interval divided by
#: this, doubling from there: a producer that paused for a moment costs a few quick polls,
#: not a whole interval of lag; a quiet table settles at one poll per interval.
IDLE_RAMP = 8
#: Why a claim claimed nothing: the database could not be reached.
DATABASE_UNREACHABLE = "database unreachable"


def run_invocation(store: Store, publisher: Publisher, policy: RelayPolicy, deadline: Deadline, owner: str, *,
                   on_progress: Callable[[Summary], None] | None = None,
                   sleep: Callable[[float], Any] = time.sleep,
                   may_claim: Callable[[], bool] | None = None) -> Summary:
    """Run one invocation in `policy.mode` and return its summary.

    `on_progress(summary)` is called after every claim in drain and latency modes
    (the invocation flushes its metrics from there); `sleep` waits (tests pass a
    fake); in latency mode, while `may_claim()` is false the invocation waits
    instead of claiming."""
    contract.begin(publisher, deadline)
    return run_loop(store, publisher, policy, deadline, owner, policy.mode, on_progress=on_progress, sleep=sleep,
                    may_claim=may_claim)


def run_loop(store: Store, publisher: Publisher, policy: RelayPolicy, deadline: Deadline, owner: str, mode: Mode, *,
             summary: Summary | None = None, on_progress: Callable[[Summary], None] | None = None,
             sleep: Callable[[float], Any] = time.sleep, may_claim: Callable[[], bool] | None = None) -> Summary:
    """The loop of one invocation in `mode` (whatever `policy.mode` says); counts go
    to `summary` (a new one by default), returned with its duration.

    Raises whatever the store or publisher raise that is not a delivery outcome
    (a bug, the database down outside latency mode), once what was claimed and
    not recorded was released (attempts refunded) where the database still answers."""
    started = time.perf_counter()
    summary = summary or Summary(channel=publisher.channel.value, mode=mode.value, lease_owner=owner)
    loop = _Loop(store, publisher, policy, deadline, owner, summary, mode, sleep=sleep, on_progress=on_progress,
                 may_claim=may_claim)
    try:
        loop.run()
    except BaseException:
        loop.close(quiet=True)
        raise
    loop.close(quiet=False)
    return finish(summary, started)


class _Loop:
    """Claim, publish, record, until the mode says the invocation is done (the
    module's docstring). `run` is the loop; the methods after it are its steps."""

    def __init__(self, store: Store, publisher: Publisher, policy: RelayPolicy, deadline: Deadline, owner: str,
                 summary: Summary, mode: Mode, *, sleep: Callable[[float], Any],
                 on_progress: Callable[[Summary], None] | None, may_claim: Callable[[], bool] | None) -> None:
        self.store, self.publisher, self.policy = store, publisher, policy
        self.deadline, self.owner, self.summary, self.sleep = deadline, owner, summary, sleep
        self.base_owner, self.tokens = owner, 0
        # Batch mode ends once it has its batch; latency mode polls until its deadline.
        self.one_batch, self.polls = mode is Mode.BATCH, mode is Mode.LATENCY
        # Batch mode reports once, at its end (the handler's metrics flush).
        self.on_progress = None if self.one_batch else on_progress
        self.may_claim = may_claim
        # Batch mode records each batch before its next claim, in this thread. Latency
        # mode's writes ride through a lost database while the invocation has time.
        self.records: RecordNow | RecordQueue = RecordNow() if self.one_batch \
            else RecordQueue(deadline if self.polls else None)
        self.unreachable_since: float | None = None
        self.unreachable_wait = 0.0
        ahead = contract.pipelines(publisher)
        # Batch mode claims nothing ahead: its batch, then (if not yet the batch) the next, in sequence.
        ahead = ahead and not self.one_batch
        # Two batches may be in memory at once (one published, one claimed ahead).
        self.max_bytes = max(1, policy.batch_max_bytes // 2) if ahead else policy.batch_max_bytes
        self.claims = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-claim") if ahead else None
        self.next_batch: Future | None = None
        self.idle = self.first_wait = policy.poll_interval_seconds / IDLE_RAMP
        # Batch mode: every earlier write has committed when a claim begins, so no failure
        # of this invocation can hold a key back (decision 0033); nothing to keep.
        self.turns = None if self.one_batch else KeyTurns(
            skip_dead=getattr(store, "ordering_on_dead", OrderingOnDead.SKIP) is OrderingOnDead.SKIP)

    def run(self) -> None:
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
            if not batch.claimed:
                if not self.again_after_nothing(batch):
                    return
                continue
            self.idle = self.first_wait
            # Only a full batch says more is waiting: a claim ahead of a partial one would
            # find nothing and make the loop wait the idle interval. Never ahead of a
            # suspect (its claim may also have requeued leases, and count as full).
            if self.claims is not None and batch.full and not batch.suspect:
                self.next_batch = self.claims.submit(self.claim)
            # A suspect may crash this process: nothing else may be lost with it.
            self.records.wait_until(0 if batch.suspect else 1)
            batch.deliver(self.publisher, self.deadline, self.turns)
            if batch.stopped is not None:
                self.release_ahead("claimed ahead; the batch before it stopped")
                if batch.stopped == "stop_batch" or not self.polls or not self.wait_idle():
                    return
                continue
            if not self.again_after(batch):
                return
            if batch.not_attempted:
                # What a key's failure gave back is due again now: claim it once it is recorded.
                self.records.wait_until(0)

    def claim(self) -> Batch | str:
        try:
            return claim_batch(self.store, self.publisher, self.policy, self.deadline, self.owner, self.summary,
                               self.records, max_bytes=self.max_bytes, turns=self.turns)
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
        if self.one_batch:
            # Not yet the batch. Behind a locked head not yet confirmed, claim again
            # shortly; after moving rows out of their key's way (for good) or
            # requeuing expired leases, at once.
            if batch.waiting_on_a_lock and self.wait_for(LOCKED_HEAD_RECHECK_SECONDS):
                return True
            return batch.scanned > 0 or batch.requeued > 0
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
        if batch.suspect or self.polls:
            return True
        if self.one_batch and not batch.leased:
            # Only dead letters (expired leases with no attempts left): not yet the batch,
            # as after a claim that claimed nothing.
            return batch.scanned > 0 or batch.requeued > 0
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
                batch.release_rest(ErrorClass.NOT_ATTEMPTED, error)

    def close(self, *, quiet: bool) -> None:
        """Release what was claimed ahead and wait for every write. With `quiet`
        (an error is already on its way out) a further failure is logged, not raised."""
        if self.unreachable_since is not None:  # an outage still going on counts until now
            self.summary.database_unreachable_seconds += time.monotonic() - self.unreachable_since
            self.unreachable_since = None
        errors: list[Exception] = []
        try:
            for step in (lambda: self.release_ahead("claimed ahead; not delivered before the deadline"),
                         self.records.close):
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


class RecordNow:
    """Batch mode's outcome writes: each runs at once, in the calling thread, so a
    batch is recorded before the next claim (and a failed write raises there)."""

    def __call__(self, write: Write) -> None:
        write()

    def wait_until(self, pending: int) -> None:
        """Nothing is ever pending."""

    def close(self) -> None:
        """Nothing to wait for."""


class RecordQueue:
    """Outcome writes on a thread of their own, in submission order. A failed
    write is raised in the caller's thread at its next call. With `retry_within`
    (the invocation's deadline), a write that cannot reach the database is tried
    again, backing off up to `UNREACHABLE_MAX_WAIT`, while more than a second is left."""

    def __init__(self, retry_within: Deadline | None = None, sleep: Callable[[float], Any] = time.sleep) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-record")
        self._futures: deque[Future] = deque()
        self._retry_within, self._sleep = retry_within, sleep

    def __call__(self, write: Write) -> None:
        self._reap()
        self._futures.append(self._executor.submit(self._retrying, write) if self._retry_within is not None
                             else self._executor.submit(write))

    def _retrying(self, write: Write) -> RecordResult:
        # Tried again while more than a second of the invocation is left.
        deadline = self._retry_within
        return retry_while_unreachable(write, time_left=lambda: deadline.remaining_ms() / 1000.0, reserve=1.0,
                                       sleep=self._sleep)

    def _reap(self) -> None:
        while self._futures and self._futures[0].done():
            self._futures.popleft().result()

    def wait_until(self, pending: int) -> None:
        """Return once at most `pending` writes are still queued or running."""
        while len(self._futures) > pending:
            self._futures.popleft().result()

    def close(self) -> None:
        try:
            self.wait_until(0)
        finally:
            self._executor.shutdown(wait=True)
