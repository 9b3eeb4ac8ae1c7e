"""The publisher contract: what every channel's publisher must do and may do.

This docstring is the one place the contract is written down; docs/channels.md
points here.

A publisher is a channel's delivery side. The relay drives it, per invocation:
`begin(deadline)` once, then for each batch `gate()`, `claim_limit(...)`, and,
when something was claimed, `deliver(messages, deadline, record)`. Its
`counters` are read (and emitted as metrics) at the end of the invocation.

Must:
- `channel`: the `Channel` it delivers; its rows are the ones claimed.
- `gate()`: a cheap check of the downstream before claiming. None when it can
  take messages; else a short reason (no personal data) and nothing is claimed
  (metric GateClosed). It tells "downstream unavailable" from "this message is bad".
- `claim_limit(batch_size, seconds_available)`: how many messages to claim,
  at most `batch_size`, 0 when nothing can start in the time left.
- `deliver(messages, deadline, record)`: deliver and call `record(results)`
  with one `DeliveryResult` per message it finished, as they complete (one
  `record` call is one outcome statement; several are allowed, each message at
  most once). The message id (`ClaimedMessage.message_id`) travels with the
  message as the consumer's dedupe key.

May (the defaults, in `Publisher`, apply to a publisher that leaves them out):
- `pipelined` (default False): True lets the relay claim the next batch while
  this one is delivered (drain and latency modes). A publisher paced by a rate
  gains nothing by it.
- `begin(deadline)` (default: nothing): a new invocation starts; reset
  per-invocation state (rate limiters, cached gates, counters).
- `counters` (default: none): this invocation's own counts, by metric name
  (each name declared in `observability.METRIC_UNITS` and the channel's spec),
  emitted as metrics and listed under `downstream` in the summary.
- `rate_shared` (default False) and `share_rate(share)`: a publisher paced by
  one rate for the whole channel (SES) takes its part of it from the handover.

Outcome classes, and how each is reported (`recording.to_outcome` turns them into
what is written):
- delivered: `DeliveryResult.delivered(seq, ref)`; `ref` says where it landed.
- transient (network, 5xx, timeouts): a result with `ErrorClass.TRANSIENT`;
  retried after the backoff, or after `retry_after_seconds` when given;
  dead-lettered once attempts reach the maximum.
- permanent (the message's fault): `ErrorClass.PERMANENT`; dead letter now.
- throttled (slow down): `ErrorClass.THROTTLED`; attempt refunded, deferred by
  `retry_after_seconds` or OUTBOX_THROTTLE_DELAY_SECONDS.
- downstream unavailable: raise `errors.DownstreamUnavailable` (the whole
  downstream, not one message) after recording what completed, or report
  `ErrorClass.DOWNSTREAM_UNAVAILABLE` for one message; refunded.
- the downstream refuses us (account, identity, configuration): raise
  `errors.StopBatch`; the rest is released, refunded.
- not attempted: leave the message out of every `record` call (the deadline
  came, the batch stopped); the relay releases it, refunded. A result with
  `ErrorClass.NOT_ATTEMPTED` says the same with a reason.

The deadline rule: no delivery starts once `deadline.seconds_left()` (time left
minus OUTBOX_DEADLINE_MARGIN_SECONDS) is <= 0, and every delivery started
before ends (completes or times out, by the client's timeouts) within the
margin, so its result can still be recorded before the Lambda deadline.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, ClassVar, Mapping, Sequence

from ..models import Channel, ClaimedMessage, DeliveryResult

#: The relay's callback: record these results now (one outcome statement).
RecordResults = Callable[[Sequence[DeliveryResult]], None]

_NO_COUNTERS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Deadline:
    """Time left in this invocation, by the Lambda's own clock (a duration, never
    compared with stored times). `remaining_ms()` is the context's
    `get_remaining_time_in_millis`; `margin_seconds` is kept in reserve to
    record outcomes and release what was not started."""

    remaining_ms: Callable[[], int]
    margin_seconds: float

    def seconds_left(self) -> float:
        """Seconds left to start deliveries (remaining time minus the margin); may be negative."""
        return self.remaining_ms() / 1000.0 - self.margin_seconds

    def passed(self) -> bool:
        return self.seconds_left() <= 0


class Publisher(ABC):
    """A channel's delivery side; the contract is the module's docstring. A
    publisher that leaves out a required member cannot be built."""

    channel: ClassVar[Channel]
    #: The relay may claim the next batch while this one is delivered.
    pipelined: ClassVar[bool] = False
    #: Its rate is one for the whole channel, shared by the pollers of a handover (`share_rate`).
    rate_shared: ClassVar[bool] = False

    @property
    def counters(self) -> Mapping[str, int]:
        """This invocation's own counts, by metric name (none by default)."""
        return _NO_COUNTERS

    def begin(self, deadline: Deadline) -> None:
        """A new invocation starts (per-invocation state: rate limits, cached gates, counters)."""

    def share_rate(self, share: Callable[[], float]) -> None:
        """With `rate_shared`: `share()` is this poller's part of the channel's rate (0..1)."""

    @abstractmethod
    def gate(self) -> str | None:
        """None when the downstream can take messages, else a short reason; nothing is claimed then."""

    @abstractmethod
    def claim_limit(self, batch_size: int, seconds_available: float) -> int:
        """How many messages to claim, given the batch size and the seconds left before the deadline."""

    @abstractmethod
    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None:
        """Deliver `messages`, calling `record` with results as they complete."""
