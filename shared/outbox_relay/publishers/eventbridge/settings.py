"""The EventBridge channel's settings (OUTBOX_EVENTBRIDGE_*): a mixin of `config.Settings`."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings

from ...urls import EndpointUrl
from ..message import check_text

# A bus is a name or an ARN; a source is text without the "aws." prefix ("PutEventsRequestEntry").
_BUS_NAME = re.compile(r"[/.\-_A-Za-z0-9]{1,256}")
_BUS_ARN = re.compile(r"arn:aws[\w-]*:events:[a-z0-9-]+:\d{12}:event-bus/[/.\-_A-Za-z0-9]{1,256}")


def check_source(v: str) -> str:
    """An event's source, the producer's or OUTBOX_EVENTBRIDGE_SOURCE. Raises ValueError."""
    if not 1 <= len(v) <= 256:
        raise ValueError("must have 1 to at most 256 characters")
    if v.strip() != v or v.lower().startswith("aws."):
        raise ValueError("must have no leading or trailing blanks and not start with 'aws.' "
                         "(reserved for AWS services)")
    return check_text(v)


def check_bus(v: str) -> str:
    """An event bus, the producer's or OUTBOX_EVENTBRIDGE_BUS: a name or an ARN. Raises ValueError."""
    if not 1 <= len(v) <= 1600 or not (_BUS_NAME.fullmatch(v) or _BUS_ARN.fullmatch(v)):
        raise ValueError("must be an event bus name (letters, digits, '.', '-', '_', '/') or an event bus ARN")
    return v


class EventBridgeSettings(BaseSettings):
    """Amazon EventBridge: the bus and source of events that name none, and how many calls run at once."""

    aws_endpoint_url_eventbridge: EndpointUrl = Field(default=None, validation_alias="AWS_ENDPOINT_URL_EVENTBRIDGE")
    """AWS_ENDPOINT_URL_EVENTBRIDGE: the SDK's endpoint for the service (a local one: moto)."""

    eventbridge_bus: str = "default"
    """OUTBOX_EVENTBRIDGE_BUS: the event bus (name or ARN) of events that name none."""
    eventbridge_source: str = "outbox.relay"
    """OUTBOX_EVENTBRIDGE_SOURCE: the source of events that name none."""
    eventbridge_max_concurrency: int = Field(default=4, ge=1, le=32)
    """OUTBOX_EVENTBRIDGE_MAX_CONCURRENCY: PutEvents calls in flight at once."""


RELATION_VARIABLES: tuple[str, ...] = ("OUTBOX_EVENTBRIDGE_BUS", "OUTBOX_EVENTBRIDGE_SOURCE")


def check_settings(s: Any, relayed: bool) -> None:
    """The bus and the source follow the rules of a message's own. Raises ValueError naming them."""
    for variable, check, value in (("OUTBOX_EVENTBRIDGE_BUS", check_bus, s.eventbridge_bus),
                                   ("OUTBOX_EVENTBRIDGE_SOURCE", check_source, s.eventbridge_source)):
        try:
            check(value)
        except ValueError as exc:
            raise ValueError(f"{variable}: {exc}") from None
