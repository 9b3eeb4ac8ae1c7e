"""An email as stored, attachments in standard base64 (keys omitted when empty; docs/channels.md, "The stored
payload"), and its rules ("Validation rules"): the same model validates at enqueue and again when the relay
reads the row, so a payload written by hand that breaks a rule is dead-lettered, never sent."""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from email import policy as email_policy
from importlib import resources
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ...errors import InvalidMessageError
from ..message import refused
from .addresses import CONTROL_RE, encode_header_value, header_problem, parse_address

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
CONFIGURATION_SET_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# RFC 5322 field-name: printable US-ASCII (33–126) except the colon (58).
_HEADER_NAME_RE = re.compile(r"[!-9;-~]{1,%d}" % MAX_HEADER_NAME_CHARS)
_RESERVED_HEADERS = frozenset(h.lower() for h in ("From", "Sender", "To", "Cc", "Bcc", "Reply-To", "Subject", "Date",
                                                  "Message-ID", "MIME-Version", "Return-Path"))
# Every Content-* header describes the MIME structure, which build_mime writes itself.
_RESERVED_HEADER_PREFIX = "content-"
DEFAULT_CONTENT_TYPE = "application/octet-stream"
#: Extension (lower-case ASCII, no dot) -> content type, by a table of ours: the same guess on every machine.
CONTENT_TYPES: dict[str, str] = dict(
    line.split() for line in resources.files(__package__).joinpath("content_types.txt").read_text("utf-8").splitlines()
    if line and not line.startswith("#"))


def guess_content_type(filename: str) -> str:
    extension = posixpath.splitext(filename)[1][1:]
    if not extension.isascii():  # str.lower() folds some non-ASCII letters to ASCII ones (K, the Kelvin sign)
        return DEFAULT_CONTENT_TYPE
    return CONTENT_TYPES.get(extension.lower(), DEFAULT_CONTENT_TYPE)


def as_attachment(item: Any) -> Any:
    """An `Attachment`, a mapping, or a ``(filename, content[, content_type])`` tuple."""
    if isinstance(item, Attachment):
        return item
    if isinstance(item, tuple) and len(item) in (2, 3):
        return {"filename": item[0], "content": item[1], **({"content_type": item[2]} if len(item) == 3 else {})}
    return item


class Attachment(BaseModel):
    """Given `content` (bytes) at enqueue, stored as `content_base64`; `content_type` guessed from the name."""

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
        if CONTROL_RE.search(v) or "\t" in v:
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
        ctype = v or guess_content_type(filename)
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
        return (v,) if isinstance(v, str) else v  # a single address is a list of one

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
        if CONTROL_RE.search(v):
            raise ValueError("must not contain CR, LF, NUL or other control characters (header injection)")
        # Blanks at the ends do not survive a MIME header: the subject is the same whichever way it is sent.
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
            if CONTROL_RE.search(value):
                raise ValueError(f"{name}: the value must not contain CR, LF, NUL or other control "
                                 "characters (header injection)")
            if len(encode_header_value(value)) > MAX_HEADER_VALUE_CHARS:
                raise ValueError(f"{name}: the value is longer than {MAX_HEADER_VALUE_CHARS} characters "
                                 "once encoded (SES API v2, MessageHeader)")
            problem = header_problem(name, value)
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
        if v is not None and not CONFIGURATION_SET_RE.fullmatch(v):
            raise ValueError("must be 1-64 ASCII letters, digits, '_' or '-' (SES configuration set name)")
        return v

    @field_validator("attachments", mode="before")
    @classmethod
    def _attachment_forms(cls, v: Any) -> Any:
        return [as_attachment(a) for a in v] if isinstance(v, (list, tuple)) else v

    @field_validator("attachments")
    @classmethod
    def _attachments(cls, v: tuple[Attachment, ...]) -> tuple[Attachment, ...]:
        if len(v) > MAX_ATTACHMENTS:
            raise ValueError(f"at most {MAX_ATTACHMENTS} attachments")
        return v

    @property
    def recipients(self) -> tuple[str, ...]:
        return self.to + self.cc + self.bcc

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True, exclude_defaults=True)


def check_message(m: EmailPayload) -> None:
    """Rules across fields (the MIME size is `mime.check_size`)."""
    n = len(m.recipients)
    if n == 0:
        raise InvalidMessageError("to", "at least one recipient is required in to, cc or bcc")
    if n > MAX_RECIPIENTS:
        raise InvalidMessageError("to", f"{n} recipients across to, cc and bcc; SES accepts at most "
                                        f"{MAX_RECIPIENTS} per message")
    if m.html is None and m.text is None:
        raise InvalidMessageError("html/text", "an html or a text body is required")


def validate_payload(data: Mapping[str, Any]) -> EmailPayload:
    try:
        m = EmailPayload.model_validate(data)
    except ValidationError as exc:
        raise InvalidMessageError(*_split_index(refused(exc))) from None
    except Exception as exc:  # a parser deep inside gave up (IndexError & co): never let it out
        raise InvalidMessageError("message", f"cannot be parsed ({type(exc).__name__})") from None
    check_message(m)
    return m


def load_payload(payload_json: str) -> EmailPayload:
    """A stored payload, as the relay reads it: errors never echo the stored values, and the size rule is
    left to the publisher, which measures the raw message it builds anyway."""
    try:
        m = EmailPayload.model_validate_json(payload_json)
    except ValidationError as exc:
        field, _ = _split_index(refused(exc))
        kind = exc.errors()[0].get("type", "invalid")
        raise InvalidMessageError(field, f"invalid stored email payload ({kind})") from None
    except Exception as exc:  # a parser deep inside gave up (IndexError & co): never let it out
        raise InvalidMessageError("message", f"invalid stored email payload ({type(exc).__name__})") from None
    check_message(m)
    return m


def _split_index(error: InvalidMessageError) -> tuple[str, str]:
    # Address list validators prefix the problem with "[i] ": move the index into the field.
    field, problem = error.field, error.problem
    m = re.match(r"\[(\d+)\] (.*)", problem, re.S)
    if m and field in ("to", "cc", "bcc", "reply_to"):
        return f"{field}[{m.group(1)}]", m.group(2)
    return field, problem
