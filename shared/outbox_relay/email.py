"""Transactional email: the stored payload, its validation, MIME building, and `enqueue_email`.

An email is an outbox row with channel ``ses``, type ``email``, destination
its configuration set (or ``ses``) and this JSON payload (keys omitted when empty)::

    {"from": "Shop <noreply@shop.example>",            # optional: OUTBOX_SES_FROM when absent
     "to": ["박지우 <jiwoo@example.com>"], "cc": [...], "bcc": [...], "reply_to": [...],
     "subject": "주문 확인 🎉", "text": "…", "html": "<p>…</p>",
     "headers": {"List-Unsubscribe": "<https://shop.example/u/1>"},
     "tags": {"campaign": "welcome"},                   # SES message tags
     "configuration_set": "transactional",              # optional: OUTBOX_SES_CONFIGURATION_SET
     "attachments": [{"filename": "receipt.pdf", "content_type": "application/pdf",
                      "content_base64": "JVBERi0x…"}]}   # standard base64 (RFC 4648 §4)

The same model validates at enqueue (nothing written when invalid; the error
names the field) and again when the relay reads the row, so a payload written
by hand into the table that breaks a rule is dead-lettered, never sent.

Rules and where they come from:
- addresses: one mailbox each, parsed by the standard library's RFC 5322
  parser (`email.headerregistry`) and checked by `email-validator`; the local
  part must be ASCII (SES does not accept SMTPUTF8 addresses), an
  internationalised domain is stored in its ASCII (punycode) form;
- at least one and at most 50 recipients across to, cc and bcc ("Service
  quotas in Amazon SES": recipients per message);
- html or text present; subject present; no CR, LF or NUL where they could
  inject a header or break PostgreSQL text;
- custom headers: at most 15, names printable ASCII without a colon (RFC 5322
  field-name) of at most 126 characters, values at most 995 characters once
  encoded (SES API v2 reference, "MessageHeader"), and each value must parse
  as that header in the standard library's `email` package (an address
  header such as ``Resent-To`` must hold addresses); headers this library
  writes itself (From, To, Subject, …), MIME-Version, every Content-* header
  (the MIME structure is ours) and X-SES-* are refused;
- tags: names and values of 1–256 ASCII letters, digits, `_` or `-` (SES API
  v2 reference, "MessageTag"); the name `outbox-message-id` is reserved;
- configuration set: 1–64 ASCII letters, digits, `_` or `-` (SES API v2
  reference, "CreateConfigurationSet");
- size: the MIME message, attachments included and base64-encoded, at most
  40,000,000 bytes ("Service quotas in Amazon SES": SES v2 API maximum
  message size, 40 MB after base64 encoding).
"""

from __future__ import annotations

import base64
import contextlib
import binascii
import mimetypes
import re
import uuid
from datetime import datetime
from email import policy as email_policy
from email.header import Header
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import formataddr, formatdate
from typing import Any, Iterable, Iterator, Mapping, Sequence

from email_validator import EmailNotValidError, validate_email
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from . import sql
from .errors import InvalidMessageError
from .models import Channel
from .producer import insert_message

#: SES v2 maximum message size, bytes, after base64 encoding ("Service quotas in Amazon SES").
MAX_MESSAGE_BYTES = 40_000_000
#: Recipients per message across To, Cc and Bcc ("Service quotas in Amazon SES").
MAX_RECIPIENTS = 50
#: Custom headers per message (SES API v2 reference, "Message": Headers, 0–15 items).
MAX_CUSTOM_HEADERS = 15
#: Header name / encoded value length (SES API v2 reference, "MessageHeader").
MAX_HEADER_NAME_CHARS = 126
MAX_HEADER_VALUE_CHARS = 995
#: Our cap on message tags per email (SES documents no count in the API reference).
MAX_TAGS = 50
#: RFC 5322 recommends header lines of at most 998 characters; a longer subject is refused.
MAX_SUBJECT_CHARS = 998
MAX_ATTACHMENTS = 100
#: The tag that carries the outbox message id, for matching bounce and complaint events.
OUTBOX_TAG = "outbox-message-id"
#: Destination of an email row without its own configuration set.
DEFAULT_DESTINATION = "ses"
EMAIL_TYPE = "email"

