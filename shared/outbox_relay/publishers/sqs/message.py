"""The SQS channel's message (`publishers.aws_message`: the payload is the body, the
rest message attributes) and its producer API function `enqueue_sqs`."""

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
    """SQS takes only XML characters (#x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD,
    #x10000 to #x10FFFF) in bodies and attributes ("SendMessage", MessageBody)."""
    bad = _SQS_TEXT.search(value)
    if bad:
        raise InvalidMessageError(field, f"contains U+{ord(bad.group()):04X}, which SQS refuses "
                                         "(only XML characters are allowed)")


def message_row(fields: Mapping[str, Any], now: datetime | None = None,
                context: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Validate one SQS message and return the row to write. Raises `InvalidMessageError`."""
    return attributed_row("sqs", fields, now, context, check_sqs_text)


def enqueue_sqs(
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
    """Write a message for the SQS relay's queue (OUTBOX_SQS_QUEUE_URL), in the caller's transaction.

    Args:
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction.
        type: the message's type, sent as the `outbox-type` attribute (non-empty).
        payload: any JSON-serialisable value: the message body, as JSON. With its
            attributes the message is at most 256 KiB; SQS takes only XML characters.
        key: optional ordering key: sent in order, as the `outbox-key` attribute, and
            as the ``MessageGroupId`` on a FIFO queue.
        headers: at most 7 string attributes (name → non-empty value); the relay adds
            `outbox-message-id`, `outbox-type` and `outbox-key`.
        message_id, deliver_at, max_attempts: as for `enqueue_event`. The message id is
            the `outbox-message-id` attribute, and the ``MessageDeduplicationId`` on a FIFO queue.

    Returns:
        The message id.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    return enqueue(conn, channel="sqs", type=type, payload=payload, key=key, headers=headers,
                   message_id=message_id, deliver_at=deliver_at, max_attempts=max_attempts)
