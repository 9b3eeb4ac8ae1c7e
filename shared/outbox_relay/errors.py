"""Exception types. The type of an exception says what happens next.

- `ConfigurationError`: bad settings; start-up stops, the message names the variable.
- `ValidationError` (from pydantic, re-raised as `InvalidMessageError`): refused at
  enqueue, nothing written, the message names the field.
- `DownstreamUnavailable`: the downstream (Redis, SES) cannot take anything now;
  the relay claims nothing, or releases what it claimed with attempts refunded.
- `StopBatch`: the downstream refuses us (account, sender identity,
  configuration set); stop, release the rest with attempts refunded.
"""

from __future__ import annotations

from typing import Any


class OutboxError(Exception):
    """Base class of every error this library raises on purpose."""


class ConfigurationError(OutboxError):
    """A setting is missing or invalid. `variable` names the environment variable."""

    def __init__(self, variable: str, problem: str) -> None:
        self.variable = variable
        self.problem = problem
        super().__init__(f"{variable}: {problem}")


class InvalidEventError(OutboxError, ValueError):
    """An invocation's event cannot be used. `field` names the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")

    @classmethod
    def of(cls, exc: Any) -> "InvalidEventError":
        """The first error of a pydantic `ValidationError`, as one line naming its field."""
        first = exc.errors()[0]
        return cls(".".join(str(p) for p in first.get("loc", ())) or "event", first["msg"])


class InvalidMessageError(OutboxError, ValueError):
    """A message was refused at enqueue. `field` names the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class DownstreamUnavailable(OutboxError):
    """The downstream cannot accept deliveries right now (connection refused,
    timeout, sending paused). Nothing is the messages' fault: attempts are refunded."""


class StopBatch(OutboxError):
    """The downstream refused *us* (account suspended, sender identity or
    configuration set rejected): every further message would fail the same way.
    The relay stops, releases the rest with attempts refunded and emits a metric."""
