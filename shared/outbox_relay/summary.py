"""What one invocation reports: its summary and the counts that become metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from .lag import LagHistogram
from .models import ErrorClass, Mode
from .store import RecordResult


@dataclass
class Summary:
    """An invocation's JSON summary (docs/design.md, "Interfaces"); outcome writes add to it from another thread."""

    channel: str
    mode: str = Mode.BATCH.value
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
    batches: int = 0
    polls: int = 0
    suspects: int = 0
    database_unreachable_seconds: float = 0.0
    last_claim_found: bool | None = field(default=None, repr=False)
    error_classes: dict[str, int] = field(default_factory=dict)
    oldest_pending_age_seconds: float | None = None
    # This invocation's delivery lag, and since the metrics last took it.
    lag: LagHistogram = field(default_factory=LagHistogram, repr=False)
    _window_lag: LagHistogram = field(default_factory=LagHistogram, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, r: RecordResult) -> None:
        with self._lock:
            self.delivered += r.delivered
            self.retried += r.retried
            self.dead += r.dead
            self.released += r.released
            self.lease_lost += r.lease_lost
            if r.lags_ms:
                self.lag.add(r.lags_ms)
                self._window_lag.add(r.lags_ms)
            if r.oldest_pending_age_seconds is not None:
                self.oldest_pending_age_seconds = r.oldest_pending_age_seconds

    def count_errors(self, error_class: ErrorClass, n: int = 1) -> None:
        with self._lock:
            self.error_classes[error_class.value] = self.error_classes.get(error_class.value, 0) + n
            if error_class is ErrorClass.THROTTLED:
                self.throttled += n

    def take_window_lag(self) -> LagHistogram:
        with self._lock:
            window, self._window_lag = self._window_lag, LagHistogram()
            return window

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {k: getattr(self, k) for k in COUNTERS}

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in vars(self).items()
                   if not k.startswith("_") and k not in ("lag", "last_claim_found")}
            out["delivery_lag_ms"] = self.lag.summary()
            return out


#: The Summary fields that count messages (summed over batches, emitted as metrics).
COUNTERS = ("claimed", "delivered", "retried", "dead", "released", "lease_lost", "throttled")

