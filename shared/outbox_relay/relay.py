"""One relay invocation: gate, claim one batch under a lease, deliver, record.

The rules (DESIGN.md): claim nothing when the downstream is down; stop
starting deliveries before the deadline; record outcomes fenced on the lease
token; release with attempts refunded whatever was not the message's fault.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

from .backoff import Backoff
from .errors import DownstreamUnavailable, StopBatch
from .models import ClaimedMessage, DeliveryResult, ErrorClass, Outcome, OutcomeKind, Status
from .publishers.base import Deadline, Publisher
from .store import LeaseStore, RecordResult
from .observability import logger as log



@dataclass(frozen=True, slots=True)
class RelayPolicy:
    """Tunables of one invocation. Times in seconds."""

    batch_size: int
    lease_seconds: float
    backoff: Backoff
    throttle_delay_seconds: float = 2.0
    batch_max_bytes: int = 32 * 1024 * 1024


@dataclass
class Summary:
    """The JSON summary an invocation returns (DESIGN.md, "Interfaces").

    `skipped` says why nothing was claimed (downstream gate closed, no time);
    `stopped` says why a batch was cut short (downstream down mid-batch, our
    account or identity refused). Counts are messages.
    """

    channel: str
    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    lease_lost: int = 0
    throttled: int = 0
    skipped: str | None = None
    gate_closed: bool = False
    stopped: str | None = None
    lease_owner: str | None = None
    duration_ms: float = 0.0
    error_classes: dict[str, int] = field(default_factory=dict)
    #: From the batch's last outcome write (seconds); None when nothing was recorded.
    oldest_pending_age_seconds: float | None = None

    def add(self, r: RecordResult) -> None:
        self.delivered += r.delivered
        self.retried += r.retried
        self.dead += r.dead
        self.released += r.released
        self.lease_lost += r.lease_lost
        if r.oldest_pending_age_seconds is not None:
            self.oldest_pending_age_seconds = r.oldest_pending_age_seconds

    def as_dict(self) -> dict:
        return asdict(self)


def to_outcome(result: DeliveryResult, message: ClaimedMessage, policy: RelayPolicy) -> Outcome:
    """Decide what to record for one delivery result.

    delivered → DELIVERED; permanent → DEAD; transient → RETRY after
    `backoff.delay(attempts)` (dead in SQL once attempts reach the maximum);
    throttled → RELEASE (refund) after `retry_after_seconds` or the throttle
    delay; downstream unavailable, configuration, not attempted → RELEASE (refund).
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
    if cls is ErrorClass.THROTTLED:
        delay = result.retry_after_seconds if result.retry_after_seconds is not None \
            else policy.throttle_delay_seconds
        return Outcome(result.seq, OutcomeKind.RELEASE, cls, result.error, None, delay)
    return Outcome(result.seq, OutcomeKind.RELEASE, cls, result.error, None, result.retry_after_seconds or 0.0)


def run_batch(store: LeaseStore, publisher: Publisher, policy: RelayPolicy, deadline: Deadline,
              owner: str) -> Summary:
    """Run one invocation's batch and return its summary.

    Args:
        store: the lease store of the publisher's channel.
        publisher: delivers messages (Redis Streams, SES).
        policy: batch size, lease (seconds), backoff.
        deadline: remaining time of the invocation.
        owner: the lease token of this invocation (`store.lease_token`).

    Raises whatever the store or publisher raise that is not a delivery
    outcome (a bug, the database down): messages not yet recorded are released
    first (with attempts refunded) when the database still answers.
    """
    started = time.perf_counter()
    summary = Summary(channel=publisher.channel.value, lease_owner=owner)

    reason = publisher.gate()
    if reason is not None:
        summary.skipped = reason
        summary.gate_closed = True
        return _finish(summary, started)
    seconds = min(deadline.seconds_left(), policy.lease_seconds - deadline.margin_seconds)
    limit = publisher.claim_limit(policy.batch_size, seconds)
    if limit <= 0:
        summary.skipped = "not enough time left before the deadline"
        return _finish(summary, started)

    claimed = store.claim(owner, limit, policy.lease_seconds, policy.batch_max_bytes)
    summary.claimed = len(claimed)
    leased = [m for m in claimed if m.status is Status.LEASED]
    dead_on_claim = len(claimed) - len(leased)
    if dead_on_claim:
        summary.dead += dead_on_claim
        summary.error_classes[ErrorClass.LEASE_EXPIRED.value] = dead_on_claim
    by_seq = {m.seq: m for m in leased}
    unrecorded = set(by_seq)

    def record(results: Sequence[DeliveryResult]) -> None:
        outcomes = []
        for r in results:
            if r.seq not in unrecorded:
                continue
            outcomes.append(to_outcome(r, by_seq[r.seq], policy))
            if r.error_class is not None:
                summary.error_classes[r.error_class.value] = summary.error_classes.get(r.error_class.value, 0) + 1
                if r.error_class is ErrorClass.THROTTLED:
                    summary.throttled += 1
        result = store.record(owner, outcomes)
        unrecorded.difference_update(o.seq for o in outcomes)
        summary.add(result)
        if result.lease_lost:
            log.warning("lease lost", extra={"lease_lost": result.lease_lost,
                                             "seqs": list(result.lost_seqs)[:20]})

    release_class, release_error = ErrorClass.NOT_ATTEMPTED, "not attempted before the deadline"
    try:
        if leased and not deadline.passed():
            publisher.deliver(leased, deadline, record)
    except DownstreamUnavailable as exc:
        summary.stopped = "downstream_unavailable"
        release_class, release_error = ErrorClass.DOWNSTREAM_UNAVAILABLE, str(exc)
        log.warning("downstream unavailable mid-batch; releasing", extra={"error_class": type(exc).__name__})
    except StopBatch as exc:
        summary.stopped = "stop_batch"
        release_class, release_error = ErrorClass.CONFIGURATION, str(exc)
        log.error("batch stopped: downstream refused our account or identity",
                  extra={"error_class": type(exc).__name__})
    except Exception as exc:
        release_error = f"not recorded: the relay raised {type(exc).__name__}"
        raise
    finally:
        if unrecorded:
            rest = sorted(unrecorded)
            summary.add(store.release(owner, rest, error_class=release_class, error=release_error))
            summary.error_classes[release_class.value] = summary.error_classes.get(release_class.value, 0) + len(rest)
            unrecorded.clear()
    return _finish(summary, started)


def _finish(summary: Summary, started: float) -> Summary:
    summary.duration_ms = round((time.perf_counter() - started) * 1000.0, 3)
    return summary
