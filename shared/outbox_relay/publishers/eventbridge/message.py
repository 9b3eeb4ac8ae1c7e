"""The EventBridge channel's message, an event whose detail is the payload object, and its
producer API function `enqueue_eventbridge`."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Mapping

from ...errors import InvalidMessageError
from ...write import enqueue
from ..aws_message import DEFAULT_DESTINATION, MAX_AWS_MESSAGE_BYTES, checked_size
from ..message import Message, json_text, payload_text, validated
from ..message import message_row as row_of
from .settings import Bus, Source

#: The detail field that carries the message id (EventBridge does not deduplicate).
DETAIL_ID_FIELD = "outbox-message-id"


class EventBridgeMessage(Message):
    source: Source = None
    bus: Bus = None


def detail_text(payload_json: str, message_id: str) -> str:
    """The payload object with the message id first, as text so the payload's bytes go unchanged."""
    inner = payload_json.strip()[1:-1].strip()
    sep = "," if inner else ""
    return f'{{"{DETAIL_ID_FIELD}":"{message_id}"{sep}{inner}}}'


def entry_size(detail: str, type_: str, source: str | None) -> int:
    """Detail, detail-type, source and the Time field ("Calculating … PutEvents event entry size")."""
    return len(detail.encode("utf-8")) + len(type_.encode("utf-8")) + 14 + len((source or "").encode("utf-8"))


def message_row(fields: Mapping[str, Any], now: datetime | None = None,
                context: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The row of one event; the source the producer chose and the trace context (sent as the
    entry's TraceHeader) ride in the headers column."""
    m: EventBridgeMessage = validated(EventBridgeMessage, fields, now)
    text = payload_text(m.payload, MAX_AWS_MESSAGE_BYTES)
    if not isinstance(m.payload, dict):
        raise InvalidMessageError("payload", "must be a JSON object (it is the event's detail)")
    if DETAIL_ID_FIELD in m.payload:
        raise InvalidMessageError(f"payload.{DETAIL_ID_FIELD}", "is the relay's own detail field")
    if m.headers:
        raise InvalidMessageError("headers", "EventBridge events have no attributes; put them in the payload")
    row = row_of(m, "eventbridge", m.bus or DEFAULT_DESTINATION, text)
    checked_size("eventbridge", entry_size(detail_text(text, str(row["message_id"])), m.type, m.source))
    if m.source is not None:
        row["headers"] = json_text({"source": m.source}, "source", 1024)
    if context:
        stored = json.loads(row["headers"]) if row["headers"] else {}
        row["headers"] = json.dumps({**stored, **context}, separators=(",", ":"))
    return row


def enqueue_eventbridge(conn: Any, *, type: str, payload: Mapping[str, Any], source: str | None = None,
                        bus: str | None = None, key: str | None = None,
                        message_id: uuid.UUID | str | None = None, deliver_at: datetime | None = None,
                        max_attempts: int | None = None) -> uuid.UUID:
    """Write an event for EventBridge in the caller's transaction; returns its id. `type` is its
    detail-type, `payload` (an object) its detail, to which the relay adds `outbox-message-id`;
    at most 256 KiB with the rest. `source` (not ``aws.``) and `bus` (name or ARN, which the
    relay's IAM policy must allow) default to OUTBOX_EVENTBRIDGE_*. Other fields as for `enqueue_event`."""
    return enqueue(conn, channel="eventbridge", type=type, payload=payload, source=source, bus=bus, key=key,
                   message_id=message_id, deliver_at=deliver_at, max_attempts=max_attempts)
