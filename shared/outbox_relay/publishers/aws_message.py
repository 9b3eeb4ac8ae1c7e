"""What the SQS, SNS and EventBridge messages share at enqueue: at most 256 KiB as the service counts it."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, Callable, Mapping

from ..errors import InvalidMessageError
from .message import Message, message_row, payload_text, traced_row, validated
from .spec import Option

#: The size limit of one SQS or SNS message and one EventBridge entry, bytes (256 KiB).
MAX_AWS_MESSAGE_BYTES = 256 * 1024
#: Message attributes SQS and SNS carry at most ("Amazon SQS message attributes").
MAX_ATTRIBUTES = 10
#: The attributes the relay adds: the message id, the type and the ordering key.
ID_ATTRIBUTE = "outbox-message-id"
TYPE_ATTRIBUTE = "outbox-type"
KEY_ATTRIBUTE = "outbox-key"
RESERVED_ATTRIBUTES = (ID_ATTRIBUTE, TYPE_ATTRIBUTE, KEY_ATTRIBUTE)
#: Headers a producer may give: what is left of the ten attributes after the relay's three.
MAX_HEADERS = MAX_ATTRIBUTES - len(RESERVED_ATTRIBUTES)
#: The destination of a message that names none: the relay's own. Not a bus name, so never
#: taken for one (EventBridge's own bus is called "default").
DEFAULT_DESTINATION = "(relay)"

#: The options every AWS channel's enqueue command starts with.
AWS_OPTIONS = (
    Option("--type", "type", "Message type, e.g. order.placed.", required=True),
    Option("--payload", "payload", "JSON text, or @file.json to read a file.", "json", required=True),
    Option("--key", "key", "Ordering key: its messages are sent in enqueue order (the MessageGroupId on a FIFO "
                           "queue or topic)."),
)

# SQS and SNS attribute names ("SendMessage", MessageAttribute).
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*")


def attribute_bytes(name: str, value: str) -> int:
    return len(name.encode("utf-8")) + len("String") + len(value.encode("utf-8"))  # name, data type, value


def attribute_values(message_id: str, type_: str, key: str | None, headers_json: str | None) -> dict[str, str]:
    values = {ID_ATTRIBUTE: message_id, TYPE_ATTRIBUTE: type_}
    if key is not None:
        values[KEY_ATTRIBUTE] = key
    return {**values, **json.loads(headers_json)} if headers_json else values


def body_size(payload_json: str, values: Mapping[str, str]) -> int:
    """The bytes an SQS or SNS message counts towards 256 KiB: the body and every attribute."""
    return len(payload_json.encode("utf-8")) + sum(attribute_bytes(k, v) for k, v in values.items())


def checked_size(channel: str, size: int) -> None:
    if size > MAX_AWS_MESSAGE_BYTES:
        raise InvalidMessageError("payload", f"makes the {channel} message {size} bytes with its "
                                             f"attributes; the limit is {MAX_AWS_MESSAGE_BYTES} bytes")


def _check_attributes(headers: Mapping[str, str] | None, channel: str,
                      check_text: Callable[[str, str], None] | None) -> None:
    if not headers:
        return
    if len(headers) > MAX_HEADERS:
        raise InvalidMessageError("headers", f"has {len(headers)} entries; {channel} carries at most "
                                             f"{MAX_ATTRIBUTES} message attributes, {len(RESERVED_ATTRIBUTES)} "
                                             f"of them the relay's, so at most {MAX_HEADERS}")
    for name, value in headers.items():
        if name in RESERVED_ATTRIBUTES:
            raise InvalidMessageError(f"headers.{name}", "is the relay's own attribute")
        if len(name) > 256 or not _ATTRIBUTE_NAME.fullmatch(name) or name.lower().startswith(("aws.", "amazon.")):
            raise InvalidMessageError(f"headers.{name}", "must be 1-256 letters, digits, '_', '-' or '.' (not "
                                                         "leading, trailing or doubled), not starting with "
                                                         "'AWS.' or 'Amazon.'")
        if value == "":
            raise InvalidMessageError(f"headers.{name}", "must not be empty (SQS and SNS refuse empty attributes)")
        if check_text:
            check_text(value, f"headers.{name}")


def attributed_size(row: Mapping[str, Any]) -> int:
    return body_size(row["payload"], attribute_values(str(row["message_id"]), row["type"], row.get("key"),
                                                      row.get("headers")))


def _attributed(channel: str, data: Mapping[str, Any], now: datetime | None,
                check_text: Callable[[str, str], None] | None) -> dict[str, Any]:
    m = validated(Message, data, now)
    _check_attributes(m.headers, channel, check_text)
    text = payload_text(m.payload, MAX_AWS_MESSAGE_BYTES)
    if check_text:
        check_text(text, "payload")
        check_text(m.type, "type")
        if m.key is not None:
            check_text(m.key, "key")
    row = message_row(m, channel, DEFAULT_DESTINATION, text)
    checked_size(channel, attributed_size(row))
    return row


def attributed_row(channel: str, fields: Mapping[str, Any], now: datetime | None,
                   context: Mapping[str, str] | None,
                   check_text: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """One SQS or SNS message's row; `check_text` refuses what the service's text refuses."""
    return traced_row(lambda f, n: _attributed(channel, f, n, check_text), fields, now, context, MAX_HEADERS)
