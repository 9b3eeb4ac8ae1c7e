"""The SNS channel's message (`aws_message`) and its producer API function `enqueue_sns`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Mapping

from ...write import enqueue
from ..aws_message import attributed_row


def message_row(fields: Mapping[str, Any], now: datetime | None = None,
                context: Mapping[str, str] | None = None) -> dict[str, Any]:
    return attributed_row("sns", fields, now, context)


def enqueue_sns(conn: Any, *, type: str, payload: Any, key: str | None = None,
                headers: Mapping[str, str] | None = None, message_id: uuid.UUID | str | None = None,
                deliver_at: datetime | None = None, max_attempts: int | None = None) -> uuid.UUID:
    """Write a message for the SNS relay's topic in the caller's transaction; returns its id.
    As `enqueue_sqs`, the payload being the SNS ``Message``."""
    return enqueue(conn, channel="sns", type=type, payload=payload, key=key, headers=headers,
                   message_id=message_id, deliver_at=deliver_at, max_attempts=max_attempts)
