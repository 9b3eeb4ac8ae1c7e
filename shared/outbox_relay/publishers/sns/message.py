"""The SNS channel's message (`publishers.aws_message`: the payload is the SNS
``Message``, the rest message attributes) and its producer API function `enqueue_sns`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Mapping

from ...write import enqueue
from ..aws_message import attributed_row


def message_row(fields: Mapping[str, Any], now: datetime | None = None,
                context: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Validate one SNS message and return the row to write. Raises `InvalidMessageError`."""
    return attributed_row("sns", fields, now, context)


def enqueue_sns(
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
    """Write a message for the SNS relay's topic (OUTBOX_SNS_TOPIC_ARN), in the caller's transaction.

    The fields are those of `enqueue_sqs`: the payload JSON is the SNS ``Message``, the
    rest are message attributes, and on a FIFO topic the key is the ``MessageGroupId``
    and the message id the ``MessageDeduplicationId``.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    return enqueue(conn, channel="sns", type=type, payload=payload, key=key, headers=headers,
                   message_id=message_id, deliver_at=deliver_at, max_attempts=max_attempts)
