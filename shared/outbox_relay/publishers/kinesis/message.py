"""The Kinesis channel's message: a record whose data is a JSON envelope around the
payload (`records`), at most 1 MiB with its partition key; and its producer API
function `enqueue_kinesis`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Mapping

from ...errors import InvalidMessageError
from ...tracing import with_context
from ...write import enqueue
from ..aws_message import DEFAULT_DESTINATION
from ..message import Message, payload_text, validated
from ..message import message_row as row_of
from .records import MAX_RECORD_BYTES, partition_key, record_bytes, record_data


def _row(fields: Mapping[str, Any], now: datetime | None) -> dict[str, Any]:
    m: Message = validated(Message, fields, now)
    text = payload_text(m.payload, MAX_RECORD_BYTES)
    row = row_of(m, "kinesis", DEFAULT_DESTINATION, text)
    mid = str(row["message_id"])
    size = record_bytes(record_data(mid, m.type, m.key, row["headers"], text), partition_key(m.key, mid))
    if size > MAX_RECORD_BYTES:
        raise InvalidMessageError("payload", f"makes the Kinesis record {size} bytes with its partition key; "
                                             f"the limit is {MAX_RECORD_BYTES} bytes")
    return row


def message_row(fields: Mapping[str, Any], now: datetime | None = None,
                context: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Validate one record and return the row to write; the trace `context` joins its
    headers only where the record still fits. Raises `InvalidMessageError` naming the field."""
    row = _row(fields, now)
    traced = with_context(fields.get("headers"), context or {})
    if traced is fields.get("headers"):
        return row
    try:  # a trace context never makes a valid message invalid
        return _row({**fields, "message_id": row["message_id"], "headers": traced}, now)
    except InvalidMessageError:
        return row


def enqueue_kinesis(
    conn: Any,
    *,
    type: str,
    payload: Any,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: uuid.UUID | str | None = None,
    deliver_at: datetime | None = None,
    max_attempts: int | None = None,
) -> uuid.UUID:
    """Write a record for the Kinesis relay's stream (OUTBOX_KINESIS_STREAM), in the caller's transaction.

    Args:
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction.
        type: the message's type (non-empty), the record's `type` field.
        payload: any JSON-serialisable value: the record's `payload` field.
        key: optional ordering key: the record's partition key (so one shard, in order);
            a message without one is spread by its message id.
        headers: optional string headers, the record's `headers` field (with the
            producer's trace context added when it fits).
        message_id, deliver_at, max_attempts: as for `enqueue_event`. The message id is
            the record's `id` field, the consumer's dedupe key.

    The record (data plus partition key) is at most 1 MiB.

    Returns:
        The message id.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    return enqueue(conn, channel="kinesis", type=type, payload=payload, key=key, headers=headers,
                   message_id=message_id, deliver_at=deliver_at, max_attempts=max_attempts)
