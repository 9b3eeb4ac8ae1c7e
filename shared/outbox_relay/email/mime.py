"""The raw MIME message of an email (RFC 5322 / RFC 2045), built with the
standard library's `email` package, for emails SES must receive as raw content
(attachments, or custom headers on an older botocore)."""

from __future__ import annotations

import contextlib
import json
from email.message import EmailMessage
from email.utils import formatdate
from typing import Iterator

from ..errors import InvalidMessageError
from .headers import MIME_POLICY
from .payload import EmailPayload

#: SES v2 maximum message size, bytes, after base64 encoding ("Service quotas in Amazon SES").
MAX_MESSAGE_BYTES = 40_000_000
_PLACEHOLDER_SENDER = "placeholder-sender-address@example.invalid"


def build_mime(m: EmailPayload, *, sender: str, date: str | None = None) -> bytes:
    """The raw MIME message (RFC 5322 / RFC 2045), built with the standard
    library's `email` package, CRLF line endings.

    Structure: the text and/or html body (``multipart/alternative`` when both),
    inside ``multipart/mixed`` with the attachments when there are any. Bodies
    are UTF-8, base64 transfer-encoded, so they arrive byte for byte and no
    line exceeds the 1,000 characters SES allows (RFC 5321). Non-ASCII display
    names, subjects and header values become RFC 2047 encoded words. Bcc is
    never written into the headers (SES takes it from the Destination).

    Args:
        m: a validated payload.
        sender: canonical From mailbox (the payload's, else the configured default).
        date: RFC 5322 date; now (UTC) when omitted.

    Raises:
        InvalidMessageError: the `email` package could not write a part; `.field`
            names it (``from``, ``to``, ``subject``, ``headers``, ``html/text``,
            ``attachments[i]``, or ``message`` for the final serialisation) and the
            problem gives only the exception type, never a value. Any exception the
            package raises (IndexError, TypeError, UnicodeError, `email.errors.*`, …)
            becomes this one.
    """
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
    """Context manager: any exception inside (other than `InvalidMessageError`)
    becomes `InvalidMessageError(field, "<what> (<exception type>)")`, naming the
    exception type only (the values may be personal data)."""
    try:
        yield
    except InvalidMessageError:
        raise
    except Exception as exc:
        raise InvalidMessageError(field, f"{what} ({type(exc).__name__})") from None


def mime_bound(payload: dict) -> int:
    """An upper bound of the bytes of the MIME message of `payload` (the stored JSON,
    parsed), the same expression as the SQL email function's `outbox__mime_bound_v1`,
    so that both refuse the same messages: bodies and attachments base64 with a CRLF
    per 76 characters, header text at three bytes a byte (encoded words), file
    names at two (RFC 2231), and room for the fixed parts. Never below the real size.

    Values that are not strings count as PostgreSQL prints jsonb (``["a", "b"]``)."""

    def text(v: object) -> str:
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, separators=(", ", ": "))

    def octets(v: object) -> int:
        return len(text(v).encode("utf-8", "surrogatepass"))

    attachments = payload.get("attachments") or []
    bodies = [octets(payload[k]) for k in ("html", "text") if payload.get(k) is not None]
    for a in attachments:
        b64 = a["content_base64"]
        bodies.append(len(b64) // 4 * 3 - len(b64) + len(b64.rstrip("=")))
    headers = sum(octets(payload.get(k) or "") for k in ("from", "subject", "to", "cc", "reply_to"))
    headers += sum(octets(k) + octets(v) + 4 for k, v in (payload.get("headers") or {}).items())
    # An attachment without a stored type is NULL in SQL's sum, so it is left out here too.
    headers += sum(2 * octets(a["filename"]) + octets(a["content_type"]) for a in attachments
                   if a.get("content_type") is not None)
    # Integer arithmetic as PostgreSQL's: (n + 2) / 3 rounds down.
    return 4096 + 3 * headers + sum(400 + 4 * ((n + 2) // 3) + 2 * ((4 * ((n + 2) // 3) + 75) // 76)
                                    for n in bodies)


def check_size(m: EmailPayload) -> None:
    """Refuse an email whose MIME message may exceed `MAX_MESSAGE_BYTES`, by
    `mime_bound` (the rule the SQL email function applies too; the relay still
    checks the real size when it sends). `InvalidMessageError` names the field
    that made it too large."""
    bound = mime_bound(json.loads(m.to_json()))
    if bound > MAX_MESSAGE_BYTES:
        field = "attachments" if m.attachments else "html/text"
        raise InvalidMessageError(field, f"the message is up to {bound} bytes as MIME; SES v2 accepts at most "
                                         f"{MAX_MESSAGE_BYTES} bytes including attachments")
