"""The EventBridge channel's settings (OUTBOX_EVENTBRIDGE_*): a mixin of `config.Settings`."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_settings import BaseSettings

from ...urls import EndpointUrl
from ..message import check_text

# A bus is a name or an ARN; a source is text without the "aws." prefix ("PutEventsRequestEntry").
_BUS_NAME = re.compile(r"[/.\-_A-Za-z0-9]{1,256}")
_BUS_ARN = re.compile(r"arn:aws[\w-]*:events:[a-z0-9-]+:\d{12}:event-bus/[/.\-_A-Za-z0-9]{1,256}")


def _source(v: str | None) -> str | None:
    if v is not None and (v.strip() != v or v.lower().startswith("aws.")):
        raise ValueError("must have no leading or trailing blanks and not start with 'aws.' "
                         "(reserved for AWS services)")
    return None if v is None else check_text(v)


def _bus(v: str | None) -> str | None:
    if v is not None and not (_BUS_NAME.fullmatch(v) or _BUS_ARN.fullmatch(v)):
        raise ValueError("must be an event bus name (letters, digits, '.', '-', '_', '/') or an event bus ARN")
    return v


#: An event's source and bus, the producer's or the relay's (OUTBOX_EVENTBRIDGE_SOURCE, _BUS).
Source = Annotated[str | None, Field(min_length=1, max_length=256), AfterValidator(_source)]
Bus = Annotated[str | None, Field(min_length=1, max_length=1600), AfterValidator(_bus)]


class EventBridgeSettings(BaseSettings):
    aws_endpoint_url_eventbridge: EndpointUrl = Field(default=None, validation_alias="AWS_ENDPOINT_URL_EVENTBRIDGE")
    eventbridge_bus: Bus = "default"
    """OUTBOX_EVENTBRIDGE_BUS: the event bus (name or ARN) of events that name none."""
    eventbridge_source: Source = "outbox.relay"
    """OUTBOX_EVENTBRIDGE_SOURCE: the source of events that name none."""
    eventbridge_max_concurrency: int = Field(default=4, ge=1, le=32)


RELATION_VARIABLES: tuple[str, ...] = ()


def check_settings(s: Any, relayed: bool) -> None:
    """No relation: the bus and the source follow the rules of a message's own (`Bus`, `Source`)."""