_TAG_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")
_CONFIGURATION_SET_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# RFC 5322 field-name: printable US-ASCII (33–126) except the colon (58).
_HEADER_NAME_RE = re.compile(r"[!-9;-~]{1,%d}" % MAX_HEADER_NAME_CHARS)
_RESERVED_HEADERS = frozenset(h.lower() for h in (
    "From", "Sender", "To", "Cc", "Bcc", "Reply-To", "Subject", "Date", "Message-ID", "MIME-Version",
    "Return-Path",
))
# Every Content-* header describes the MIME structure, which build_mime writes itself.
_RESERVED_HEADER_PREFIX = "content-"
# Control characters except TAB, and everything Python treats as a line break (NEL, U+2028,
# U+2029): none may reach a header.
_CONTROL_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_MIME_POLICY = email_policy.SMTP  # CRLF line endings, headers folded at 78 characters
_PLACEHOLDER_SENDER = "placeholder-sender-address@example.invalid"


# --- addresses ----------------------------------------------------------------------------------

def parse_address(value: str) -> str:
    """Validate one mailbox (``addr@example.com`` or ``Display Name <addr@example.com>``)
    and return its canonical form: the display name kept as given (UTF-8 allowed),
    the address as `email-validator` normalises it, domain in ASCII (punycode).

    Raises `ValueError` saying what is wrong (the caller names the field).
    """
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if _CONTROL_RE.search(value):
        raise ValueError("must not contain CR, LF, NUL or other control characters (header injection)")
    if not value.strip():
        raise ValueError("must not be blank")
    try:
        header = email_policy.default.header_factory("To", value)
    except Exception:  # the stdlib parser gives up on some malformed input with IndexError & co
        raise ValueError("is not a well-formed address") from None
    if header.defects:
        if all(type(d).__name__ == "NonASCIILocalPartDefect" for d in header.defects):
            raise ValueError("has a non-ASCII local part (before the @), which SES does not accept")
        raise ValueError("is not a well-formed address")
    if len(header.groups) != 1 or header.groups[0].display_name is not None or len(header.addresses) != 1:
        raise ValueError("must be exactly one address (use a list for several)")
    mailbox = header.addresses[0]
    try:
        checked = validate_email(mailbox.addr_spec, check_deliverability=False, allow_smtputf8=False)
    except EmailNotValidError as exc:
        raise ValueError(f"is not a valid address ({_without_address(str(exc), mailbox.addr_spec)})") from None
    ascii_address = checked.ascii_email or checked.normalized
    if not mailbox.display_name:
        return ascii_address
    return str(Address(display_name=mailbox.display_name, addr_spec=ascii_address))


def address_of(canonical: str) -> str:
    """The bare address of a canonical mailbox string (display name dropped)."""
    return email_policy.default.header_factory("To", canonical).addresses[0].addr_spec


def encode_address(canonical: str) -> str:
    """A canonical mailbox as SES expects it in API fields: the display name
    RFC 2047-encoded when it is not ASCII ("Amazon SES API v2 reference",
    SendEmail FromEmailAddress: "MIME encoded-word syntax")."""
    mailbox = email_policy.default.header_factory("To", canonical).addresses[0]
    if not mailbox.display_name:
        return mailbox.addr_spec
    return formataddr((mailbox.display_name, mailbox.addr_spec), charset="utf-8")


def _without_address(text: str, address: str) -> str:
    return text.replace(address, "<address>")


def encode_header_value(value: str) -> str:
    """A header value as one line of printable ASCII: as is when it already is,
    else RFC 2047 encoded words (UTF-8)."""
    if value.isascii():
        return value
    return Header(value, "utf-8").encode(maxlinelen=0)


def _header_problem(name: str, value: str) -> str | None:
    """Why the `email` package cannot write `value` as header `name` (None when it can).
    The package parses structured headers by name (address headers such as
    ``Resent-To``, dates, …) and raises IndexError, TypeError, HeaderParseError
    and others on some malformed values; any exception means no."""
    try:
        header = _MIME_POLICY.header_factory(name, value)
        header.fold(policy=_MIME_POLICY)
    except Exception as exc:
        return f"cannot be written as a {name} header ({type(exc).__name__})"
    return None


# --- the payload model --------------------------------------------------------------------------

def _as_attachment(item: Any) -> Any:
    """An `Attachment`, a mapping, or a ``(filename, content[, content_type])`` tuple."""
    if isinstance(item, Attachment):
        return item
    if isinstance(item, tuple) and len(item) in (2, 3):  # (filename, content[, content_type])
        return {"filename": item[0], "content": item[1], **({"content_type": item[2]} if len(item) == 3 else {})}
    return item


