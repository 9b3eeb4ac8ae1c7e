"""Pacing SES sends below the account's MaxSendRate, which counts recipients
per second ("Service quotas in Amazon SES")."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

#: The bucket paces at MaxSendRate / (1 + RATE_HEADROOM), so N grants span 1.03 s.
RATE_HEADROOM = 0.03
#: A late grant (a garbage-collection pause, a busy interpreter) may catch up this much of the
#: schedule, seconds, so pauses do not lower the average rate (the window still caps every 1.03 s).
CATCH_UP_SECONDS = 0.25


class SendRateLimiter:
    """Paces sends below `rate_per_second` (recipients per second): a token bucket
    of one token refilled at `rate_per_second / (1 + headroom)` (in the "generic
    cell rate algorithm" form: one timestamp, no timer thread), guarded by a
    sliding window that never grants more than `rate_per_second` tokens within
    `1 + headroom` seconds.

    `acquire(cost)` blocks until both allow a send *now*, then records the grant
    at the current clock, under a lock (grants are just in time: a thread that
    wakes late sends late and never makes the next one early). A grant that comes
    late (a garbage-collection pause, a busy interpreter) may catch up to
    `catch_up` seconds of the schedule, so pauses do not lower the average rate;
    the window keeps the catch-up from ever putting more than `rate_per_second`
    grants into 1.03 s. So no one-second window holds more than MaxSendRate
    sends unless the time from grant to request varies by more than 30 ms.
    A send costing more than the whole budget (an email with more recipients
    than the rate) waits for an empty window and goes alone. Thread-safe. Times
    are seconds of `clock`.

    `share()` (0..1, default 1) scales the rate at each grant, for an invocation
    that shares the account's rate with an overlapping one; the grants already
    made stay in the window, so a lower share waits for them to age out.
    """

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
        """Recipients per second allowed now (the full rate times the share)."""
        return self.full_rate * min(1.0, max(0.001, self._share()))

    @property
    def interval(self) -> float:
        return (1.0 + self.headroom) / self.rate

    @property
    def effective_rate(self) -> float:
        """Grants per second at most (single-cost)."""
        return 1.0 / self.interval

    def acquire(self, cost: int = 1, *, seconds_left: Callable[[], float] = lambda: float("inf"),
                wait: Callable[[float], bool] = threading.Event().wait) -> bool:
        """Wait for a send of `cost` tokens (recipients). Returns False without a grant
        when the wait would outlast `seconds_left()` or `wait(seconds)` returns True
        (pass a stop event's `wait` to be woken when the batch stops)."""
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
        """Grant nothing for `seconds` from now (after a throttle)."""
        with self._lock:
            self._next = max(self._next or 0.0, self._clock() + seconds)
