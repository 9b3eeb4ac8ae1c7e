"""A stream entry's fields in the two layouts (docs/channels.md, "Entry layouts"), as the
publish script's argument: the ordering key, then names and values, joined by NUL."""

from __future__ import annotations

from typing import Callable

from ...models import ClaimedMessage
from ...tracing import TRACEPARENT, context_of


def _trace_fields(parts: list[str], headers_json: str) -> None:
    if TRACEPARENT in headers_json:
        traceparent, state = context_of(headers_json)
        if traceparent is not None:
            parts += ("traceparent", traceparent)
            if state is not None:
                parts += ("tracestate", state)


def plain_fields(m: ClaimedMessage) -> str:
    key = m.key
    parts = [key or "", "id", m.message_id, "type", m.type]
    if key is not None:
        parts += ("key", key)
    parts += ("payload", m.payload_json, "created_at", m.created_at)
    headers = m.headers_json
    if headers:
        parts += ("headers", headers)
        _trace_fields(parts, headers)
    return "\0".join(parts)


def cloudevent_fields(source: str) -> Callable[[ClaimedMessage], str]:
    def fields(m: ClaimedMessage) -> str:
        key = m.key
        parts = [key or "", "specversion", "1.0", "id", m.message_id, "source", source, "type", m.type,
                 "time", m.created_at, "datacontenttype", "application/json"]
        if key is not None:
            parts += ("subject", key)
        parts += ("data", m.payload_json)
        headers = m.headers_json
        if headers:
            _trace_fields(parts, headers)
            parts += ("outboxheaders", headers)
        return "\0".join(parts)

    return fields
