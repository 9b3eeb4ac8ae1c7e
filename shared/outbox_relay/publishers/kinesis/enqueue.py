"""The Kinesis producer API (`producer.enqueue_kinesis`): a message validated, the
producer's trace context added to its headers where it fits, then written by the
producer's statement in the caller's transaction."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Mapping

from ... import tracing
from ...aws_messages import DEFAULT_DESTINATION, AwsMessage
from ...errors import InvalidMessageError
from ...events import check_deliver_at, json_text, payload_text, validated
from ...ids import uuid7
from ...models import Channel
from ...write import check_conn, insert_message
from .records import MAX_RECORD_BYTES, partition_key, record_bytes, record_data


def kinesis_row(**fields: Any) -> dict[str, Any]:
    """The row `enqueue_kinesis` writes for these keyword arguments: validated, and the
    record (data plus partition key) at most 1 MiB. Raises `InvalidMessageError` naming the field."""
    m = validated(AwsMessage, fields)
    if m.deliver_at is not None:
        try:
            check_deliver_at(m.deliver_at, None)
        except ValueError as exc:
            raise InvalidMessageError("deliver_at", str(exc)) from None
    payload = payload_text(m.payload, MAX_RECORD_BYTES)
    headers = json_text(m.headers, "headers", MAX_RECORD_BYTES) if m.headers else None
    message_id = m.message_id or uuid7()
    size = record_bytes(record_data(str(message_id), m.type, m.key, headers, payload),
                        partition_key(m.key, str(message_id)))
    if size > MAX_RECORD_BYTES:
        raise InvalidMessageError("payload", f"makes the Kinesis record {size} bytes with its partition key; "
                                             f"the limit is {MAX_RECORD_BYTES} bytes")
    return {"message_id": message_id, "channel": Channel.KINESIS.value, "destination": DEFAULT_DESTINATION,
            "type": m.type, "key": m.key, "payload": payload, "headers": headers,
            "max_attempts": m.max_attempts, "deliver_at": m.deliver_at}


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
    check_conn(conn)
    data = {"type": type, "payload": payload, "key": key, "headers": headers, "message_id": message_id,
            "deliver_at": deliver_at, "max_attempts": max_attempts}
    data = {k: v for k, v in data.items() if v is not None or k == "payload"}
    row = kinesis_row(**data)
    context = tracing.current_context()
    if context:
        traced = tracing.with_context(headers, context)
        if traced is not headers:
            try:  # a trace context never makes a valid message invalid
                row = kinesis_row(**{**data, "message_id": row["message_id"], "headers": traced})
            except InvalidMessageError:
                pass
    return insert_message(conn, row)
