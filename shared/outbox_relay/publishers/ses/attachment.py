"""An email attachment: a file name, a MIME type and the content, stored as standard base64."""

from __future__ import annotations

import base64
import binascii
import posixpath
from email import policy as email_policy
from importlib import resources
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .addresses import CONTROL_RE

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
