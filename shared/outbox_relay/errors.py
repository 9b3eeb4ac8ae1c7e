"""Exception types; the type says what happens next."""

from __future__ import annotations

from typing import Any


class OutboxError(Exception):
    """Every error this library raises on purpose."""


class ConfigurationError(OutboxError):
    def __init__(self, variable: str, problem: str) -> None:
        self.variable = variable
        self.problem = problem
        super().__init__(f"{variable}: {problem}")


class _FieldError(OutboxError, ValueError):
    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


class InvalidEventError(_FieldError):
    @classmethod
    def of(cls, exc: Any) -> "InvalidEventError":
        first = exc.errors()[0]
        return cls(".".join(str(p) for p in first.get("loc", ())) or "event", first["msg"])


class InvalidMessageError(_FieldError):
    """A message refused at enqueue."""


class DownstreamUnavailable(OutboxError):
    """The downstream cannot take deliveries now (not the messages' fault): attempts refunded."""


class StopBatch(OutboxError):
    """The downstream refused *us* (account, identity, configuration set): every message would
    fail alike, so the batch stops and the rest is released, refunded."""
