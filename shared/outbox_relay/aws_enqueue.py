"""The producer API's functions of the AWS channels (`producer.enqueue_sqs`,
`enqueue_sns`, `enqueue_eventbridge`): a message validated (`aws_messages`), the
producer's trace context added where it fits, then written by the producer's
statement in the caller's transaction."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Mapping

from . import tracing
from .aws_messages import MAX_HEADERS, aws_row
from .errors import InvalidMessageError
from .models import Channel
from .tracing import with_context
from .write import check_conn, insert_message


def _enqueue_aws(conn: Any, channel: Channel, fields: dict[str, Any]) -> uuid.UUID:
    check_conn(conn)
    data = {k: v for k, v in fields.items() if v is not None or k == "payload"}
    row = aws_row(channel, data)
    context = tracing.current_context()
    if context:
        row = _aws_traced(channel, data, row, context)
    return insert_message(conn, row)


def _aws_traced(channel: Channel, data: dict[str, Any], row: dict[str, Any],
                context: Mapping[str, str]) -> dict[str, Any]:
    """The row with the trace context, where it fits: EventBridge keeps it beside the
    source (sent as the entry's TraceHeader); SQS and SNS as attributes, only when the
    message keeps within ten attributes and 256 KiB with them (a context never makes a
    valid message invalid)."""
    if channel is Channel.EVENTBRIDGE:
        stored = json.loads(row["headers"]) if row["headers"] else {}
        row["headers"] = json.dumps({**stored, **context}, separators=(",", ":"))
        return row
    headers = data.get("headers")
    if isinstance(headers, Mapping) and "traceparent" in headers:
        return row
    context = dict(context)
    if len(headers or {}) + len(context) > MAX_HEADERS:
        context.pop("tracestate", None)
    if len(headers or {}) + len(context) > MAX_HEADERS:
        return row
    try:
        return aws_row(channel, {**data, "message_id": row["message_id"], "headers": with_context(headers, context)})
    except InvalidMessageError:
        return row


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
    return _enqueue_aws(conn, Channel.SQS, {
        "type": type, "payload": payload, "key": key, "headers": headers, "message_id": message_id,
        "deliver_at": deliver_at, "max_attempts": max_attempts})


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
    return _enqueue_aws(conn, Channel.SNS, {
        "type": type, "payload": payload, "key": key, "headers": headers, "message_id": message_id,
        "deliver_at": deliver_at, "max_attempts": max_attempts})


def enqueue_eventbridge(
    conn: Any,
    *,
    type: str,
    payload: Mapping[str, Any],
    source: str | None = None,
    bus: str | None = None,
    key: str | None = None,
    message_id: uuid.UUID | str | None = None,
    deliver_at: datetime | None = None,
    max_attempts: int | None = None,
) -> uuid.UUID:
    """Write an event for Amazon EventBridge, in the caller's transaction.

    Args:
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction.
        type: the event's detail-type (non-empty).
        payload: a JSON object: the event's detail. The relay adds the message id to it
            as `outbox-message-id` (a name the payload must not use). Detail, detail-type,
            source and time together are at most 256 KiB.
        source: the event's source (not starting with ``aws.``); else OUTBOX_EVENTBRIDGE_SOURCE.
        bus: the event bus, a name or an ARN; else OUTBOX_EVENTBRIDGE_BUS. The relay's
            IAM policy must allow it (the template allows the relay's own bus only).
        key: optional ordering key: events of one key are put in order.
        message_id, deliver_at, max_attempts: as for `enqueue_event`.

    Returns:
        The message id.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    return _enqueue_aws(conn, Channel.EVENTBRIDGE, {
        "type": type, "payload": payload, "source": source, "bus": bus, "key": key, "message_id": message_id,
        "deliver_at": deliver_at, "max_attempts": max_attempts})
