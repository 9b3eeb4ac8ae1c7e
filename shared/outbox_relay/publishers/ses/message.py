"""The SES channel's message, an email (`payload`), as the producer API validates it,
and its producer API function `enqueue_email`."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from ...errors import InvalidMessageError
from ...write import enqueue
from ..message import Envelope, validated
from ..message import message_row as row_of
from .mime import check_size
from .payload import DEFAULT_DESTINATION, EMAIL_TYPE, validate_payload

#: The producer API's fields that are the email itself (the rest are its `Envelope`).
_ENVELOPE = ("key", "message_id", "deliver_at", "max_attempts")


def message_row(fields: Mapping[str, Any], now: datetime | None = None,
                context: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Validate an email given as `enqueue_email`'s keyword arguments and return the row
    to write; the trace context goes into the message's headers column, as for every
    channel (the relay adds it to the email's headers). Raises `InvalidMessageError`
    naming the field; see `enqueue_email`."""
    data = {("from" if name == "sender" else name): value for name, value in fields.items()
            if name not in _ENVELOPE and value is not None}
    data["headers"], data["tags"] = dict(data.get("headers") or {}), dict(data.get("tags") or {})
    data["attachments"] = list(data.get("attachments") or ())
    try:
        payload = validate_payload(data)
        check_size(payload)
    except InvalidMessageError as exc:
        if exc.field == "from":
            raise InvalidMessageError("sender", exc.problem) from None
        raise
    try:
        envelope = validated(Envelope, {name: fields[name] for name in _ENVELOPE if name in fields}, now)
    except InvalidMessageError as exc:
        if exc.field == "max_attempts":  # in the words of the SQL function outbox_enqueue_email_v1
            raise InvalidMessageError("max_attempts", "must be an integer from 1 to 1000") from None
        raise
    return row_of(envelope, "ses", payload.configuration_set or DEFAULT_DESTINATION, payload.to_json(), EMAIL_TYPE,
                  json.dumps(context, separators=(",", ":")) if context else None)


def email_row(**fields: Any) -> dict[str, Any]:
    """`message_row` of `enqueue_email`'s keyword arguments."""
    return message_row(fields)


def enqueue_email(
    conn: Any,
    *,
    to: Sequence[str] | str = (),
    subject: str,
    html: str | None = None,
    text: str | None = None,
    cc: Sequence[str] | str = (),
    bcc: Sequence[str] | str = (),
    reply_to: Sequence[str] | str = (),
    sender: str | None = None,
    headers: Mapping[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
    configuration_set: str | None = None,
    attachments: Iterable[Any] = (),
    message_id: uuid.UUID | str | None = None,
    deliver_at: datetime | None = None,
    max_attempts: int | None = None,
    key: str | None = None,
) -> uuid.UUID:
    """Write a transactional email into the outbox, in the caller's transaction.

    Args:
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction
            (anything else is refused: `InvalidMessageError` on ``conn``).
        to, cc, bcc: recipient mailboxes (``a@example.com`` or ``Name <a@example.com>``;
            a single string is a list of one); 1–50 in all.
        subject: non-empty, one line, UTF-8 (leading and trailing blanks are dropped).
        html, text: the bodies (UTF-8); at least one.
        reply_to: Reply-To mailboxes.
        sender: the From mailbox; a verified SES identity. When None the relay
            uses OUTBOX_SES_FROM.
        headers: custom headers, name → value (at most 15; see the module docstring;
            values lose leading and trailing blanks, as a MIME header would).
        tags: SES message tags, name → value (ASCII letters, digits, ``_``, ``-``).
        configuration_set: SES configuration set; else OUTBOX_SES_CONFIGURATION_SET.
        attachments: `Attachment` objects, mappings with ``filename``, ``content``
            (bytes) and optional ``content_type``, or ``(filename, content[, content_type])``
            tuples. With attachments the email is sent as raw MIME.
        message_id: idempotency key (UUID); enqueueing the same id again writes
            nothing and returns it. A fresh UUIDv7 when omitted.
        deliver_at: timezone-aware `datetime` before which it is not sent, at most 366
            days ahead; a past one (at most 366 days back) means now (text is refused).
        max_attempts: per-message retry budget, an `int` from 1 to 1000, else the relay's default.
        key: optional ordering key (non-empty): emails with the same key and
            configuration set are sent one at a time, in enqueue order (e.g. the
            recipient's or the order's id, so "shipped" never arrives before "confirmed").

    Returns:
        The message id (also sent as the SES message tag ``outbox-message-id``).

    Raises:
        InvalidMessageError: a rule is broken; `.field` names the field
            (``to[2]``, ``subject``, ``headers``, ``tags``, ``attachments[0].filename``,
            ``html/text``, …). Nothing is written.
    """
    return enqueue(conn, channel="ses", to=to, subject=subject, html=html, text=text, cc=cc, bcc=bcc,
                   reply_to=reply_to, sender=sender, headers=headers, tags=tags,
                   configuration_set=configuration_set, attachments=attachments, message_id=message_id,
                   deliver_at=deliver_at, max_attempts=max_attempts, key=key)
