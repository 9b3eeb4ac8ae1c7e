"""The Redis channel's message, a domain event for a stream, and its producer API function `enqueue_event`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Mapping

from pydantic import Field, field_validator

from ...tracing import with_context
from ...write import enqueue
from ..message import MAX_NAME_CHARS, Message, check_text, payload_text, validated
from ..message import message_row as row_of
from . import MAX_EVENT_PAYLOAD_BYTES


def check_stream_name(stream: str) -> str:
    """Braces only as a Redis Cluster hash tag, so the dedupe key can be placed in the stream's hash slot."""
    open_ = stream.find("{")
    if open_ == -1:
        if "}" in stream:
            raise ValueError("'}' is allowed only to close a Redis Cluster hash tag {…}")
        return stream
    close = stream.find("}", open_ + 1)
    if close == -1 or close == open_ + 1:
        raise ValueError("'{' must open a non-empty Redis Cluster hash tag {…}")
    if "}" in stream[:open_]:
        raise ValueError("'}' is allowed only to close a Redis Cluster hash tag {…}")
    if "{" in stream[close + 1:] or "}" in stream[close + 1:]:
        raise ValueError("braces are allowed only as one Redis Cluster hash tag {…}")
    return stream


class EventMessage(Message):
    stream: str = Field(min_length=1, max_length=MAX_NAME_CHARS)

    @field_validator("stream")
    @classmethod
    def _stream(cls, v: str) -> str:
        if v.strip() != v or not v:
            raise ValueError("must not be blank or have leading/trailing spaces")
        return check_stream_name(check_text(v))


def message_row(fields: Mapping[str, Any], now: datetime | None = None,
                context: Mapping[str, str] | None = None) -> dict[str, Any]:
    if context:
        fields = {**fields, "headers": with_context(fields.get("headers"), context)}
    m: EventMessage = validated(EventMessage, fields, now)
    return row_of(m, "redis", m.stream, payload_text(m.payload, MAX_EVENT_PAYLOAD_BYTES))


def enqueue_event(conn: Any, *, stream: str, type: str, payload: Any, key: str | None = None,
                  message_id: uuid.UUID | str | None = None, deliver_at: datetime | None = None,
                  max_attempts: int | None = None, headers: Mapping[str, str] | None = None) -> uuid.UUID:
    """Write a domain event for the Redis Stream `stream` in `conn`'s transaction (a SQLAlchemy
    `Connection` or `Session`); returns its id. `payload`: any JSON value, at most 256 KiB;
    `key`: an ordering key; `message_id`: the idempotency key (the same id again writes nothing),
    else a new UUIDv7; `deliver_at`: an aware datetime within 366 days (a past one means now);
    `max_attempts`: 1-1000, else the relay's default. A bad field raises `InvalidMessageError`
    naming it, and nothing is written."""
    return enqueue(conn, channel="redis", stream=stream, type=type, payload=payload, key=key,
                   message_id=message_id, deliver_at=deliver_at, max_attempts=max_attempts, headers=headers)
