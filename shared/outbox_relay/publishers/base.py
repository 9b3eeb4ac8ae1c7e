"""What every publisher offers the relay."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from ..models import Channel, ClaimedMessage, DeliveryResult

#: The relay's callback: record these results now (one outcome statement).
RecordResults = Callable[[Sequence[DeliveryResult]], None]


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


class Publisher(Protocol):
    """A channel's delivery side. Raises `DownstreamUnavailable` or `StopBatch`
    (see `errors`) for failures that are not one message's fault."""

    channel: Channel
    #: Whether the relay may claim the next batch while this one is delivered
    #: (drain and latency modes); a publisher paced by a rate gains nothing by it.
    pipelined: bool

    def begin(self, deadline: Deadline) -> None:
        """A new invocation starts (per-invocation state: rate limits, cached gates)."""

    def gate(self) -> str | None:
        """Check the downstream before claiming: None when it can take messages,
        else a short reason (no personal data) and nothing is claimed."""

    def claim_limit(self, batch_size: int, seconds_available: float) -> int:
        """How many messages to claim, given the configured batch size and the
        seconds left before the deadline."""

    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None:
        """Deliver `messages`, calling `record` with results as they complete.
        Messages it never reports (deadline reached) are released by the relay."""
