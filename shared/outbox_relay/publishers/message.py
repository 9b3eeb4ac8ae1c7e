"""What every channel's message shares, and the JSON text of payloads and headers exactly as they will be sent."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Callable, Mapping

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ..errors import InvalidMessageError
from ..ids import check_not_ahead, uuid7
from ..tracing import TRACESTATE, with_context

MAX_NAME_CHARS = 512
#: Largest headers of a message, bytes of JSON.
MAX_HEADERS_BYTES = 64 * 1024
#: A `deliver_at` further from the producer's clock is a mistake or a long-term schedule (decision 0013).
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
        # The idempotency check compares payloads as jsonb, which refuses NUL ("JSON Types", PostgreSQL).
        raise InvalidMessageError(field, "must not contain the NUL character (\\u0000)")
    if "{" in text:
        _check_keys(value, field)
    size = len(encoded)
    if size > limit:
        raise InvalidMessageError(field, f"is {size} bytes as JSON; the limit is {limit} bytes")
    return text


def _check_keys(value: Any, field: str) -> None:
    """Refuse a non-string object key: json.dumps would write 1, True or None as "1", "true", "null"."""
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
    """None is refused as the SQL functions do (decision 0057): it is what a payload left unset looks like."""
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
    """An empty key would reach a stream as no key does, while ordering would treat it as a key."""
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
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must be timezone-aware (a naive datetime is ambiguous)")
    now = now or datetime.now(timezone.utc)
    days = DELIVER_AT_WINDOW.days
    if value > now + DELIVER_AT_WINDOW:
        raise ValueError(f"is more than {days} days ahead; the outbox schedules at most {days} days ahead")
    if value < now - DELIVER_AT_WINDOW:
        raise ValueError(f"is more than {days} days in the past (a past deliver_at within {days} days means now)")
    return value


def _not_blank(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be blank")
    return check_text(v)


OrderingKey = Annotated[str | None, Field(max_length=MAX_NAME_CHARS), AfterValidator(check_key)]
# Strict: documented as a datetime and an int, so text, epoch seconds, floats and booleans are refused.
DeliverAt = Annotated[datetime | None, Field(strict=True)]
MaxAttempts = Annotated[int | None, Field(ge=1, le=1000, strict=True)]


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: OrderingKey = None
    message_id: uuid.UUID | None = None
    deliver_at: DeliverAt = None
    max_attempts: MaxAttempts = None


class Message(Envelope):
    """A message of a type, a JSON payload and string headers (a channel's own adds its fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    type: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), AfterValidator(_not_blank)]
    payload: Any
    headers: dict[str, str] | None = None


#: The order the SQL enqueue functions check fields in, so both name the same one first.
CHECK_ORDER = {name: i for i, name in enumerate(
    ("stream", "type", "payload", "key", "headers", "message_id", "deliver_at", "max_attempts"))}


def refused(exc: ValidationError, order: Mapping[str, int] | None = None) -> InvalidMessageError:
    """The first error (in `order`, by top-level field), naming the field as written (``to[1]``)."""
    errors = exc.errors()
    if order:
        errors = sorted(errors, key=lambda e: order.get(str(e["loc"][0]) if e.get("loc") else "", len(order)))
    err = errors[0]
    field = ""
    for part in err.get("loc", ()):
        if isinstance(part, int):
            field += f"[{part}]"
        elif part not in ("function-after", "function-before"):
            field += ("." if field else "") + str(part)
    return InvalidMessageError(field or "message", str(err.get("msg", "invalid")).removeprefix("Value error, "))


def validated(model: type[BaseModel], data: Mapping[str, Any], now: datetime | None = None) -> Any:
    """`data` as `model`, its `deliver_at` checked against `now` (a bulk call passes one to every message)."""
    try:
        m = model(**data)
    except ValidationError as exc:
        raise refused(exc, CHECK_ORDER if issubclass(model, Message) else None) from None
    except TypeError as exc:
        raise InvalidMessageError("message", str(exc)) from None
    if m.message_id is not None:
        try:
            check_not_ahead(m.message_id, now or datetime.now(timezone.utc))
        except ValueError as exc:
            raise InvalidMessageError("message_id", str(exc)) from None
    if m.deliver_at is not None:
        try:
            check_deliver_at(m.deliver_at, now)
        except ValueError as exc:
            raise InvalidMessageError("deliver_at", str(exc)) from None
    return m


def message_row(m: Message | Envelope, channel: str, destination: str, payload: str, type_: str | None = None,
                headers: str | None = None) -> dict[str, Any]:
    """The parameters of `sql.producer.insert_message`."""
    if isinstance(m, Message):
        type_ = m.type
        headers = json_text(m.headers, "headers", MAX_HEADERS_BYTES) if m.headers else None
    return {
        "message_id": m.message_id or uuid7(),
        "channel": channel,
        "destination": destination,
        "type": type_,
        "key": m.key,
        "payload": payload,
        "headers": headers,
        "max_attempts": m.max_attempts,
        "deliver_at": m.deliver_at,
    }


def traced_row(build: Callable[[Mapping[str, Any], datetime | None], dict[str, Any]], fields: Mapping[str, Any],
               now: datetime | None, context: Mapping[str, str] | None,
               max_headers: int | None = None) -> dict[str, Any]:
    """`build`'s row with the trace `context` in its headers where it still fits (within
    `max_headers` and the size limit): a context never makes a valid message invalid."""
    row = build(fields, now)
    headers, context = fields.get("headers"), dict(context or {})
    if max_headers is not None and len(headers or {}) + len(context) > max_headers:
        context.pop(TRACESTATE, None)
        if len(headers or {}) + len(context) > max_headers:
            return row
    traced = with_context(headers, context)
    if traced is headers:
        return row
    try:
        return build({**fields, "message_id": row["message_id"], "headers": traced}, now)
    except InvalidMessageError:
        return row
