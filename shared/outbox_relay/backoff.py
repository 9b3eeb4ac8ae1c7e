"""Retry delay: capped exponential backoff with full jitter.

The rule is the "Full Jitter" strategy of the AWS Architecture Blog post
"Exponential Backoff And Jitter" (Marc Brooker, 2015)::

    ceiling(n) = min(cap, base * 2 ** (n - 1))        n = attempts made, n >= 1
    delay(n)   = max(floor, uniform(0, ceiling(n)))

All values are seconds (floats). `floor` keeps a failed message from being
retried in the same instant; it never exceeds `cap`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True, slots=True)
class Backoff:
    """Full-jitter exponential backoff. Arguments in seconds.

    Raises `ValueError` when `base <= 0`, `cap < base` or `floor` is outside `[0, cap]`.
    `uniform(a, b)` is injectable so tests can pin the draw.
    """

    base: float = 1.0
    cap: float = 900.0
    floor: float = 0.5
    uniform: Callable[[float, float], float] = field(default=random.uniform, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.base <= 0:
            raise ValueError("backoff base must be > 0 seconds")
        if self.cap < self.base:
            raise ValueError("backoff cap must be >= base")
        if not 0 <= self.floor <= self.cap:
            raise ValueError("backoff floor must be within [0, cap]")

    def ceiling(self, attempts: int) -> float:
        """The un-jittered upper bound for the retry after `attempts` (>= 1) attempts, seconds."""
        n = max(1, attempts)
        # 2 ** 64 already dwarfs any cap; avoid building huge integers.
        exponent = min(n - 1, 64)
        return min(self.cap, self.base * (2.0 ** exponent))

    def delay(self, attempts: int) -> float:
        """Seconds to wait before the next attempt, after `attempts` attempts made."""
        return max(self.floor, self.uniform(0.0, self.ceiling(attempts)))
