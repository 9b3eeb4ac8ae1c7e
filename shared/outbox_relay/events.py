"""Domain events for the Redis channel: the message as validated at enqueue,
and the JSON text of payloads and headers exactly as they will reach the stream."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Mapping

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import InvalidMessageError
from .ids import uuid7
from .models import Channel

#: Largest serialised event payload, bytes (UTF-8 JSON): 256 KiB, the message
#: size limit of Amazon SQS, SNS and EventBridge. Redis accepts far more, but a
#: relay batch holds every payload in memory; put big documents elsewhere
#: (S3) and send a reference.
MAX_EVENT_PAYLOAD_BYTES = 256 * 1024
MAX_NAME_CHARS = 512
#: A `deliver_at` is accepted within this much of the producer's clock, either way
#: (docs/decisions/0013-deliver-at-within-a-year.md): further ahead the outbox
#: would be a long-term scheduler; further behind it is a mistake (datetime.min,
#: the epoch), not a due time. A past one is stored as the database's now().
DELIVER_AT_WINDOW = timedelta(days=366)
# A JSON escape of NUL: \u0000 preceded by an even number of backslashes.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def json_text(value: Any, field: str, limit: int) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(field, f"must be JSON-serialisable ({exc})") from None
    except RecursionError:
        raise InvalidMessageError(field, "is nested too deeply to serialise") from None
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessageError(field, "must be valid Unicode (no lone surrogates)") from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        # The NUL character (\u0000): the idempotency check compares payloads as
        # jsonb, which refuses it ("JSON Types", PostgreSQL documentation).
        raise InvalidMessageError(field, "must not contain the NUL character (\\u0000)")
    if "{" in text:
        _check_keys(value, field)
    size = len(encoded)
    if size > limit:
        raise InvalidMessageError(field, f"is {size} bytes as JSON; the limit is {limit} bytes")
    return text


def _check_keys(value: Any, field: str) -> None:
    """Refuse an object key that is not a string: json.dumps would write 1, True or
    None as "1", "true", "null", and types are not converted (README)."""
    stack = [(value, field)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    raise InvalidMessageError(at, f"has a key of type {type(key).__name__}: JSON object keys are "
                                                  "strings, and types are not converted")
                stack.append((inner, f"{at}.{key}"))
        elif isinstance(item, (list, tuple)):
            stack.extend((inner, f"{at}[{i}]") for i, inner in enumerate(item))


def payload_text(value: Any, limit: int) -> str:
    """The payload's JSON text. None is refused (decision 0057): it is what a payload
    left unset looks like, and would be stored as JSON null. The SQL functions refuse
    a NULL or null payload at the same point, with the same words."""
    if value is None:
        raise InvalidMessageError("payload", "is required (a null payload is refused); send a JSON value such as {}")
    return json_text(value, "payload", limit)


def check_text(value: str) -> str:
    """Refuse what PostgreSQL text cannot store (NUL) and what UTF-8 cannot encode (lone surrogates)."""
    if "\x00" in value:
        raise ValueError("must not contain the NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


def check_key(value: str | None) -> str | None:
    """An ordering key as stored: None for none, else non-empty text of at most
    `MAX_NAME_CHARS` characters. An empty key would reach a stream without a `key`
    field, as no key does, while ordering would treat it as a key of its own."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if value == "":
        raise ValueError("must not be empty; leave it out for a message without a key")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"must be at most {MAX_NAME_CHARS} characters")
    return check_text(value)


