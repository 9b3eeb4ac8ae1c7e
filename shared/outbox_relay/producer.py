"""Producer API: write outbox messages inside the caller's transaction.

Call these with the SQLAlchemy `Connection` or `Session` that carries your
business change; the message exists exactly when your transaction commits.
Nothing here commits, opens a connection or reads the environment.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import sql
from .errors import InvalidMessageError
from .models import Channel

#: Largest serialised event payload, bytes (UTF-8 JSON): 256 KiB, the message
#: size limit of Amazon SQS, SNS and EventBridge. Redis accepts far more, but a
#: relay batch holds every payload in memory; put big documents elsewhere
#: (S3) and send a reference.
MAX_EVENT_PAYLOAD_BYTES = 256 * 1024
MAX_NAME_CHARS = 512
# A JSON escape of NUL: \u0000 preceded by an even number of backslashes.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
BULK_CHUNK = 1000


def _json_text(value: Any, field: str, limit: int) -> str:
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
    size = len(encoded)
    if size > limit:
        raise InvalidMessageError(field, f"is {size} bytes as JSON; the limit is {limit} bytes")
    return text


_ID_TAKEN = ("already used by a different message (channel, destination, type, key or payload differ); "
             "an idempotency key must identify one message")


def _check_repeats(rows: list[dict[str, Any]]) -> None:
    """Refuse one message id given twice in one call for two different messages
    (channel, destination, type, key, or payload as the JSON text written)."""
    first: dict[uuid.UUID, int] = {}
    fields = ("channel", "destination", "type", "key", "payload")
    for i, r in enumerate(rows):
        j = first.setdefault(r["message_id"], i)
        if j != i and any(rows[j][f] != r[f] for f in fields):
            raise InvalidMessageError(f"messages[{i}].message_id", _ID_TAKEN)


def insert_message(conn: Any, row: Mapping[str, Any]) -> uuid.UUID:
    """Write one validated message row (`sql.INSERT_MESSAGE` parameters) in the
    caller's transaction and return its message id.

    The message id is an idempotency key: the same message again is a no-op.
    Raises `InvalidMessageError` on field `message_id` when the id is already
    taken by a *different* message (another channel, destination, type, key or
    payload), which would otherwise be dropped silently, also when another
    transaction wrote it at the same time (one more statement, only then).
    """
    inserted, same = conn.execute(sql.INSERT_MESSAGE, row).one()
    if not inserted and same is None:
        # Written by a transaction that committed while this one waited: look again.
        same = conn.execute(sql.SAME_MESSAGE, row).scalar()
    if not inserted and same is False:
        raise InvalidMessageError("message_id", _ID_TAKEN)
    return row["message_id"]


def check_text(value: str) -> str:
    """Refuse what PostgreSQL text cannot store (NUL) and what UTF-8 cannot encode (lone surrogates)."""
    if "\x00" in value:
        raise ValueError("must not contain the NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
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
    return stream


class EventMessage(BaseModel):
    """A domain event for a Redis Stream, as validated at enqueue."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    stream: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    type: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    payload: Any
    key: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    headers: dict[str, str] | None = None
    message_id: uuid.UUID | None = None
    deliver_at: datetime | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=1000)

    @field_validator("stream")
    @classmethod
    def _stream(cls, v: str) -> str:
        if v.strip() != v or not v:
            raise ValueError("must not be blank or have leading/trailing spaces")
        return check_stream_name(check_text(v))

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return check_text(v)

    @field_validator("key")
    @classmethod
    def _key(cls, v: str | None) -> str | None:
        return None if v is None else check_text(v)

    @field_validator("deliver_at")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("must be timezone-aware (a naive datetime is ambiguous)")
        return v


def _validated(model: type[BaseModel], data: Mapping[str, Any]) -> Any:
    try:
        return model(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err.get("loc", ())) or "message"
        raise InvalidMessageError(field, str(err.get("msg", "invalid"))) from None
    except TypeError as exc:
        raise InvalidMessageError("message", str(exc)) from None


