"""Pacing SES sends below the account's MaxSendRate (recipients per second)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

#: The bucket paces at MaxSendRate / (1 + RATE_HEADROOM).
RATE_HEADROOM = 0.03
#: How much of the schedule a late grant may catch up, seconds, so pauses do not lower the rate.
CATCH_UP_SECONDS = 0.25


class SendRateLimiter:
    """A token bucket refilled at `rate / (1 + headroom)` (GCRA: one timestamp, no timer thread), guarded
    by a sliding window that never grants more than `rate` within `1 + headroom` seconds, so catching up
    after a pause never bursts. `share()` (0..1) scales the rate at each grant. Thread-safe."""

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