def check_deliver_at(value: datetime, now: datetime | None = None) -> datetime:
    """Refuse a naive `deliver_at` and one outside `DELIVER_AT_WINDOW` of `now`
    (default: the current time). Raises ValueError saying which."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must be timezone-aware (a naive datetime is ambiguous)")
    now = now or datetime.now(timezone.utc)
    days = DELIVER_AT_WINDOW.days
    if value > now + DELIVER_AT_WINDOW:
        raise ValueError(f"is more than {days} days ahead; the outbox schedules at most {days} days ahead")
    if value < now - DELIVER_AT_WINDOW:
        raise ValueError(f"is more than {days} days in the past (a past deliver_at within {days} days means now)")
    return value


def check_stream_name(stream: str) -> str:
    """Validate a Redis stream name. Braces are allowed only as a Redis Cluster
    hash tag (`{tag}`, "Redis cluster specification", key distribution model),
    so the dedupe key can be placed in the stream's hash slot."""
    open_ = stream.find("{")
    if open_ == -1:
        if "}" in stream:
            raise ValueError("'}' is allowed only to close a Redis Cluster hash tag {…}")
        return stream
    close = stream.find("}", open_ + 1)
    if close == -1 or close == open_ + 1:
        raise ValueError("'{' must open a non-empty Redis Cluster hash tag {…}")
    if "}" in stream[:open_]:
        raise ValueError("'}' is allowed only to close a Redis Cluster hash tag {…}")
    if "{" in stream[close + 1:] or "}" in stream[close + 1:]:
        raise ValueError("braces are allowed only as one Redis Cluster hash tag {…}")
    return stream


def _not_blank(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be blank")
    return check_text(v)


def _aware(v: datetime | None) -> datetime | None:
    if v is not None and (v.tzinfo is None or v.utcoffset() is None):
        raise ValueError("must be timezone-aware (a naive datetime is ambiguous)")
    return v


# The fields every channel's message shares, as the producer API validates them.
MessageType = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), AfterValidator(_not_blank)]
OrderingKey = Annotated[str | None, Field(max_length=MAX_NAME_CHARS), AfterValidator(check_key)]
# Strict: documented as a datetime and an int, so text ("2026-12-02T00:00:00+00:00",
# "3"), epoch seconds, floats and booleans are refused rather than converted.
DeliverAt = Annotated[datetime | None, Field(strict=True), AfterValidator(_aware)]
MaxAttempts = Annotated[int | None, Field(ge=1, le=1000, strict=True)]


class EventMessage(BaseModel):
    """A domain event for a Redis Stream, as validated at enqueue."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    stream: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    type: MessageType
    payload: Any
    key: OrderingKey = None
    headers: dict[str, str] | None = None
    message_id: uuid.UUID | None = None
    deliver_at: DeliverAt = None
    max_attempts: MaxAttempts = None

    @field_validator("stream")
    @classmethod
    def _stream(cls, v: str) -> str:
        if v.strip() != v or not v:
            raise ValueError("must not be blank or have leading/trailing spaces")
        return check_stream_name(check_text(v))


def validated(model: type[BaseModel], data: Mapping[str, Any]) -> Any:
    try:
        return model(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err.get("loc", ())) or "message"
        raise InvalidMessageError(field, str(err.get("msg", "invalid")).removeprefix("Value error, ")) from None
    except TypeError as exc:
        raise InvalidMessageError("message", str(exc)) from None


def event_row(data: Mapping[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """Validate one event and return the parameters of `sql.producer.insert_message`.
    `now` is the time `deliver_at` is checked against (default: the current time;
    a bulk call passes one time to every message). Raises `InvalidMessageError`."""
    m: EventMessage = validated(EventMessage, data)
    if m.deliver_at is not None:
        try:
            check_deliver_at(m.deliver_at, now)
        except ValueError as exc:
            raise InvalidMessageError("deliver_at", str(exc)) from None
    text = payload_text(m.payload, MAX_EVENT_PAYLOAD_BYTES)
    headers_text = json_text(m.headers, "headers", 64 * 1024) if m.headers else None
    return {
        "message_id": m.message_id or uuid7(),
        "channel": Channel.REDIS.value,
        "destination": m.stream,
        "type": m.type,
        "key": m.key,
        "payload": text,
        "headers": headers_text,
        "max_attempts": m.max_attempts,
        "deliver_at": m.deliver_at,
    }