class Attachment(BaseModel):
    """One attachment. Give `content` (bytes) at enqueue; it is stored as
    `content_base64` (standard base64). `content_type` defaults to a guess from
    the file name, else ``application/octet-stream``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    filename: str = Field(min_length=1, max_length=255)
    content_type: str = Field(default="", max_length=255, validate_default=True)
    content_base64: str

    @model_validator(mode="before")
    @classmethod
    def _from_bytes(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "content" in data:
            data = dict(data)
            content = data.pop("content")
            if not isinstance(content, (bytes, bytearray, memoryview)):
                raise ValueError("content must be bytes")
            if "content_base64" in data:
                raise ValueError("give content or content_base64, not both")
            data["content_base64"] = base64.b64encode(bytes(content)).decode("ascii")
        return data

    @field_validator("filename")
    @classmethod
    def _filename(cls, v: str) -> str:
        if _CONTROL_RE.search(v) or "\t" in v:
            raise ValueError("must not contain control characters (CR, LF, NUL, …)")
        if "/" in v or "\\" in v:
            raise ValueError("must be a file name, not a path")
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @field_validator("content_base64")
    @classmethod
    def _base64(cls, v: str) -> str:
        try:
            base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("must be standard base64 (RFC 4648 section 4)") from None
        return v

    @field_validator("content_type")
    @classmethod
    def _content_type(cls, v: str, info: ValidationInfo) -> str:
        filename = info.data.get("filename") or ""
        ctype = v or mimetypes.guess_type(filename)[0] or "application/octet-stream"
        parsed = email_policy.default.header_factory("Content-Type", ctype)
        if parsed.defects or "/" not in ctype or parsed.content_type != ctype.strip().lower():
            raise ValueError("must be a MIME type such as application/pdf (type/subtype, no parameters)")
        if parsed.maintype in ("multipart", "message"):
            raise ValueError("must not be multipart/* or message/*")
        return ctype

    @property
    def content(self) -> bytes:
        return base64.b64decode(self.content_base64)


class EmailPayload(BaseModel):
    """The stored email payload (see the module docstring for the JSON shape)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    sender: str | None = Field(default=None, alias="from")
    to: tuple[str, ...] = ()
    cc: tuple[str, ...] = ()
    bcc: tuple[str, ...] = ()
    reply_to: tuple[str, ...] = ()
    subject: str = Field(max_length=MAX_SUBJECT_CHARS)
    html: str | None = None
    text: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    configuration_set: str | None = None
    attachments: tuple[Attachment, ...] = ()

    @field_validator("sender")
    @classmethod
    def _sender(cls, v: str | None) -> str | None:
        return None if v is None else parse_address(v)

    @field_validator("to", "cc", "bcc", "reply_to", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        if isinstance(v, str):  # a single address is accepted as a list of one
            return (v,)
        return v

    @field_validator("to", "cc", "bcc", "reply_to", mode="after")
    @classmethod
    def _addresses(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for i, item in enumerate(v):
            try:
                out.append(parse_address(item))
            except ValueError as exc:
                raise ValueError(f"[{i}] {exc}") from None
        return tuple(out)

    @field_validator("subject")
    @classmethod
    def _subject(cls, v: str) -> str:
        if _CONTROL_RE.search(v):
            raise ValueError("must not contain CR, LF, NUL or other control characters (header injection)")
        # Leading and trailing blanks do not survive a MIME header (RFC 5322 unfolding): drop them
        # here, so the subject is the same whichever way the email is sent.
        v = v.strip()
        if not v:
            raise ValueError("must not be blank")
        return v

    @field_validator("html", "text")
    @classmethod
    def _body(cls, v: str | None) -> str | None:
        if v is not None and "\x00" in v:
            raise ValueError("must not contain the NUL character")
        return v if v else None

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_CUSTOM_HEADERS:
            raise ValueError(f"at most {MAX_CUSTOM_HEADERS} custom headers (SES API v2, Message.Headers)")
        seen: set[str] = set()
        v = {name: value.strip() if isinstance(value, str) else value for name, value in v.items()}
        for name, value in v.items():
            if not _HEADER_NAME_RE.fullmatch(name):
                raise ValueError(f"name {name[:60]!r} must be 1-{MAX_HEADER_NAME_CHARS} printable ASCII "
                                 "characters without a colon (RFC 5322 field-name)")
            lower = name.lower()
            if lower in _RESERVED_HEADERS or lower.startswith(_RESERVED_HEADER_PREFIX):
                raise ValueError(f"{name} is set from the message's own fields or its MIME structure; "
                                 "it cannot be a custom header")
            if lower.startswith("x-ses-"):
                raise ValueError(f"{name}: use tags and configuration_set instead of X-SES-* headers")
            if lower in seen:
                raise ValueError(f"{name} is given twice (header names are case-insensitive)")
            seen.add(lower)
            if not isinstance(value, str):
                raise ValueError(f"{name}: the value must be a string")
            if _CONTROL_RE.search(value):
                raise ValueError(f"{name}: the value must not contain CR, LF, NUL or other control "
                                 "characters (header injection)")
            if len(encode_header_value(value)) > MAX_HEADER_VALUE_CHARS:
                raise ValueError(f"{name}: the value is longer than {MAX_HEADER_VALUE_CHARS} characters "
                                 "once encoded (SES API v2, MessageHeader)")
            problem = _header_problem(name, value)
            if problem:
                raise ValueError(f"{name}: the value {problem}")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_TAGS - 1:
            raise ValueError(f"at most {MAX_TAGS - 1} tags (one more is the outbox message id)")
        for name, value in v.items():
            if not _TAG_RE.fullmatch(name):
                raise ValueError(f"name {name[:60]!r} must be 1-256 ASCII letters, digits, '_' or '-' "
                                 "(SES API v2, MessageTag)")
            if name == OUTBOX_TAG:
                raise ValueError(f"the tag name {OUTBOX_TAG} is reserved for the outbox message id")
            if not isinstance(value, str) or not _TAG_RE.fullmatch(value):
                raise ValueError(f"{name}: the value must be 1-256 ASCII letters, digits, '_' or '-' "
                                 "(SES API v2, MessageTag)")
        return v

    @field_validator("configuration_set")
    @classmethod
    def _configuration_set(cls, v: str | None) -> str | None:
        if v is not None and not _CONFIGURATION_SET_RE.fullmatch(v):
            raise ValueError("must be 1-64 ASCII letters, digits, '_' or '-' (SES configuration set name)")
        return v

    @field_validator("attachments", mode="before")
    @classmethod
    def _attachment_forms(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [_as_attachment(a) for a in v]
        return v

    @field_validator("attachments")
    @classmethod
    def _attachments(cls, v: tuple[Attachment, ...]) -> tuple[Attachment, ...]:
        if len(v) > MAX_ATTACHMENTS:
            raise ValueError(f"at most {MAX_ATTACHMENTS} attachments")
        return v

    # -- derived ---------------------------------------------------------------------------------
    @property
    def recipients(self) -> tuple[str, ...]:
        return self.to + self.cc + self.bcc

    def to_json(self) -> str:
        """The payload as stored: JSON text, keys by alias, empty fields left out."""
        return self.model_dump_json(by_alias=True, exclude_none=True, exclude_defaults=True)


def check_message(m: EmailPayload, *, check_size: bool = True) -> None:
    """Rules across fields (recipients, body and, when `check_size`, the MIME size).
    Raises `InvalidMessageError`."""
    n = len(m.recipients)
    if n == 0:
        raise InvalidMessageError("to", "at least one recipient is required in to, cc or bcc")
    if n > MAX_RECIPIENTS:
        raise InvalidMessageError("to", f"{n} recipients across to, cc and bcc; SES accepts at most "
                                        f"{MAX_RECIPIENTS} per message")
    if m.html is None and m.text is None:
        raise InvalidMessageError("html/text", "an html or a text body is required")
    if not check_size:
        return
    size = len(build_mime(m, sender=m.sender or _PLACEHOLDER_SENDER))  # InvalidMessageError naming the field
    if size > MAX_MESSAGE_BYTES:
        field = "attachments" if m.attachments else "html/text"
        raise InvalidMessageError(field, f"the message is {size} bytes as MIME; SES v2 accepts at most "
                                         f"{MAX_MESSAGE_BYTES} bytes including attachments")


def _field_of(err: Mapping[str, Any]) -> str:
    loc = [p for p in err.get("loc", ()) if p not in ("function-after", "function-before")]
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "message"


def _problem_of(err: Mapping[str, Any]) -> str:
    msg = str(err.get("msg", "invalid"))
    return msg.removeprefix("Value error, ")


def validate_payload(data: Mapping[str, Any]) -> EmailPayload:
    """Validate an email given as Python values (field names or aliases).
    Raises `InvalidMessageError` naming the field, e.g. ``to[1]`` or ``headers``."""
    try:
        m = EmailPayload.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field, problem = _split_index(_field_of(err), _problem_of(err))
        raise InvalidMessageError(field, problem) from None
    except Exception as exc:  # a parser deep inside gave up (IndexError & co): never let it out
        raise InvalidMessageError("message", f"cannot be parsed ({type(exc).__name__})") from None
    check_message(m)
    return m


def load_payload(payload_json: str) -> EmailPayload:
    """Parse and validate a stored payload (JSON text), as the relay does before
    sending. Raises `InvalidMessageError` whose text names the field and the kind
    of problem but never echoes the stored values. The size rule is left to the
    publisher, which measures the raw message it builds anyway."""
    try:
        m = EmailPayload.model_validate_json(payload_json)
    except ValidationError as exc:
        err = exc.errors()[0]
        field, _ = _split_index(_field_of(err), _problem_of(err))
        raise InvalidMessageError(field, f"invalid stored email payload ({err.get('type', 'invalid')})") from None
    except Exception as exc:  # a parser deep inside gave up (IndexError & co): never let it out
        raise InvalidMessageError("message", f"invalid stored email payload ({type(exc).__name__})") from None
    check_message(m, check_size=False)
    return m


def _split_index(field: str, problem: str) -> tuple[str, str]:
    # Address list validators prefix the problem with "[i] ": move the index into the field.
    m = re.match(r"\[(\d+)\] (.*)", problem, re.S)
    if m and field in ("to", "cc", "bcc", "reply_to"):
        return f"{field}[{m.group(1)}]", m.group(2)
    return field, problem


# --- MIME -----------------------------------------------------------------------------------------

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
    msg = EmailMessage(policy=_MIME_POLICY)
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


# --- producer API ---------------------------------------------------------------------------------

def email_row(
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
) -> dict[str, Any]:
    """Validate an email and return the parameters of `sql.INSERT_MESSAGE`.
    Raises `InvalidMessageError` naming the field; see `enqueue_email`."""
    data: dict[str, Any] = {
        "from": sender, "to": to, "cc": cc, "bcc": bcc, "reply_to": reply_to, "subject": subject,
        "html": html, "text": text, "headers": dict(headers or {}), "tags": dict(tags or {}),
        "configuration_set": configuration_set,
        "attachments": list(attachments),
    }
    try:
        payload = validate_payload(data)
    except InvalidMessageError as exc:
        if exc.field == "from":
            raise InvalidMessageError("sender", exc.problem) from None
        raise
    mid = _message_id(message_id)
    if deliver_at is not None and (not isinstance(deliver_at, datetime) or deliver_at.tzinfo is None):
        raise InvalidMessageError("deliver_at", "must be a timezone-aware datetime (a naive one is ambiguous)")
    if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                     or not 1 <= max_attempts <= 1000):
        raise InvalidMessageError("max_attempts", "must be an integer from 1 to 1000")
    return {
        "message_id": mid,
        "channel": Channel.SES.value,
        "destination": payload.configuration_set or DEFAULT_DESTINATION,
        "type": EMAIL_TYPE,
        "key": None,
        "payload": payload.to_json(),
        "headers": None,
        "max_attempts": max_attempts,
        "deliver_at": deliver_at,
    }


def _message_id(value: uuid.UUID | str | None) -> uuid.UUID:
    if value is None:
        return uuid.uuid4()
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidMessageError("message_id", "must be a UUID") from None


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
) -> uuid.UUID:
    """Write a transactional email into the outbox, in the caller's transaction.

    Args:
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction.
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
            nothing and returns it. A fresh UUID4 when omitted.
        deliver_at: timezone-aware time before which it is not sent.
        max_attempts: per-message retry budget (1..1000), else the relay's default.

    Returns:
        The message id (also sent as the SES message tag ``outbox-message-id``).

    Raises:
        InvalidMessageError: a rule is broken; `.field` names the field
            (``to[2]``, ``subject``, ``headers``, ``tags``, ``attachments[0].filename``,
            ``html/text``, …). Nothing is written.
    """
    row = email_row(to=to, subject=subject, html=html, text=text, cc=cc, bcc=bcc, reply_to=reply_to,
                    sender=sender, headers=headers, tags=tags, configuration_set=configuration_set,
                    attachments=attachments, message_id=message_id, deliver_at=deliver_at,
                    max_attempts=max_attempts)
    insert_message(conn, row)
    return row["message_id"]
