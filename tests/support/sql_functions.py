"""Calling the SQL enqueue functions (migration 0009) from a SQLAlchemy connection,
with named arguments, and reading back what either way of enqueueing wrote."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

# The argument types the functions declare, for the casts of the bound parameters.
CASTS = {"payload": "json", "headers": "json", "tags": "json", "attachments": "jsonb", "message_id": "uuid",
         "deliver_at": "timestamptz", "max_attempts": "integer", "to": "text[]", "cc": "text[]", "bcc": "text[]",
         "reply_to": "text[]"}
JSON_ARGS = ("payload", "headers", "tags", "attachments")


class Raw(str):
    """JSON text sent as it is (any other value of a JSON argument is serialised)."""


class Refused(Exception):
    """A refusal raised by a function: its SQLSTATE, the field (the error's COLUMN) and message."""

    def __init__(self, code: str, field: str | None, message: str) -> None:
        super().__init__(message)
        self.code, self.field, self.message = code, field, message


def call(conn: Any, function: str, **args: Any) -> uuid.UUID:
    """`SELECT outbox_enqueue_<function>_v1(name => value, …)`; JSON arguments given as
    Python values are sent as compact JSON text, as the Python API writes them (`Raw`: as given)."""
    names, params = [], {}
    for name, value in args.items():
        if name in JSON_ARGS and value is not None and not isinstance(value, Raw):
            value = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        params[f"p_{name}"] = value
        sql_name = '"to"' if name == "to" else name
        names.append(f"{sql_name} => CAST(:p_{name} AS {CASTS.get(name, 'text')})")
    statement = text(f"SELECT outbox_enqueue_{function}_v1({', '.join(names)})")
    try:
        return conn.execute(statement, params).scalar_one()
    except DBAPIError as exc:
        fields = exc.orig.args[0] if exc.orig.args and isinstance(exc.orig.args[0], dict) else {}
        raise Refused(fields.get("C", "?"), fields.get("c"), fields.get("M", str(exc))) from None


ROW = text("""
SELECT o.channel, o.destination, o.type, o.key, o.max_attempts, o.scheduled_at, o.payload_bytes,
       b.payload::jsonb AS payload, b.headers::jsonb AS headers
  FROM outbox_message o JOIN outbox_message_body b ON b.seq = o.seq
 WHERE o.message_id = :id
""")


def stored(conn: Any, message_id: uuid.UUID) -> dict[str, Any] | None:
    """The stored message, payload and headers as JSON values (None: none under the id)."""
    row = conn.execute(ROW, {"id": message_id}).mappings().one_or_none()
    return None if row is None else dict(row)


def count(conn: Any) -> int:
    return conn.execute(text("SELECT (SELECT count(*) FROM outbox_message) + "
                             "(SELECT count(*) FROM outbox_message_body)")).scalar_one()
