"""W3C trace context through the outbox (docs/channels.md, "Trace context"), from
OpenTelemetry (optional) or the Lambda X-Ray header."""

from __future__ import annotations

import json
import os
import re
from contextlib import nullcontext
from typing import Any, ContextManager, Iterable, Mapping

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
XRAY_ENV = "_X_AMZN_TRACE_ID"
#: Longest tracestate kept (what W3C propagators must carry); a longer one is dropped, not cut.
MAX_TRACESTATE_CHARS = 512

# version 00: trace id (32 hex, not all zero), parent id (16 hex, not all zero), flags (2 hex).
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_XRAY_ROOT = re.compile(r"1-([0-9a-f]{8})-([0-9a-f]{24})")
_TRACESTATE = re.compile(r"[\x20-\x7e]*")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16

_otel: Any = None  # the opentelemetry.trace module, False when not installed, None before the first look


def parse_traceparent(value: Any) -> tuple[str, str, str] | None:
    m = _TRACEPARENT.fullmatch(value) if isinstance(value, str) else None
    if m is None or m.group(1) == _ZERO_TRACE or m.group(2) == _ZERO_SPAN:
        return None
    return m.group(1), m.group(2), m.group(3)


def trace_id(traceparent: str | None) -> str | None:
    parsed = parse_traceparent(traceparent)
    return parsed[0] if parsed else None


def xray_to_traceparent(header: str | None) -> str | None:
    if not header:
        return None
    parts = dict(p.strip().split("=", 1) for p in header.split(";") if "=" in p)
    root = _XRAY_ROOT.fullmatch(parts.get("Root", ""))
    if root is None:
        return None
    value = f"00-{root.group(1)}{root.group(2)}-{parts.get('Parent', '')}-{'01' if parts.get('Sampled') == '1' else '00'}"
    return value if parse_traceparent(value) else None


def traceparent_to_xray(traceparent: str) -> str | None:
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return None
    trace, parent, flags = parsed
    return f"Root=1-{trace[:8]}-{trace[8:]};Parent={parent};Sampled={int(flags, 16) & 1}"


def _opentelemetry() -> Any:
    global _otel
    if _otel is None:
        try:
            from opentelemetry import trace
        except ImportError:
            trace = False
        _otel = trace
    return _otel or None


def current_context() -> dict[str, str]:
    """OpenTelemetry's span, else this invocation's X-Ray header."""
    trace = _opentelemetry()
    if trace is not None:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            out = {TRACEPARENT: f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"}
            state = ctx.trace_state.to_header() if ctx.trace_state else ""
            if state and len(state) <= MAX_TRACESTATE_CHARS:
                out[TRACESTATE] = state
            return out
    traceparent = xray_to_traceparent(os.environ.get(XRAY_ENV))
    return {TRACEPARENT: traceparent} if traceparent else {}


def with_context(headers: Any, context: Mapping[str, str]) -> Any:
    """`headers` with the context added; a caller's traceparent wins; a non-mapping is left for validation."""
    if not context or (headers is not None and not isinstance(headers, Mapping)) \
            or (headers and TRACEPARENT in headers):
        return headers
    return {**context, **headers} if headers else dict(context)


def check_context(traceparent: Any, tracestate: Any) -> dict[str, str]:
    """A context given as values (the SQL functions mirror this); ValueError naming the field."""
    if traceparent is None:
        if tracestate is not None:
            raise ValueError("tracestate: needs a traceparent")
        return {}
    if parse_traceparent(traceparent) is None:
        raise ValueError("traceparent: must be a W3C traceparent, 00-<32 hex>-<16 hex>-<2 hex>, ids not all zero")
    out = {TRACEPARENT: traceparent}
    if tracestate is not None:
        if not isinstance(tracestate, str) or len(tracestate) > MAX_TRACESTATE_CHARS \
                or not _TRACESTATE.fullmatch(tracestate):
            raise ValueError(f"tracestate: must be printable ASCII of at most {MAX_TRACESTATE_CHARS} characters")
        if tracestate:
            out[TRACESTATE] = tracestate
    return out


def context_of(headers_json: str | None) -> tuple[str | None, str | None]:
    """(traceparent, tracestate) stored in a message's headers; the substring test spares a parse."""
    if not headers_json or TRACEPARENT not in headers_json:
        return None, None
    try:
        headers = json.loads(headers_json)
    except ValueError:
        return None, None
    traceparent = headers.get(TRACEPARENT) if isinstance(headers, dict) else None
    if parse_traceparent(traceparent) is None:
        return None, None
    state = headers.get(TRACESTATE)
    return traceparent, state if isinstance(state, str) and state else None


def batch_span(system: str, messages: Iterable[Any]) -> ContextManager[Any]:
    """A PRODUCER span linking (not parenting) each message's context, as OpenTelemetry's messaging
    conventions say of a batch; a null context without an SDK."""
    trace = _opentelemetry()
    if trace is None or isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return nullcontext()
    messages, links = list(messages), []
    destinations = {m.destination for m in messages}
    for m in messages:
        traceparent, state = context_of(m.headers_json)
        if traceparent is None:
            continue
        t, s, flags = parse_traceparent(traceparent)  # type: ignore[misc]
        ctx = trace.SpanContext(int(t, 16), int(s, 16), is_remote=True, trace_flags=trace.TraceFlags(int(flags, 16)),
                                trace_state=trace.TraceState.from_header([state]) if state else None)
        links.append(trace.Link(ctx, {"messaging.message.id": m.message_id}))
    destination = next(iter(destinations)) if len(destinations) == 1 else None
    attributes: dict[str, Any] = {"messaging.system": system, "messaging.operation.type": "send",
                                  "messaging.operation.name": "send", "messaging.batch.message_count": len(messages)}
    if destination is not None:
        attributes["messaging.destination.name"] = destination
    return trace.get_tracer("outbox_relay").start_as_current_span(
        f"send {destination}" if destination else "send", kind=trace.SpanKind.PRODUCER, links=links,
        attributes=attributes)
