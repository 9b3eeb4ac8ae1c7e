"""Messages for the AWS messaging channels (SQS, SNS, EventBridge), as validated
at enqueue, and their size exactly as the service counts it.

One shape for the three (docs/channels.md): a `type`, a JSON `payload`, an
optional ordering `key` and string `headers`. SQS and SNS carry the payload as
the message body and the rest as message attributes; EventBridge carries the
payload object as the event's detail, with the message id added to it, and the
type as its detail-type.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import InvalidMessageError
from .events import (
    DeliverAt,
    MaxAttempts,
    MessageType,
    OrderingKey,
    check_deliver_at,
    check_text,
    json_text,
    payload_text,
    validated,
)
from .ids import uuid7
from .models import Channel

#: The size limit of one SQS or SNS message and one EventBridge entry, bytes (256 KiB).
MAX_AWS_MESSAGE_BYTES = 256 * 1024
#: Message attributes SQS and SNS carry at most ("Amazon SQS message attributes").
MAX_ATTRIBUTES = 10
#: The attributes the relay adds: the message id, the type and the ordering key.
ID_ATTRIBUTE = "outbox-message-id"
TYPE_ATTRIBUTE = "outbox-type"
KEY_ATTRIBUTE = "outbox-key"
RESERVED_ATTRIBUTES = (ID_ATTRIBUTE, TYPE_ATTRIBUTE, KEY_ATTRIBUTE)
#: Headers a producer may give: what is left of the ten attributes after the relay's three.
MAX_HEADERS = MAX_ATTRIBUTES - len(RESERVED_ATTRIBUTES)
#: The EventBridge detail field that carries the message id (EventBridge does not deduplicate).
DETAIL_ID_FIELD = "outbox-message-id"
#: The destination of a message that names no bus: the relay's own (OUTBOX_EVENTBRIDGE_BUS,
#: OUTBOX_SQS_QUEUE_URL, OUTBOX_SNS_TOPIC_ARN). Not a bus name, so never taken for one
#: (EventBridge's own bus is called "default").
DEFAULT_DESTINATION = "(relay)"
#: The data type SQS and SNS record for a string attribute; counted in its size.
STRING = "String"

# SQS and SNS attribute names: letters, digits, '_', '-', '.'; not starting with
# AWS. or Amazon., no leading, trailing or doubled '.' ("SendMessage", MessageAttribute).
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*")
# EventBridge: a bus is a name or an ARN; a source and a detail-type are text without the
# reserved "aws." prefix for sources ("PutEventsRequestEntry").
_BUS_NAME = re.compile(r"[/.\-_A-Za-z0-9]{1,256}")
_BUS_ARN = re.compile(r"arn:aws[\w-]*:events:[a-z0-9-]+:\d{12}:event-bus/[/.\-_A-Za-z0-9]{1,256}")
_SQS_TEXT = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def attribute_bytes(name: str, value: str) -> int:
    """The bytes one string attribute counts towards the message size (name, data type, value)."""
    return len(name.encode("utf-8")) + len(STRING) + len(value.encode("utf-8"))


def check_sqs_text(value: str, field: str) -> None:
    """SQS takes only XML characters (#x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD,
    #x10000 to #x10FFFF) in bodies and attributes ("SendMessage", MessageBody)."""
    bad = _SQS_TEXT.search(value)
    if bad:
        raise InvalidMessageError(field, f"contains U+{ord(bad.group()):04X}, which SQS refuses "
                                         "(only XML characters are allowed)")


class AwsMessage(BaseModel):
    """A message for SQS, SNS or EventBridge, as validated at enqueue."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    type: MessageType
    payload: Any
    key: OrderingKey = None
    headers: dict[str, str] | None = None
    message_id: uuid.UUID | None = None
    deliver_at: DeliverAt = None
    max_attempts: MaxAttempts = None


class EventBridgeMessage(AwsMessage):
    """An EventBridge event: the payload is its detail (a JSON object), `type` its detail-type."""

    source: str | None = Field(default=None, min_length=1, max_length=256)
    bus: str | None = Field(default=None, min_length=1, max_length=1600)

    @field_validator("source")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        if v is not None and (v.strip() != v or v.lower().startswith("aws.")):
            raise ValueError("must have no leading or trailing blanks and not start with 'aws.' "
                             "(reserved for AWS services)")
        return None if v is None else check_text(v)

    @field_validator("bus")
    @classmethod
    def _bus(cls, v: str | None) -> str | None:
        if v is not None and not (_BUS_NAME.fullmatch(v) or _BUS_ARN.fullmatch(v)):
            raise ValueError("must be an event bus name (letters, digits, '.', '-', '_', '/') or an event bus ARN")
        return v


def _check_headers(headers: Mapping[str, str] | None, channel: Channel) -> None:
    if not headers:
        return
    if len(headers) > MAX_HEADERS and channel is not Channel.EVENTBRIDGE:
        raise InvalidMessageError("headers", f"has {len(headers)} entries; {channel.value} carries at most "
                                             f"{MAX_ATTRIBUTES} message attributes, {len(RESERVED_ATTRIBUTES)} "
                                             f"of them the relay's, so at most {MAX_HEADERS}")
    for name, value in headers.items():
        if channel is Channel.EVENTBRIDGE:
            continue  # they go into the detail, as JSON
        if name in RESERVED_ATTRIBUTES:
            raise InvalidMessageError(f"headers.{name}", "is the relay's own attribute")
        if len(name) > 256 or not _ATTRIBUTE_NAME.fullmatch(name) or name.lower().startswith(("aws.", "amazon.")):
            raise InvalidMessageError(f"headers.{name}", "must be 1-256 letters, digits, '_', '-' or '.' (not "
                                                         "leading, trailing or doubled), not starting with "
                                                         "'AWS.' or 'Amazon.'")
        if value == "":
            raise InvalidMessageError(f"headers.{name}", "must not be empty (SQS and SNS refuse empty attributes)")
        if channel is Channel.SQS:
            check_sqs_text(value, f"headers.{name}")


def message_size(channel: Channel, row: Mapping[str, Any], message_id: str, source: str | None = None) -> int:
    """The bytes this message counts towards its service's 256 KiB limit: for SQS and SNS
    the body and every attribute (name, data type, value); for EventBridge the detail
    (with the message id), the detail-type, the source and the time ("Calculating
    Amazon EventBridge PutEvents event entry size"). `source` is EventBridge's, when known."""
    if channel is Channel.EVENTBRIDGE:
        detail = detail_text(row["payload"], message_id)
        size = len(detail.encode("utf-8")) + len(row["type"].encode("utf-8")) + 14  # the Time field
        return size + len((source or "").encode("utf-8"))
    size = len(row["payload"].encode("utf-8")) + attribute_bytes(ID_ATTRIBUTE, message_id)
    size += attribute_bytes(TYPE_ATTRIBUTE, row["type"])
    if row.get("key"):
        size += attribute_bytes(KEY_ATTRIBUTE, row["key"])
    for name, value in (headers_of(row) or {}).items():
        size += attribute_bytes(name, value)
    return size


def headers_of(row: Mapping[str, Any]) -> dict[str, str] | None:
    import json

    text = row.get("headers")
    return json.loads(text) if text else None


def detail_text(payload_json: str, message_id: str) -> str:
    """The event's detail: the payload object with the message id added as its first
    field (text, so the payload's own bytes go unchanged)."""
    body = payload_json.strip()
    inner = body[1:-1].strip()
    sep = "," if inner else ""
    return f'{{"{DETAIL_ID_FIELD}":"{message_id}"{sep}{inner}}}'


def aws_row(channel: Channel, data: Mapping[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """Validate one message for `channel` (SQS, SNS or EventBridge) and return the
    parameters of `sql.producer.insert_message`. Raises `InvalidMessageError` naming the field."""
    model = EventBridgeMessage if channel is Channel.EVENTBRIDGE else AwsMessage
    m = validated(model, data)
    if m.deliver_at is not None:
        try:
            check_deliver_at(m.deliver_at, now)
        except ValueError as exc:
            raise InvalidMessageError("deliver_at", str(exc)) from None
    _check_headers(m.headers, channel)
    text = payload_text(m.payload, MAX_AWS_MESSAGE_BYTES)
    if channel is Channel.EVENTBRIDGE:
        if not isinstance(m.payload, dict):
            raise InvalidMessageError("payload", "must be a JSON object (it is the event's detail)")
        if DETAIL_ID_FIELD in m.payload:
            raise InvalidMessageError(f"payload.{DETAIL_ID_FIELD}", "is the relay's own detail field")
    elif channel is Channel.SQS:
        check_sqs_text(text, "payload")
        check_sqs_text(m.type, "type")
        if m.key is not None:
            check_sqs_text(m.key, "key")
    headers_text = json_text(m.headers, "headers", 64 * 1024) if m.headers else None
    message_id = m.message_id or uuid7()
    row = {
        "message_id": message_id,
        "channel": channel.value,
        "destination": getattr(m, "bus", None) or DEFAULT_DESTINATION,
        "type": m.type,
        "key": m.key,
        "payload": text,
        "headers": headers_text,
        "max_attempts": m.max_attempts,
        "deliver_at": m.deliver_at,
    }
    if channel is Channel.EVENTBRIDGE and m.headers:
        # EventBridge has no attributes: headers ride in the detail, beside the payload.
        raise InvalidMessageError("headers", "EventBridge events have no attributes; put them in the payload")
    size = message_size(channel, row, str(message_id), getattr(m, "source", None))
    if size > MAX_AWS_MESSAGE_BYTES:
        raise InvalidMessageError("payload", f"makes the {channel.value} message {size} bytes with its "
                                             f"attributes; the limit is {MAX_AWS_MESSAGE_BYTES} bytes")
    if channel is Channel.EVENTBRIDGE and m.source is not None:
        # The source the producer chose rides in the headers column, read by the publisher.
        row["headers"] = json_text({"source": m.source}, "source", 1024)
    return row
