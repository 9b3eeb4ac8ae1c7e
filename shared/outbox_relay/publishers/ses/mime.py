"""The raw MIME message of an email, for emails SES must receive as raw content (attachments, or
custom headers on an older botocore)."""

from __future__ import annotations

import contextlib
from email.message import EmailMessage
from email.utils import formatdate
from typing import Iterator

from ...errors import InvalidMessageError
from . import MAX_MESSAGE_BYTES
from .addresses import MIME_POLICY
from .payload import EmailPayload

_PLACEHOLDER_SENDER = "placeholder-sender-address@example.invalid"


def build_mime(m: EmailPayload, *, sender: str, date: str | None = None) -> bytes:
    """Bodies in base64 arrive byte for byte, no line over SES's 1,000 characters; Bcc is left out (SES takes
    it from the Destination). A part that cannot be written is an `InvalidMessageError` naming its field."""
    msg = EmailMessage(policy=MIME_POLICY)
    with field_errors("from"):
        msg["From"] = sender
    for field, header, values in (("to", "To", m.to), ("cc", "Cc", m.cc), ("reply_to", "Reply-To", m.reply_to)):
        if values:
            with field_errors(field):
                msg[header] = ", ".join(values)
    with field_errors("subject"):
        msg["Subject"] = m.subject
    msg["Date"] = date or formatdate(usegmt=True)
    with field_errors("headers"):
        for name, value in m.headers.items():
            msg[name] = value
    bodies = [(sub, body) for sub, body in (("plain", m.text), ("html", m.html)) if body is not None]
    if not bodies:
        raise InvalidMessageError("html/text", "an html or a text body is required")
    with field_errors("html/text"):
        first_sub, first_body = bodies[0]
        msg.set_content(first_body.encode("utf-8"), maintype="text", subtype=first_sub, cte="base64",
                        params={"charset": "utf-8"})
        for sub, body in bodies[1:]:
            msg.add_alternative(body.encode("utf-8"), maintype="text", subtype=sub, cte="base64",
                                params={"charset": "utf-8"})
    for i, a in enumerate(m.attachments):
        with field_errors(f"attachments[{i}]"):
            maintype, subtype = a.content_type.split("/", 1)
            msg.add_attachment(a.content, maintype=maintype, subtype=subtype, filename=a.filename)
    with field_errors("message"):
        return msg.as_bytes()


@contextlib.contextmanager
def field_errors(field: str, what: str = "cannot be written as MIME") -> Iterator[None]:
    """Any exception inside becomes `InvalidMessageError(field)` naming its type only (values may be personal)."""
    try:
        yield
    except InvalidMessageError:
        raise
    except Exception as exc:
        raise InvalidMessageError(field, f"{what} ({type(exc).__name__})") from None


def check_size(m: EmailPayload) -> None:
    size = len(build_mime(m, sender=m.sender or _PLACEHOLDER_SENDER))
    if size > MAX_MESSAGE_BYTES:
        raise InvalidMessageError(size_field(m), f"the message is {size} bytes as MIME; SES v2 accepts at most "
                                                 f"{MAX_MESSAGE_BYTES} bytes including attachments")


def size_field(m: EmailPayload) -> str:
    return "attachments" if m.attachments else "html/text"
