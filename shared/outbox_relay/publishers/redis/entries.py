"""A stream entry's fields, in the two layouts (OUTBOX_REDIS_FORMAT; docs/channels.md,
"Entry layouts"): each builds the publish script's argument for one message, its
ordering key then the entry's names and values, joined by NUL (`script.PUBLISH_SCRIPT`)."""

from __future__ import annotations

from typing import Callable

from ...models import ClaimedMessage
from ...tracing import TRACEPARENT, context_of


def _trace_fields(parts: list[str], headers_json: str) -> None:
    """Append the stored trace context as `traceparent` (and `tracestate`) fields."""
    if TRACEPARENT in headers_json:
        traceparent, state = context_of(headers_json)
        if traceparent is not None:
            parts += ("traceparent", traceparent)
            if state is not None:
                parts += ("tracestate", state)


def plain_fields(m: ClaimedMessage) -> str:
    """The script's argument for `m` in the `fields` layout: its ordering key, then the
    entry's names and values, joined by NUL (see `PUBLISH_SCRIPT`)."""
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
    """The script's argument for a message in the `cloudevents` layout: the CloudEvents
    1.0 attributes as fields (structured mode's attributes, the payload's JSON text as
    `data`), the ordering key as `subject`, the trace context as the distributed tracing
    extension (`traceparent`, `tracestate`), and the producer's headers, when any, as
    the extension `outboxheaders` (JSON text)."""
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
