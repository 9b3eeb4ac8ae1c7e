"""One batch's concurrent ``SendEmail`` calls, paced below the account's MaxSendRate (recipients per second)
and recorded in small groups (a crash re-sends at most one group and what was in flight); threads only send
and classify, the caller records."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...errors import DownstreamUnavailable, StopBatch
from ...models import ClaimedMessage, DeliveryResult, ErrorClass
from ...observability import logger as log
from ..base import Deadline, RecordResults
from .errors import Verdict, answer_was_lost, classify_exception
from .requests import Prepared, exception_message, redact, redactions

#: The bucket paces at MaxSendRate / (1 + RATE_HEADROOM).
RATE_HEADROOM = 0.03
#: How much of the schedule a late grant may catch up, seconds, so pauses do not lower the rate.
CATCH_UP_SECONDS = 0.25
#: After a "Maximum sending rate exceeded" throttle, no send starts for this long, seconds.
THROTTLE_PAUSE_SECONDS = 1.0
#: Completed sends wait at most this long before being recorded, seconds.
RECORD_INTERVAL_SECONDS = 1.0
KEY_STOPPED = "ses: not sent: an earlier message of its key was not sent in this batch"

Prepare = Callable[[ClaimedMessage], "Prepared | DeliveryResult | None"]


@dataclass(frozen=True, slots=True)
class Attempt:
    seq: int
    verdict: Verdict
    result: DeliveryResult | None = None
    code: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class SendSettings:
    max_concurrency: int
    record_group_size: int
    record_interval_seconds: float
    quota_deferral_seconds: float
    default_sender_address: str | None
    default_configuration_set: str | None
    settle_seconds: float | None = None


class SendRateLimiter:
    """A token bucket (GCRA) at `rate / (1 + headroom)`, guarded by a sliding window that never grants more than
    `rate` within `1 + headroom` seconds, so catching up after a pause never bursts. Thread-safe."""

    def __init__(self, rate_per_second: float, *, headroom: float = RATE_HEADROOM,
                 catch_up: float = CATCH_UP_SECONDS, clock: Callable[[], float] = time.monotonic,
                 share: Callable[[], float] = lambda: 1.0) -> None:
        if rate_per_second <= 0:
            raise ValueError("rate_per_second must be > 0")
        self.full_rate = rate_per_second
        self.headroom = headroom
        self.window = 1.0 + headroom
        self.catch_up = catch_up
        self._clock = clock
        self._share = share
        self._next: float | None = None
        self._granted: deque[tuple[float, int]] = deque()
        self._in_window = 0
        self._lock = threading.Lock()

    @property
    def rate(self) -> float:
        return self.full_rate * min(1.0, max(0.001, self._share()))

    def acquire(self, cost: int = 1, *, seconds_left: Callable[[], float] = lambda: float("inf"),
                wait: Callable[[float], bool] = threading.Event().wait) -> bool:
        """Wait for `cost` recipients; False when the wait would outlast `seconds_left()` or `wait` says stop."""
        cost = max(1, int(cost))
        while True:
            with self._lock:
                now = self._clock()
                rate = self.rate
                while self._granted and self._granted[0][0] <= now - self.window:
                    self._in_window -= self._granted.popleft()[1]
                delay = 0.0 if self._next is None else self._next - now
                if self._granted and self._in_window + cost > rate:
                    delay = max(delay, self._granted[0][0] + self.window - now)
                if delay <= 0:
                    base = now if self._next is None else max(self._next, now - self.catch_up)
                    self._next = base + cost * (1.0 + self.headroom) / rate
                    self._granted.append((now, cost))
                    self._in_window += cost
                    return True
            if delay > seconds_left() or wait(delay):
                return False

    def hold(self, seconds: float) -> None:
        with self._lock:
            self._next = max(self._next or 0.0, self._clock() + seconds)


class SendBatch:
    def __init__(self, client: Any, settings: SendSettings, limiter: SendRateLimiter, deadline: Deadline,
                 record: RecordResults, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.settings = settings
        self.limiter = limiter
        self.deadline = deadline
        self.record = record
        self.clock = clock
        self.stop = threading.Event()
        self.quota_hit = threading.Event()
        self.pending: list[DeliveryResult] = []
        self.first_pending_at: float | None = None
        self.reported: set[int] = set()
        self.failure: Exception | None = None
        self.sent = self.not_started = 0
        self.failed: Counter[str] = Counter()
        self._absorbed: set[Future] = set()
        self._key_of: dict[int, tuple[str, str]] = {}
        self._busy: set[tuple[str, str]] = set()
        self._waiting: dict[tuple[str, str], deque[ClaimedMessage]] = {}
        self._stopped_keys: set[tuple[str, str]] = set()
        self._ready: deque[ClaimedMessage] = deque()

    def add(self, result: DeliveryResult) -> None:
        if not self.pending:
            self.first_pending_at = self.clock()
        self.pending.append(result)
        self.reported.add(result.seq)

    def flush(self, force: bool = False) -> None:
        if not self.pending:
            return
        assert self.first_pending_at is not None
        if force or len(self.pending) >= self.settings.record_group_size \
                or self.clock() - self.first_pending_at >= self.settings.record_interval_seconds \
                or self.deadline.passed():  # inside the margin: record each completion at once
            group = list(self.pending)
            self.pending.clear()
            self.first_pending_at = None
            self.record(group)

    def fail_batch(self, exc: Exception) -> None:
        """Start nothing more; `run()` raises `exc` once what completed is recorded."""
        self.stop.set()
        if self.failure is None:
            self.failure = exc

    def absorb(self, done: set[Future]) -> None:
        for fut in done - self._absorbed:
            self._absorbed.add(fut)
            self._absorb(fut.result())  # the worker never raises

    def _absorb(self, attempt: Attempt) -> None:
        self._key_done(attempt.seq, attempt.verdict is Verdict.DELIVERED)
        if attempt.verdict is Verdict.NOT_STARTED:
            self.not_started += 1
            return
        if attempt.verdict is Verdict.DELIVERED:
            self.sent += 1
        else:
            self.failed[attempt.code or "error"] += 1
        if attempt.verdict in (Verdict.DELIVERED, Verdict.MESSAGE, Verdict.QUOTA):
            assert attempt.result is not None
            self.add(attempt.result)
            if attempt.result.error_class is ErrorClass.THROTTLED and attempt.verdict is Verdict.MESSAGE:
                self.limiter.hold(THROTTLE_PAUSE_SECONDS)
        if attempt.verdict is Verdict.QUOTA and not self.quota_hit.is_set():
            self.quota_hit.set()
            self.stop.set()
            log.warning("ses daily quota exceeded; deferring the rest of the batch")
        elif attempt.verdict in (Verdict.STOP, Verdict.PAUSED) and self.failure is None:
            exc_type = StopBatch if attempt.verdict is Verdict.STOP else DownstreamUnavailable
            self.fail_batch(exc_type(attempt.error or "ses refused the batch"))
            log.error("ses refused our account or configuration; stopping the batch",
                      extra={"error_code": attempt.code, "verdict": attempt.verdict.value})

    def wait_some(self, in_flight: set[Future]) -> set[Future]:
        timeout = self.settings.record_interval_seconds
        if self.pending and self.first_pending_at is not None:
            timeout = max(0.005, self.settings.record_interval_seconds - (self.clock() - self.first_pending_at))
        done, rest = wait(in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
        self.absorb(done)
        self.flush()
        return rest

    def run(self, messages: Sequence[ClaimedMessage], prepare: Prepare) -> None:
        """Any exception leaves only after what completed is recorded."""
        in_flight: set[Future] = set()
        self._ready.extend(messages)
        for m in messages:
            if m.key is not None:
                self._key_of[m.seq] = (m.destination, m.key)
        with ThreadPoolExecutor(max_workers=self.settings.max_concurrency, thread_name_prefix="ses-send") as pool:
            try:
                while self._ready or in_flight:
                    if self.stop.is_set() or self.deadline.passed():
                        break
                    if not self._ready:  # the rest waits for its key's send in flight
                        in_flight = self.wait_some(in_flight)
                        continue
                    m = self._ready.popleft()
                    if not self._take_turn(m):
                        continue
                    prepared = self._prepared(m, prepare)
                    if prepared is None:
                        self.fail_batch(StopBatch("ses: no sender: OUTBOX_SES_FROM is not set and the "
                                                  "message names no 'from'"))
                        break
                    if isinstance(prepared, DeliveryResult):
                        self.failed["Suppressed" if prepared.error_class is ErrorClass.SUPPRESSED
                                    else "InvalidPayload"] += 1
                        self.add(prepared)
                        self._key_done(m.seq, False)
                        self.flush()
                        continue
                    while len(in_flight) >= self.settings.max_concurrency:
                        in_flight = self.wait_some(in_flight)
                    if self.stop.is_set():
                        break
                    in_flight.add(pool.submit(self.send, prepared))
                while in_flight:
                    in_flight = self.wait_some(in_flight)
            except BaseException:
                # Every send in flight ends within the client's timeouts (aws_client.call_timeouts).
                self.stop.set()
                try:
                    done, _ = wait(in_flight)
                    self.absorb(done)
                    self.flush(force=True)
                except Exception as exc:
                    log.exception("could not record completed SES sends after an error",
                                  extra={"error_type": type(exc).__name__})
                raise
            finally:
                self.stop.set()  # whatever happened, start nothing more; the pool waits for calls in flight
        if self.quota_hit.is_set() and self.failure is None:
            for m in messages:
                if m.seq not in self.reported:
                    self.add(DeliveryResult(m.seq, error_class=ErrorClass.THROTTLED,
                                            error="ses: not sent: the daily sending quota is used up",
                                            retry_after_seconds=self.settings.quota_deferral_seconds))
        self.flush(force=True)
        log.info("ses batch done", extra={"sent": self.sent, "failed": dict(self.failed),
                                          "not_started": self.not_started, "rate_used": self.limiter.rate})
        if self.failure is not None:
            raise self.failure

    def _take_turn(self, m: ClaimedMessage) -> bool:
        """Whether `m` may go now; else it waits for its key's send or is reported stopped."""
        k = self._key_of.get(m.seq)
        if k is None:
            return True
        if k in self._stopped_keys:
            self.add(DeliveryResult(m.seq, error_class=ErrorClass.NOT_ATTEMPTED, error=KEY_STOPPED))
            return False
        if k in self._busy:
            self._waiting.setdefault(k, deque()).append(m)
            return False
        self._busy.add(k)
        return True

    def _key_done(self, seq: int, delivered: bool) -> None:
        """`seq`'s send ended: its key's next goes next, or, undelivered, the rest is not attempted."""
        k = self._key_of.get(seq)
        if k is None:
            return
        self._busy.discard(k)
        waiting = self._waiting.pop(k, None)
        if not delivered:
            self._stopped_keys.add(k)
            for m in waiting or ():
                self.add(DeliveryResult(m.seq, error_class=ErrorClass.NOT_ATTEMPTED, error=KEY_STOPPED))
        elif waiting:
            self._ready.appendleft(waiting.popleft())
            if waiting:
                self._waiting[k] = waiting

    @staticmethod
    def _prepared(m: ClaimedMessage, prepare: Prepare) -> Prepared | DeliveryResult | None:
        try:
            return prepare(m)
        except Exception as exc:  # a bug of ours, not the message's content: retry it later
            log.exception("unexpected error preparing an SES send",
                          extra={"message_id": m.message_id, "error_type": type(exc).__name__})
            return DeliveryResult(m.seq, error_class=ErrorClass.TRANSIENT,
                                  error=f"ses: unexpected error preparing the send ({type(exc).__name__})")

    def _settles(self, p: Prepared) -> bool:
        return self.settings.settle_seconds is not None and (
            p.own_configuration_set is None or p.own_configuration_set == self.settings.default_configuration_set)

    def send(self, p: Prepared) -> Attempt:
        """Worker thread: never raises."""
        try:
            if not self.limiter.acquire(p.cost, seconds_left=self.deadline.seconds_left, wait=self.stop.wait):
                return Attempt(p.seq, Verdict.NOT_STARTED)
            if self.stop.is_set() or self.deadline.passed():
                return Attempt(p.seq, Verdict.NOT_STARTED)
            try:
                response = self.client.send_email(**p.request)
            except Exception as exc:  # classified below; nothing escapes a worker
                c, code = classify_exception(
                    exc, own_sender=p.own_sender, own_configuration_set=p.own_configuration_set,
                    default_sender=self.settings.default_sender_address,
                    default_configuration_set=self.settings.default_configuration_set)
                text = f"ses {code}: {redact(exception_message(exc), redactions(p.mailboxes))}"
                retry_after = self.settings.quota_deferral_seconds if c.verdict is Verdict.QUOTA else None
                error_class = c.error_class
                if error_class is ErrorClass.TRANSIENT and self._settles(p) and answer_was_lost(exc):
                    # SES may have it: its event settles it, else it is sent once more after the window.
                    error_class, retry_after = ErrorClass.AMBIGUOUS, self.settings.settle_seconds
                    text = f"ses {code}: the answer was lost; waiting for SES feedback"
                result = DeliveryResult(p.seq, error_class=error_class, error=text, retry_after_seconds=retry_after)
                return Attempt(p.seq, c.verdict, result, code, text)
            return Attempt(p.seq, Verdict.DELIVERED, DeliveryResult(p.seq, delivery_ref=response["MessageId"]))
        except Exception as exc:  # a bug of ours: retry the message later, keep the batch going
            log.exception("unexpected error in an SES send worker", extra={"error_type": type(exc).__name__})
            return Attempt(p.seq, Verdict.MESSAGE,
                           DeliveryResult(p.seq, error_class=ErrorClass.TRANSIENT,
                                          error=f"ses: unexpected error ({type(exc).__name__})"),
                           type(exc).__name__)
