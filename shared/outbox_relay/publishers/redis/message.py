"""The Redis channel's message, a domain event for a stream, as the producer API
validates it, and its producer API function `enqueue_event`."""

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
    """Validate a Redis stream name. Braces are allowed only as a Redis Cluster
    hash tag (`{tag}`, "Redis cluster specification", key distribution model),
    so the dedupe key can be placed in the stream's hash slot."""
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
    """A domain event for a Redis Stream, as validated at enqueue."""

    stream: str = Field(min_length=1, max_length=MAX_NAME_CHARS)

    @field_validator("stream")
    @classmethod
    def _stream(cls, v: str) -> str:
        if v.strip() != v or not v:
            raise ValueError("must not be blank or have leading/trailing spaces")
        return check_stream_name(check_text(v))


def message_row(fields: Mapping[str, Any], now: datetime | None = None,
                context: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Validate one event and return the row to write; the trace `context` joins its
    headers (published as the entry's `headers` field). Raises `InvalidMessageError`."""
    if context:
        fields = {**fields, "headers": with_context(fields.get("headers"), context)}
    m: EventMessage = validated(EventMessage, fields, now)
    return row_of(m, "redis", m.stream, payload_text(m.payload, MAX_EVENT_PAYLOAD_BYTES))


def enqueue_event(
    conn: Any,
    *,
    stream: str,
    type: str,
    payload: Any,
    key: str | None = None,
    message_id: uuid.UUID | str | None = None,
    deliver_at: datetime | None = None,
    max_attempts: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> uuid.UUID:
    """Write a domain event for the Redis Stream `stream`, in the caller's transaction.

    Args:
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction
            (anything else, an Engine or a DB-API connection included, is refused:
            `InvalidMessageError` on ``conn``).
        stream: stream key (non-empty; braces only as a Redis Cluster hash tag).
        type: event type, e.g. ``"order.placed"`` (non-empty).
        payload: any JSON-serialisable value, at most 256 KiB as UTF-8 JSON; NaN
            and the NUL character are refused.
        key: optional ordering/partition key, published as the entry's `key` field;
            not empty (leave it out for no key).
        message_id: idempotency key; enqueueing the same id again writes
            nothing and returns it. A fresh UUIDv7 when omitted.
        deliver_at: timezone-aware `datetime` before which it is not delivered, at most
            366 days ahead; a past one (at most 366 days back) means now. Text and
            numbers are refused, not parsed.
        max_attempts: per-message retry budget, an `int` from 1 to 1000 (text, floats
            and booleans are refused), else the relay's default.
        headers: optional string metadata, published as the `headers` field (JSON).

    Returns:
        The message id.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    return enqueue(conn, channel="redis", stream=stream, type=type, payload=payload, key=key,
                   message_id=message_id, deliver_at=deliver_at, max_attempts=max_attempts, headers=headers)
