"""Delivery lag (commit or `scheduled_at` to recorded delivery, database clock, ms) as a
histogram whose buckets grow by `GROWTH`: quantiles within 2%, a few hundred counters."""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable

GROWTH = 1.02
_LOG_GROWTH = math.log(GROWTH)
#: Values CloudWatch takes in one EMF document for one metric.
EMF_MAX_VALUES = 100


def _bucket(ms: int) -> int:
    return 0 if ms <= 0 else 1 + int(math.log(ms) / _LOG_GROWTH)


def _value(bucket: int) -> float:
    return 0.0 if bucket == 0 else round(GROWTH ** (bucket - 1) * (1 + GROWTH) / 2, 3)


class LagHistogram:
    """The summary's lock guards it."""

    __slots__ = ("buckets", "count", "max_ms")

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = self.max_ms = 0

    def add(self, lags_ms: Iterable[int]) -> None:
        for ms in lags_ms:
            self.buckets[_bucket(ms)] += 1
            self.count += 1
            if ms > self.max_ms:
                self.max_ms = ms

    def quantile(self, q: float) -> float | None:
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
        """At most `n` values for an EMF document: each message's, else `n` evenly spaced quantiles."""
        if not self.count:
            return []
        if self.count <= n:
            out: list[float] = []
            for bucket in sorted(self.buckets):
                out.extend([min(_value(bucket), float(self.max_ms))] * self.buckets[bucket])
            return out
        return [q for q in (self.quantile((i + 0.5) / n) for i in range(n)) if q is not None]

    def summary(self) -> dict[str, float | int | None]:
        return {"count": self.count, "p50": self.quantile(0.5), "p99": self.quantile(0.99),
                "max": self.max_ms if self.count else None}