def _event_row(data: Mapping[str, Any]) -> dict[str, Any]:
    m: EventMessage = _validated(EventMessage, data)
    payload_text = _json_text(m.payload, "payload", MAX_EVENT_PAYLOAD_BYTES)
    headers_text = _json_text(m.headers, "headers", 64 * 1024) if m.headers else None
    return {
        "message_id": m.message_id or uuid.uuid4(),
        "channel": Channel.REDIS.value,
        "destination": m.stream,
        "type": m.type,
        "key": m.key,
        "payload": payload_text,
        "headers": headers_text,
        "max_attempts": m.max_attempts,
        "deliver_at": m.deliver_at,
    }


def enqueue_event(
    conn: Any,
    *,
    stream: str,
    type: str,
    payload: Any,
    key: str | None = None,
    message_id: uuid.UUID | str | None = None,
    deliver_at: datetime | None = None,
    max_attempts: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> uuid.UUID:
    """Write a domain event for the Redis Stream `stream`, in the caller's transaction.

    Args:
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction.
        stream: stream key (non-empty; braces only as a Redis Cluster hash tag).
        type: event type, e.g. ``"order.placed"`` (non-empty).
        payload: any JSON-serialisable value, at most 256 KiB as UTF-8 JSON; NaN
            and the NUL character are refused.
        key: optional ordering/partition key, published as the entry's `key` field.
        message_id: idempotency key; enqueueing the same id again writes
            nothing and returns it. A fresh UUID4 when omitted.
        deliver_at: timezone-aware time before which it is not delivered.
        max_attempts: per-message retry budget (1..1000), else the relay's default.
        headers: optional string metadata, published as the `headers` field (JSON).

    Returns:
        The message id.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    row = _event_row({
        "stream": stream, "type": type, "payload": payload, "key": key, "headers": headers,
        "message_id": message_id, "deliver_at": deliver_at, "max_attempts": max_attempts,
    })
    return insert_message(conn, row)


def enqueue_events_bulk(conn: Any, messages: Iterable[Mapping[str, Any]]) -> list[uuid.UUID]:
    """Write many domain events in the caller's transaction, one statement per
    chunk of 1,000 messages.

    Each element is a mapping with the keyword arguments of `enqueue_event`
    (`stream`, `type`, `payload`, optional `key`, `message_id`, `deliver_at`,
    `max_attempts`, `headers`). Every message is validated before anything is
    written; an invalid one raises `InvalidMessageError` whose field is prefixed
    with its position, e.g. ``messages[3].payload``. Returns the message ids in order.

    Message ids are idempotency keys, as for `enqueue_event`: an id already
    written with the same message (channel, stream, type, key, payload) is
    skipped, and so is the same message twice in one call. An id used for a
    *different* message, earlier or in this call, raises `InvalidMessageError`
    on ``messages[i].message_id`` (after the statement of its chunk ran: the
    caller's transaction must not commit, which leaving its `with` block by
    the exception ensures).
    """
    rows = []
    for i, data in enumerate(messages):
        try:
            rows.append(_event_row(data))
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"messages[{i}].{exc.field}", exc.problem) from None
    _check_repeats(rows)
    for start in range(0, len(rows), BULK_CHUNK):
        chunk = [
            {**r, "i": i, "message_id": str(r["message_id"]),
             "deliver_at": r["deliver_at"].isoformat() if r["deliver_at"] is not None else None}
            for i, r in enumerate(rows[start:start + BULK_CHUNK])
        ]
        skipped = conn.execute(sql.INSERT_MESSAGES_BULK,
                               {"messages": json.dumps(chunk, ensure_ascii=False)}).all()
        taken = [i for i, same in skipped if same is False]
        unseen = [chunk[i] for i, same in skipped if same is None]
        if unseen and not taken:
            # Ids written by a transaction that committed while this one waited: look again.
            taken = conn.execute(sql.SAME_MESSAGES,
                                 {"messages": json.dumps(unseen, ensure_ascii=False)}).scalars().all()
        if taken:
            raise InvalidMessageError(f"messages[{start + min(taken)}].message_id", _ID_TAKEN)
    return [r["message_id"] for r in rows]
