"""Producer API, both channels: write outbox messages inside the caller's transaction.

Call these with the SQLAlchemy `Connection` or `Session` that carries your
business change; the message exists exactly when your transaction commits.
Nothing here commits or opens a connection; the environment is read only for
the Lambda X-Ray trace header (`tracing.current_context`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from sqlalchemy.engine import Engine

from . import sql
from .aws_messages import MAX_HEADERS, aws_row
from .email.mime import check_size
from .email.payload import DEFAULT_DESTINATION, EMAIL_TYPE, validate_payload
from .errors import InvalidMessageError
from .events import check_deliver_at, check_key, event_row
from .ids import uuid7
from .models import Channel
from .publishers.registry import spec_for
from .tracing import current_context, with_context

#: Most messages in one bulk statement.
BULK_CHUNK = 1000
#: Most payload and header JSON text in one bulk statement, bytes, so a bulk call
#: holds about one statement's text at a time (a few copies of it: the texts, the
#: statement's JSON array, its encoding), whatever the number of messages.
BULK_CHUNK_BYTES = 8 * 1024 * 1024


_ID_TAKEN = ("already used by a different message (channel, destination, type, key or payload differ); "
             "an idempotency key must identify one message")


class _Number:
    """A JSON number compared by value, as jsonb compares them (1 = 1.0 = 1e0), and
    never equal to a boolean (Python's True == 1 is not JSON's)."""

    __slots__ = ("value",)

    def __init__(self, text: str) -> None:
        self.value = Decimal(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Number) and self.value == other.value

    __hash__ = None  # type: ignore[assignment]


def _same_json(a: str, b: str) -> bool:
    """Whether two JSON texts hold the same value as PostgreSQL's `jsonb` compares
    them (the comparison with a stored message, `same_message_as_m`): key order and
    spacing do not matter, numbers compare by value, a repeated key keeps its last value."""
    if a == b:
        return True
    try:
        return json.loads(a, parse_int=_Number, parse_float=_Number) == \
            json.loads(b, parse_int=_Number, parse_float=_Number)
    except RecursionError:  # nested deeper than the comparison can go: the texts differ, so refuse
        return False


class _Holder(NamedTuple):
    """The first message given a caller's message id in one bulk call: its position,
    the fields that make it the same message, and a digest of its payload text."""

    position: int
    fields: tuple[Any, ...]
    digest: bytes


def _check_repeats(data: Sequence[Mapping[str, Any]], holders: dict[uuid.UUID, _Holder], i: int,
                   row: Mapping[str, Any], now: datetime) -> None:
    """Refuse message `i` when its id was given earlier in the call to a different
    message: another channel, destination, type or key, or a payload that is another
    JSON value (compared as `jsonb` compares, as against a stored message; headers are
    not compared). Only the digest of a holder's payload is kept; its text is made
    again when the digests differ."""
    fields = (row["channel"], row["destination"], row["type"], row["key"])
    digest = hashlib.sha256(row["payload"].encode("utf-8")).digest()
    holder = holders.setdefault(row["message_id"], _Holder(i, fields, digest))
    if holder.position == i or (holder.fields == fields and holder.digest == digest):
        return
    if holder.fields != fields or not _same_json(event_row(data[holder.position], now)["payload"], row["payload"]):
        raise InvalidMessageError(f"messages[{i}].message_id", _ID_TAKEN)


def check_conn(conn: Any) -> None:
    """Refuse what cannot carry the caller's transaction, naming `conn`: None, an
    Engine (no transaction of its own), or a DB-API connection (pg8000's, sqlite3's:
    they take neither SQLAlchemy statements nor its named parameters)."""
    if conn is not None and not isinstance(conn, Engine) and callable(getattr(conn, "execute", None)) \
            and not hasattr(conn, "cursor"):
        return
    kind = f"{type(conn).__module__}.{type(conn).__qualname__}"
    what = ("None" if conn is None else
            "an Engine (pass the conn of `with engine.begin() as conn:`)" if isinstance(conn, Engine) else
            f"a DB-API connection ({kind})" if hasattr(conn, "cursor") else f"a {kind}")
    raise InvalidMessageError("conn", f"must be the SQLAlchemy Connection or Session of your open transaction, "
                                      f"not {what}")


def _check_registered(channel: str) -> None:
    """The schema takes any channel name (migration 0007): the registry says which exist."""
    try:
        spec_for(channel)
    except KeyError as exc:
        raise InvalidMessageError("channel", str(exc.args[0])) from None


def insert_message(conn: Any, row: Mapping[str, Any]) -> uuid.UUID:
    """Write one validated message row (`sql.producer.insert_message` parameters) in the
    caller's transaction and return its message id.

    The message id is an idempotency key: the same message again is a no-op.
    Raises `InvalidMessageError` on field `message_id` when the id is already
    taken by a *different* message (another channel, destination, type, key or
    payload), which would otherwise be dropped silently, also when another
    transaction wrote it at the same time (one more statement, only then).
    """
    _check_registered(row["channel"])
    inserted, same = conn.execute(sql.producer.insert_message, row).one()
    if not inserted and same is None:
        # Written by a transaction that committed while this one waited: look again.
        same = conn.execute(sql.producer.same_message, row).scalar()
    if not inserted and same is False:
        raise InvalidMessageError("message_id", _ID_TAKEN)
    return row["message_id"]


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
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction
            (anything else, an Engine or a DB-API connection included, is refused:
            `InvalidMessageError` on ``conn``).
        stream: stream key (non-empty; braces only as a Redis Cluster hash tag).
        type: event type, e.g. ``"order.placed"`` (non-empty).
        payload: any JSON-serialisable value, at most 256 KiB as UTF-8 JSON; NaN
            and the NUL character are refused.
        key: optional ordering/partition key, published as the entry's `key` field;
            not empty (leave it out for no key).
        message_id: idempotency key; enqueueing the same id again writes
            nothing and returns it. A fresh UUIDv7 when omitted.
        deliver_at: timezone-aware `datetime` before which it is not delivered, at most
            366 days ahead; a past one (at most 366 days back) means now. Text and
            numbers are refused, not parsed.
        max_attempts: per-message retry budget, an `int` from 1 to 1000 (text, floats
            and booleans are refused), else the relay's default.
        headers: optional string metadata, published as the `headers` field (JSON).

    Returns:
        The message id.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    check_conn(conn)
    row = event_row({
        "stream": stream, "type": type, "payload": payload, "key": key,
        "headers": with_context(headers, current_context()),
        "message_id": message_id, "deliver_at": deliver_at, "max_attempts": max_attempts,
    })
    return insert_message(conn, row)


def enqueue_events_bulk(conn: Any, messages: Iterable[Mapping[str, Any]]) -> list[uuid.UUID]:
    """Write many domain events in the caller's transaction, one statement per
    chunk of at most 1,000 messages and 8 MiB of payload and header JSON text
    (`BULK_CHUNK`, `BULK_CHUNK_BYTES`).

    Each element is a mapping with the keyword arguments of `enqueue_event`
    (`stream`, `type`, `payload`, optional `key`, `message_id`, `deliver_at`,
    `max_attempts`, `headers`). Every message is validated before anything is
    written (an iterator is read into a list first); an invalid one raises
    `InvalidMessageError` whose field is prefixed with its position, e.g.
    ``messages[3].payload``. Returns the message ids in order.

    Memory: the JSON text is made twice, once to validate (and kept only for the
    first chunk) and once per chunk to write, so beyond the caller's own messages
    a call holds one chunk's text a few times over, not every message's.

    Message ids are idempotency keys, as for `enqueue_event`: an id already
    written with the same message (channel, stream, type, key, payload as a JSON
    value) is skipped, and so is the same message twice in one call. An id used
    for a *different* message in this call is refused before anything is
    written; one used earlier raises `InvalidMessageError` on
    ``messages[i].message_id`` after the statement of its chunk ran (the
    caller's transaction must not commit, which leaving its `with` block by the
    exception ensures).
    """
    check_conn(conn)
    data = messages if isinstance(messages, Sequence) else list(messages)
    context = current_context()  # one context for the call: every message was made in it
    if context:
        data = [_traced(item, context) for item in data]
    now = datetime.now(timezone.utc)  # one time for every deliver_at, in both passes
    ids: list[uuid.UUID] = []
    holders: dict[uuid.UUID, _Holder] = {}
    ends: list[int] = []  # where each chunk ends (exclusive)
    first_rows: list[dict[str, Any]] = []  # the first chunk's rows, written without making them again
    count = size = 0
    for i, item in enumerate(data):
        try:
            row = event_row(item, now)
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"messages[{i}].{exc.field}", exc.problem) from None
        if isinstance(item, Mapping) and item.get("message_id") is not None:  # generated ids never repeat
            _check_repeats(data, holders, i, row, now)
        ids.append(row["message_id"])
        n = len(row["payload"].encode("utf-8")) + (len(row["headers"].encode("utf-8")) if row["headers"] else 0)
        if count and (count == BULK_CHUNK or size + n > BULK_CHUNK_BYTES):
            ends.append(i)
            count = size = 0
        count, size = count + 1, size + n
        if not ends:
            first_rows.append(row)
    if count:
        ends.append(len(data))
    start = 0
    for end in ends:
        rows = first_rows if start == 0 else [dict(event_row(data[k], now), message_id=ids[k])
                                              for k in range(start, end)]
        _insert_chunk(conn, start, rows)  # empties `rows`
        start = end
    return ids


def _traced(item: Any, context: Mapping[str, str]) -> Any:
    """A bulk element with the trace context in its headers (anything else is left for
    `event_row` to refuse, naming it)."""
    if not isinstance(item, Mapping):
        return item
    return {**item, "headers": with_context(item.get("headers"), context)}


def _insert_chunk(conn: Any, start: int, rows: list[dict[str, Any]]) -> None:
    """Write the validated `rows` of positions `start`… in one statement (emptying
    `rows`); raise on the first one whose id is held by a different message."""
    for channel in {r["channel"] for r in rows}:
        _check_registered(channel)
    messages = json.dumps([
        {**r, "i": i, "message_id": str(r["message_id"]),
         "deliver_at": r["deliver_at"].isoformat() if r["deliver_at"] is not None else None}
        for i, r in enumerate(rows)
    ], ensure_ascii=False)
    rows.clear()  # the texts now live in `messages` only
    skipped = conn.execute(sql.producer.insert_messages_bulk, {"messages": messages}).all()
    taken = [i for i, same in skipped if same is False]
    unseen = [i for i, same in skipped if same is None]
    if unseen and not taken:
        # Ids written by a transaction that committed while this one waited: look again.
        chunk = json.loads(messages)
        taken = conn.execute(sql.producer.same_messages,
                             {"messages": json.dumps([chunk[i] for i in unseen], ensure_ascii=False)}
                             ).scalars().all()
    if taken:
        raise InvalidMessageError(f"messages[{start + min(taken)}].message_id", _ID_TAKEN)


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
    key: str | None = None,
) -> dict[str, Any]:
    """Validate an email and return the parameters of `sql.producer.insert_message`.
    Raises `InvalidMessageError` naming the field; see `enqueue_email`."""
    data: dict[str, Any] = {
        "from": sender, "to": to, "cc": cc, "bcc": bcc, "reply_to": reply_to, "subject": subject,
        "html": html, "text": text, "headers": dict(headers or {}), "tags": dict(tags or {}),
        "configuration_set": configuration_set,
        "attachments": list(attachments),
    }
    try:
        payload = validate_payload(data)
        check_size(payload)
    except InvalidMessageError as exc:
        if exc.field == "from":
            raise InvalidMessageError("sender", exc.problem) from None
        raise
    mid = _message_id(message_id)
    try:
        key = check_key(key)
    except ValueError as exc:
        raise InvalidMessageError("key", str(exc)) from None
    if deliver_at is not None:
        if not isinstance(deliver_at, datetime):
            raise InvalidMessageError("deliver_at", "must be a timezone-aware datetime")
        try:
            check_deliver_at(deliver_at)
        except ValueError as exc:
            raise InvalidMessageError("deliver_at", str(exc)) from None
    if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                     or not 1 <= max_attempts <= 1000):
        raise InvalidMessageError("max_attempts", "must be an integer from 1 to 1000")
    return {
        "message_id": mid,
        "channel": Channel.SES.value,
        "destination": payload.configuration_set or DEFAULT_DESTINATION,
        "type": EMAIL_TYPE,
        "key": key,
        "payload": payload.to_json(),
        "headers": None,
        "max_attempts": max_attempts,
        "deliver_at": deliver_at,
    }


def _message_id(value: uuid.UUID | str | None) -> uuid.UUID:
    if value is None:
        return uuid7()
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
    check_conn(conn)
    row = email_row(to=to, subject=subject, html=html, text=text, cc=cc, bcc=bcc, reply_to=reply_to,
                    sender=sender, headers=headers, tags=tags, configuration_set=configuration_set,
                    attachments=attachments, message_id=message_id, deliver_at=deliver_at,
                    max_attempts=max_attempts, key=key)
    context = current_context()
    if context:
        # In the message headers, as for every channel; the relay adds them to the email's headers.
        row["headers"] = json.dumps(context, separators=(",", ":"))
    insert_message(conn, row)
    return row["message_id"]


def _enqueue_aws(conn: Any, channel: Channel, fields: dict[str, Any]) -> uuid.UUID:
    check_conn(conn)
    data = {k: v for k, v in fields.items() if v is not None or k == "payload"}
    row = aws_row(channel, data)
    context = current_context()
    if context:
        row = _aws_traced(channel, data, row, context)
    return insert_message(conn, row)


def _aws_traced(channel: Channel, data: dict[str, Any], row: dict[str, Any],
                context: Mapping[str, str]) -> dict[str, Any]:
    """The row with the trace context, where it fits: EventBridge keeps it beside the
    source (sent as the entry's TraceHeader); SQS and SNS as attributes, only when the
    message keeps within ten attributes and 256 KiB with them (a context never makes a
    valid message invalid)."""
    if channel is Channel.EVENTBRIDGE:
        stored = json.loads(row["headers"]) if row["headers"] else {}
        row["headers"] = json.dumps({**stored, **context}, separators=(",", ":"))
        return row
    headers = data.get("headers")
    if isinstance(headers, Mapping) and "traceparent" in headers:
        return row
    context = dict(context)
    if len(headers or {}) + len(context) > MAX_HEADERS:
        context.pop("tracestate", None)
    if len(headers or {}) + len(context) > MAX_HEADERS:
        return row
    try:
        return aws_row(channel, {**data, "message_id": row["message_id"], "headers": with_context(headers, context)})
    except InvalidMessageError:
        return row


def enqueue_sqs(
    conn: Any,
    *,
    type: str,
    payload: Any,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: uuid.UUID | str | None = None,
    deliver_at: datetime | None = None,
    max_attempts: int | None = None,
) -> uuid.UUID:
    """Write a message for the SQS relay's queue (OUTBOX_SQS_QUEUE_URL), in the caller's transaction.

    Args:
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction.
        type: the message's type, sent as the `outbox-type` attribute (non-empty).
        payload: any JSON-serialisable value: the message body, as JSON. With its
            attributes the message is at most 256 KiB; SQS takes only XML characters.
        key: optional ordering key: sent in order, as the `outbox-key` attribute, and
            as the ``MessageGroupId`` on a FIFO queue.
        headers: at most 7 string attributes (name → non-empty value); the relay adds
            `outbox-message-id`, `outbox-type` and `outbox-key`.
        message_id, deliver_at, max_attempts: as for `enqueue_event`. The message id is
            the `outbox-message-id` attribute, and the ``MessageDeduplicationId`` on a FIFO queue.

    Returns:
        The message id.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    return _enqueue_aws(conn, Channel.SQS, {
        "type": type, "payload": payload, "key": key, "headers": headers, "message_id": message_id,
        "deliver_at": deliver_at, "max_attempts": max_attempts})


def enqueue_sns(
    conn: Any,
    *,
    type: str,
    payload: Any,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: uuid.UUID | str | None = None,
    deliver_at: datetime | None = None,
    max_attempts: int | None = None,
) -> uuid.UUID:
    """Write a message for the SNS relay's topic (OUTBOX_SNS_TOPIC_ARN), in the caller's transaction.

    The fields are those of `enqueue_sqs`: the payload JSON is the SNS ``Message``, the
    rest are message attributes, and on a FIFO topic the key is the ``MessageGroupId``
    and the message id the ``MessageDeduplicationId``.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    return _enqueue_aws(conn, Channel.SNS, {
        "type": type, "payload": payload, "key": key, "headers": headers, "message_id": message_id,
        "deliver_at": deliver_at, "max_attempts": max_attempts})


def enqueue_eventbridge(
    conn: Any,
    *,
    type: str,
    payload: Mapping[str, Any],
    source: str | None = None,
    bus: str | None = None,
    key: str | None = None,
    message_id: uuid.UUID | str | None = None,
    deliver_at: datetime | None = None,
    max_attempts: int | None = None,
) -> uuid.UUID:
    """Write an event for Amazon EventBridge, in the caller's transaction.

    Args:
        conn: SQLAlchemy `Connection` or `Session` in the caller's open transaction.
        type: the event's detail-type (non-empty).
        payload: a JSON object: the event's detail. The relay adds the message id to it
            as `outbox-message-id` (a name the payload must not use). Detail, detail-type,
            source and time together are at most 256 KiB.
        source: the event's source (not starting with ``aws.``); else OUTBOX_EVENTBRIDGE_SOURCE.
        bus: the event bus, a name or an ARN; else OUTBOX_EVENTBRIDGE_BUS. The relay's
            IAM policy must allow it (the template allows the relay's own bus only).
        key: optional ordering key: events of one key are put in order.
        message_id, deliver_at, max_attempts: as for `enqueue_event`.

    Returns:
        The message id.

    Raises:
        InvalidMessageError: a field is invalid; `.field` names it. Nothing is written.
    """
    return _enqueue_aws(conn, Channel.EVENTBRIDGE, {
        "type": type, "payload": payload, "source": source, "bus": bus, "key": key, "message_id": message_id,
        "deliver_at": deliver_at, "max_attempts": max_attempts})
