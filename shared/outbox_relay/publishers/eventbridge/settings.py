"""The EventBridge channel's settings (OUTBOX_EVENTBRIDGE_*): a mixin of `config.Settings`."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings


class EventBridgeSettings(BaseSettings):
    """Amazon EventBridge: the bus and source of events that name none, and how many calls run at once."""

    eventbridge_bus: str = "default"
    """OUTBOX_EVENTBRIDGE_BUS: the event bus (name or ARN) of events that name none."""
    eventbridge_source: str = "outbox.relay"
    """OUTBOX_EVENTBRIDGE_SOURCE: the source of events that name none."""
    eventbridge_max_concurrency: int = Field(default=4, ge=1, le=32)
    """OUTBOX_EVENTBRIDGE_MAX_CONCURRENCY: PutEvents calls in flight at once."""


RELATION_VARIABLES: tuple[str, ...] = ("OUTBOX_EVENTBRIDGE_BUS", "OUTBOX_EVENTBRIDGE_SOURCE")


def check_settings(s: Any, relayed: bool) -> None:
    """The bus and the source follow the rules of a message's own. Raises ValueError naming them."""
    from ...aws_messages import EventBridgeMessage
    from ...errors import InvalidMessageError
    from ...events import validated

    for variable, field in (("OUTBOX_EVENTBRIDGE_BUS", "bus"), ("OUTBOX_EVENTBRIDGE_SOURCE", "source")):
        try:
            validated(EventBridgeMessage, {"type": "t", "payload": {}, field: getattr(s, f"eventbridge_{field}")})
        except InvalidMessageError as exc:
            raise ValueError(f"{variable}: {exc.problem}") from None
