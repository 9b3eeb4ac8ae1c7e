"""The SES channel's message, an email (`payload`), and its producer API function `enqueue_email`."""

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
    """The trace context goes into the headers column; the relay adds it to the email's headers."""
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


def enqueue_email(conn: Any, *, to: Sequence[str] | str = (), subject: str, html: str | None = None,
                  text: str | None = None, cc: Sequence[str] | str = (), bcc: Sequence[str] | str = (),
                  reply_to: Sequence[str] | str = (), sender: str | None = None,
                  headers: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
                  configuration_set: str | None = None, attachments: Iterable[Any] = (),
                  message_id: uuid.UUID | str | None = None, deliver_at: datetime | None = None,
                  max_attempts: int | None = None, key: str | None = None) -> uuid.UUID:
    """Write a transactional email in the caller's transaction; returns its id (also the SES tag
    ``outbox-message-id``). `to`, `cc`, `bcc`: 1-50 mailboxes in all (``Name <a@example.com>``; a
    string is a list of one); `sender`: a verified identity, else OUTBOX_SES_FROM; at least one of
    `html` and `text`; `attachments`: `Attachment`s, mappings or ``(filename, content[, content_type])``
    tuples (sent as raw MIME); `key`: emails of one key and configuration set go one at a time, in
    order. The rules: docs/channels.md, "Validation rules". Other fields as for `enqueue_event`."""
    return enqueue(conn, channel="ses", to=to, subject=subject, html=html, text=text, cc=cc, bcc=bcc,
                   reply_to=reply_to, sender=sender, headers=headers, tags=tags,
                   configuration_set=configuration_set, attachments=attachments, message_id=message_id,
                   deliver_at=deliver_at, max_attempts=max_attempts, key=key)
