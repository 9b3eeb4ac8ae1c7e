"""The publisher contract, written down once (docs/channels.md points here).

Per invocation the relay calls `begin(deadline)`, then per batch `gate()`, `claim_limit(...)` and,
when something was claimed, `deliver(messages, deadline, record)`; it reads `counters` at the end.

Must:
- `channel`: the `Channel` whose rows it delivers.
- `gate()`: a cheap check of the downstream: None, or a short reason (no personal data) and nothing
  is claimed (GateClosed); "downstream unavailable", not "bad message".
- `claim_limit(batch_size, seconds_available)`: at most `batch_size`, 0 when nothing can start in time.
- `deliver(messages, deadline, record)`: call `record(results)` with one `DeliveryResult` per finished
  message as they complete (one call is one outcome statement; each message at most once). The
  message id travels as the consumer's dedupe key.

May (defaults in `Publisher`):
- `pipelined` (False): the relay may claim the next batch during delivery.
- `begin(deadline)`: reset per-invocation state (rate limiters, gates, counters).
- `counters`: this invocation's counts by metric name (declared in `observability.METRIC_UNITS` and
  the channel's spec), also in the summary's `downstream`.
- `rate_shared` and `share_rate(share)`: one rate for the whole channel (SES), each poller its part.

Outcomes (`recording.to_outcome` turns them into writes):
- delivered: `DeliveryResult.delivered(seq, ref)`.
- `TRANSIENT`: retried after the backoff or `retry_after_seconds`; dead at the maximum attempts.
- `PERMANENT`: dead letter now.
- `THROTTLED`: refunded, deferred by `retry_after_seconds` or OUTBOX_THROTTLE_DELAY_SECONDS.
- the whole downstream unavailable: raise `errors.DownstreamUnavailable` after recording what
  completed (or `DOWNSTREAM_UNAVAILABLE` for one message); refunded.
- the downstream refuses us (account, identity, configuration): raise `errors.StopBatch`.
- not attempted: leave it out of `record` (or `NOT_ATTEMPTED`); released, refunded.

Deadline rule: no delivery starts once `deadline.seconds_left()` <= 0, and every delivery started ends
within OUTBOX_DEADLINE_MARGIN_SECONDS (by the client's timeouts), so its result is recorded in time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, ClassVar, Mapping, Sequence

from ..models import ClaimedMessage, DeliveryResult

RecordResults = Callable[[Sequence[DeliveryResult]], None]

_NO_COUNTERS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Deadline:
    """Time left by the Lambda's clock, less `margin_seconds` kept to record outcomes and release the rest."""

    remaining_ms: Callable[[], int]
    margin_seconds: float

    def seconds_left(self) -> float:
        return self.remaining_ms() / 1000.0 - self.margin_seconds

    def passed(self) -> bool:
        return self.seconds_left() <= 0


class Publisher(ABC):
    """A channel's delivery side; the contract is the module's docstring."""

    channel: ClassVar[str]  # its `registry.Channel` member (a str)
    pipelined: ClassVar[bool] = False
    rate_shared: ClassVar[bool] = False

    @property
    def counters(self) -> Mapping[str, int]:
        return _NO_COUNTERS

    def begin(self, deadline: Deadline) -> None:
        pass

    def share_rate(self, share: Callable[[], float]) -> None:
        """`share()` is this poller's part of the channel's rate (0..1)."""

    @abstractmethod
    def gate(self) -> str | None: ...

    @abstractmethod
    def claim_limit(self, batch_size: int, seconds_available: float) -> int: ...

    @abstractmethod
    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None: ...
