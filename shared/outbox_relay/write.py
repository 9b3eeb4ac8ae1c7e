"""The producer's one write, which every channel's named function calls: a message validated by its
channel's spec, inserted in the caller's transaction, its id the idempotency key."""

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
    """Refuse None, an Engine (no transaction of its own) or a DB-API connection (it takes neither
    SQLAlchemy statements nor named parameters), naming `conn`."""
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
    """The schema takes any channel name (migration 0007): the registry says which exist."""
    try:
        return spec_for(channel)
    except KeyError as exc:
        raise InvalidMessageError("channel", str(exc.args[0])) from None


def enqueue(conn: Any, *, channel: str, **fields: Any) -> uuid.UUID:
    """One message for `channel`, `fields` its named function's keyword arguments; its id.
    `InvalidMessageError` names the field at fault, and nothing is written."""
    check_conn(conn)
    row = registered(channel).message_row(fields, None, tracing.current_context())
    return insert_message(conn, row)


def insert_message(conn: Any, row: Mapping[str, Any]) -> uuid.UUID:
    """One validated row; the same message again is a no-op, an id taken by a different one (which
    would be dropped silently) an `InvalidMessageError` on ``message_id``."""
    registered(row["channel"])
    inserted, same = conn.execute(sql.producer.insert_message, row).one()
    if not inserted and same is None:
        # Written by a transaction that committed while this one waited: look again.
        same = conn.execute(sql.producer.same_message, row).scalar()
    if not inserted and same is False:
        raise InvalidMessageError("message_id", _ID_TAKEN)
    return row["message_id"]
