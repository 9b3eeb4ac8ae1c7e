"""Retry delay: capped exponential backoff with full jitter, in seconds::

    ceiling(n) = min(cap, base * 2 ** (n - 1))        n = attempts made, n >= 1
    delay(n)   = max(floor, uniform(0, ceiling(n)))

`floor` keeps a failed message from being retried in the same instant.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True, slots=True)
class Backoff:
    """Full-jitter backoff; `ValueError` for an inconsistent base, cap or floor."""

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
        # The exponent capped: 2 ** 64 already dwarfs any cap.
        return min(self.cap, self.base * (2.0 ** min(max(1, attempts) - 1, 64)))

    def delay(self, attempts: int) -> float:
        return max(self.floor, self.uniform(0.0, self.ceiling(attempts)))
