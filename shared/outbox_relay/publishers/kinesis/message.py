"""The Kinesis channel's message, a record whose data is a JSON envelope around the payload
(`records`), and its producer API function `enqueue_kinesis`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Mapping

from ...errors import InvalidMessageError
from ...write import enqueue
from ..aws_message import DEFAULT_DESTINATION
from ..message import Message, payload_text, traced_row, validated
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
    return traced_row(_row, fields, now, context)


def enqueue_kinesis(conn: Any, *, type: str, payload: Any, key: str | None = None,
                    headers: Mapping[str, str] | None = None, message_id: uuid.UUID | str | None = None,
                    deliver_at: datetime | None = None, max_attempts: int | None = None) -> uuid.UUID:
    """Write a record for the Kinesis relay's stream in the caller's transaction; returns its id.
    The record's data carries the id (the consumer's dedupe key), type, key, headers and payload;
    the key is its partition key (one shard, in order), else the id. At most 1 MiB with the
    partition key. Other fields as for `enqueue_event`."""
    return enqueue(conn, channel="kinesis", type=type, payload=payload, key=key, headers=headers,
                   message_id=message_id, deliver_at=deliver_at, max_attempts=max_attempts)
