"""Producer API, every channel: messages written in the caller's transaction (its SQLAlchemy
`Connection` or `Session`), so they exist exactly when it commits; nothing here commits. Each
channel's named function (`enqueue_event`, `enqueue_email`, …) comes from its package."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from . import sql, tracing
from .errors import InvalidMessageError
from .publishers.registry import CHANNELS
from .publishers.spec import ChannelSpec
from .store import array_literal
from .write import _ID_TAKEN, check_conn, enqueue, insert_message, registered

BULK_CHUNK = 1000
#: Payload and header JSON text per bulk statement: a call holds about one statement's text at a
#: time, whatever the number of messages.
BULK_CHUNK_BYTES = 8 * 1024 * 1024


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
    """Equal as `jsonb` compares them, as against a stored message (`same_message_as_m`)."""
    if a == b:
        return True
    try:
        return json.loads(a, parse_int=_Number, parse_float=_Number) == \
            json.loads(b, parse_int=_Number, parse_float=_Number)
    except RecursionError:  # nested deeper than the comparison can go: the texts differ, so refuse
        return False


class _Holder(NamedTuple):
    """The first message given an id in one bulk call: its position, identity and payload digest."""

    position: int
    fields: tuple[Any, ...]
    digest: bytes


def _check_repeats(spec: ChannelSpec, data: Sequence[Mapping[str, Any]], holders: dict[uuid.UUID, _Holder],
                   i: int, row: Mapping[str, Any], now: datetime) -> None:
    """Refuse message `i` when its id went earlier in the call to a different message (headers
    aside); only a digest of the earlier payload is kept, its text made again when they differ."""
    fields = (row["channel"], row["destination"], row["type"], row["key"])
    digest = hashlib.sha256(row["payload"].encode("utf-8")).digest()
    holder = holders.setdefault(row["message_id"], _Holder(i, fields, digest))
    if holder.position == i or (holder.fields == fields and holder.digest == digest):
        return
    if holder.fields != fields or not _same_json(spec.message_row(data[holder.position], now)["payload"],
                                                 row["payload"]):
        raise InvalidMessageError(f"messages[{i}].message_id", _ID_TAKEN)


def enqueue_events_bulk(conn: Any, messages: Iterable[Mapping[str, Any]]) -> list[uuid.UUID]:
    """`enqueue_bulk` of domain events for Redis Streams (`enqueue_event`'s keyword arguments)."""
    return enqueue_bulk(conn, messages, channel="redis")


def enqueue_bulk(conn: Any, messages: Iterable[Mapping[str, Any]], *, channel: str) -> list[uuid.UUID]:
    """Many messages (each the keyword arguments of the channel's named function), one statement
    per chunk; all validated before any is written (``messages[3].payload`` names a refusal).
    The JSON text is made again per chunk, so a call holds one chunk's text, not every message's.
    An id already written for a different message is refused after its chunk's statement ran:
    the exception leaves the caller's `with` block, so the transaction does not commit."""
    check_conn(conn)
    spec = registered(channel)
    if isinstance(messages, (Mapping, str, bytes)) or not isinstance(messages, Iterable):
        raise InvalidMessageError("messages", "must be a list of mappings")
    data = messages if isinstance(messages, Sequence) else list(messages)
    context = tracing.current_context()  # one context for the call: every message was made in it
    now = datetime.now(timezone.utc)  # one time for every deliver_at, in both passes
    ids: list[uuid.UUID] = []
    holders: dict[uuid.UUID, _Holder] = {}
    ends: list[int] = []  # where each chunk ends (exclusive)
    first_rows: list[dict[str, Any]] = []  # the first chunk's rows, written without making them again
    count = size = 0
    for i, item in enumerate(data):
        if not isinstance(item, Mapping):
            raise InvalidMessageError(f"messages[{i}]", f"must be a mapping (the keyword arguments of {spec.producer})")
        try:
            row = spec.message_row(item, now, context)
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"messages[{i}].{exc.field}", exc.problem) from None
        if item.get("message_id") is not None:  # generated ids never repeat
            _check_repeats(spec, data, holders, i, row, now)
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
        rows = first_rows if start == 0 else [dict(spec.message_row(data[k], now, context), message_id=ids[k])
                                              for k in range(start, end)]
        _insert_chunk(conn, start, rows)  # empties `rows`
        start = end
    return ids


def _insert_chunk(conn: Any, start: int, rows: list[dict[str, Any]]) -> None:
    """One statement (emptying `rows`), two when ids were held; raise on the first id held by a
    different message."""
    for channel in {r["channel"] for r in rows}:
        registered(channel)
    messages = json.dumps([
        {**r, "i": i, "message_id": str(r["message_id"]),
         "deliver_at": r["deliver_at"].isoformat() if r["deliver_at"] is not None else None}
        for i, r in enumerate(rows)
    ], ensure_ascii=False)
    rows.clear()  # the texts now live in `messages` only
    skipped = conn.execute(sql.producer.insert_messages_bulk, {"messages": messages}).scalars().all()
    # Ids held already: repeats of these messages, or taken by others.
    taken = conn.execute(sql.producer.same_messages, {"messages": messages, "positions": array_literal(skipped)}
                         ).scalars().all() if skipped else []
    if taken:
        raise InvalidMessageError(f"messages[{start + min(taken)}].message_id", _ID_TAKEN)


# Each channel's named function, from its package (`ChannelSpec.producer`).
for _spec in CHANNELS:
    globals()[_spec.producer] = _spec.producer_function()

__all__ = ["BULK_CHUNK", "BULK_CHUNK_BYTES", "check_conn", "enqueue", "enqueue_bulk", "enqueue_events_bulk",
           "insert_message", *(spec.producer for spec in CHANNELS)]
