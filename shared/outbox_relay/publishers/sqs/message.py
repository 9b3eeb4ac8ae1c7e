"""The SQS channel's message (`aws_message`) and its producer API function `enqueue_sqs`."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any, Mapping

from ...errors import InvalidMessageError
from ...write import enqueue
from ..aws_message import attributed_row

_SQS_TEXT = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def check_sqs_text(value: str, field: str) -> None:
    """SQS takes only XML characters in bodies and attributes ("SendMessage", MessageBody)."""
    bad = _SQS_TEXT.search(value)
    if bad:
        raise InvalidMessageError(field, f"contains U+{ord(bad.group()):04X}, which SQS refuses "
                                         "(only XML characters are allowed)")


def message_row(fields: Mapping[str, Any], now: datetime | None = None,
                context: Mapping[str, str] | None = None) -> dict[str, Any]:
    return attributed_row("sqs", fields, now, context, check_sqs_text)


def enqueue_sqs(conn: Any, *, type: str, payload: Any, key: str | None = None,
                headers: Mapping[str, str] | None = None, message_id: uuid.UUID | str | None = None,
                deliver_at: datetime | None = None, max_attempts: int | None = None) -> uuid.UUID:
    """Write a message for the SQS relay's queue in the caller's transaction; returns its id.
    The payload (JSON, XML characters only) is the body; the id, type and key are the
    `outbox-message-id`, `outbox-type` and `outbox-key` attributes beside at most 7 `headers`,
    and on a FIFO queue the deduplication and group ids. At most 256 KiB with its attributes.
    Other fields as for `enqueue_event`."""
    return enqueue(conn, channel="sqs", type=type, payload=payload, key=key, headers=headers,
                   message_id=message_id, deliver_at=deliver_at, max_attempts=max_attempts)
