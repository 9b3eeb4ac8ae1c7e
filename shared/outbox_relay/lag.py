"""Delivery lag as a histogram: the time from a message's commit (its
`created_at`, or its later `scheduled_at`) to its recorded delivery, both by
the database clock, in milliseconds.

Buckets grow by `GROWTH` (2%), so every quantile read from the histogram is
within 2% of the true value whatever the count, and an invocation that
delivers millions of messages keeps a few hundred counters, not millions of values.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable

#: Relative width of a bucket: quantiles are within this fraction of the true value.
GROWTH = 1.02
_LOG_GROWTH = math.log(GROWTH)
#: Values CloudWatch takes in one EMF document for one metric.
EMF_MAX_VALUES = 100


def _bucket(ms: int) -> int:
    return 0 if ms <= 0 else 1 + int(math.log(ms) / _LOG_GROWTH)


def _value(bucket: int) -> float:
    """A bucket's representative value (the middle of its range, in ms)."""
    if bucket == 0:
        return 0.0
    low = GROWTH ** (bucket - 1)
    return round(low * (1 + GROWTH) / 2, 3)


class LagHistogram:
    """Counts of lags by bucket, with the exact maximum. Not thread-safe
    (the relay's summary guards it)."""

    __slots__ = ("buckets", "count", "max_ms")

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.max_ms = 0

    def add(self, lags_ms: Iterable[int]) -> None:
        for ms in lags_ms:
            self.buckets[_bucket(ms)] += 1
            self.count += 1
            if ms > self.max_ms:
                self.max_ms = ms

    def quantile(self, q: float) -> float | None:
        """The `q`-quantile (0..1) in ms, None when empty."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return min(_value(bucket), float(self.max_ms))
        return float(self.max_ms)

    def samples(self, n: int = EMF_MAX_VALUES) -> list[float]:
        """At most `n` values standing for the distribution: every message's
        value when there are at most `n`, else `n` evenly spaced quantiles, each
        for an equal share of the messages (what an EMF document can carry)."""
        if not self.count:
            return []
        if self.count <= n:
            out: list[float] = []
            for bucket in sorted(self.buckets):
                out.extend([min(_value(bucket), float(self.max_ms))] * self.buckets[bucket])
            return out
        return [q for q in (self.quantile((i + 0.5) / n) for i in range(n)) if q is not None]

    def summary(self) -> dict[str, float | int | None]:
        """p50, p99 and max in ms, and the count, for the invocation's summary."""
        return {"count": self.count, "p50": self.quantile(0.5), "p99": self.quantile(0.99),
                "max": self.max_ms if self.count else None}
