"""The producer's one write: `enqueue` validates a message through its channel's spec
and inserts the row in the caller's transaction by `sql.producer.insert_message`, the
message id its idempotency key. Every channel's named producer API function
(`<channel>/message.py`) calls `enqueue`; the bulk call (`producer`) ends in the same table."""

from __future__ import annotations

import uuid
from typing import Any, Mapping

from sqlalchemy.engine import Engine

from . import sql, tracing
from .errors import InvalidMessageError
from .publishers.registry import spec_for
from .publishers.spec import ChannelSpec

_ID_TAKEN = ("already used by a different message (channel, destination, type, key or payload differ); "
             "an idempotency key must identify one message")


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


def registered(channel: Any) -> ChannelSpec:
    """The spec of `channel`. The schema takes any channel name (migration 0007): the
    registry says which exist. Raises `InvalidMessageError` on ``channel``."""
    try:
        return spec_for(channel)
    except KeyError as exc:
        raise InvalidMessageError("channel", str(exc.args[0])) from None


def enqueue(conn: Any, *, channel: str, **fields: Any) -> uuid.UUID:
    """Write one message for `channel` (a registered channel's name) in the caller's
    transaction and return its message id. `fields` are the keyword arguments of the
    channel's named function (`enqueue_event`, `enqueue_email`, …), validated by its
    spec; the producer's trace context is added where the channel carries it.

    Raises:
        InvalidMessageError: `conn`, `channel` or a field is invalid; `.field` names it.
            Nothing is written.
    """
    check_conn(conn)
    row = registered(channel).message_row(fields, None, tracing.current_context())
    return insert_message(conn, row)


def insert_message(conn: Any, row: Mapping[str, Any]) -> uuid.UUID:
    """Write one validated message row (`sql.producer.insert_message` parameters) in the
    caller's transaction and return its message id.

    The message id is an idempotency key: the same message again is a no-op.
    Raises `InvalidMessageError` on field `message_id` when the id is already
    taken by a *different* message (another channel, destination, type, key or
    payload), which would otherwise be dropped silently, also when another
    transaction wrote it at the same time (one more statement, only then).
    """
    registered(row["channel"])
    inserted, same = conn.execute(sql.producer.insert_message, row).one()
    if not inserted and same is None:
        # Written by a transaction that committed while this one waited: look again.
        same = conn.execute(sql.producer.same_message, row).scalar()
    if not inserted and same is False:
        raise InvalidMessageError("message_id", _ID_TAKEN)
    return row["message_id"]
