"""Trace context without servers: the W3C and X-Ray forms, what the producer stores, and
how each publisher carries a stored context onward (the email's headers, EventBridge's
TraceHeader, the stream entry's fields)."""

from __future__ import annotations

import json
import uuid
from contextlib import nullcontext

import pytest

from outbox_relay import tracing
from outbox_relay.models import ClaimedMessage, Status
from outbox_relay.publishers.eventbridge.publisher import EventBridgePublisher
from outbox_relay.publishers.redis.entries import cloudevent_fields, plain_fields
from outbox_relay.publishers.ses.message import message_row
from outbox_relay.publishers.ses.requests import prepare

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
XRAY = "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1"


@pytest.mark.parametrize(("header", "expected"), [
    (XRAY, TP),
    ("Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=0", TP[:-2] + "00"),
    ("Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=?", TP[:-2] + "00"),
    ("Parent=00f067aa0ba902b7;Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Lineage=a87bd80c:0;Sampled=1", TP),
    ("Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Sampled=1", None),  # no parent: no traceparent
    ("Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=0000000000000000;Sampled=1", None),
    ("Root=garbage;Parent=00f067aa0ba902b7", None),
    ("", None),
    (None, None),
])
def test_the_lambda_xray_header_as_a_traceparent(header, expected):
    assert tracing.xray_to_traceparent(header) == expected


def test_a_traceparent_as_an_xray_header_and_back():
    assert tracing.traceparent_to_xray(TP) == XRAY
    assert tracing.xray_to_traceparent(tracing.traceparent_to_xray(TP)) == TP
    assert tracing.traceparent_to_xray("nonsense") is None


@pytest.mark.parametrize("bad", [
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # a version this relay does not read
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    TP + "-extra", "", 42, None,
])
def test_only_a_valid_traceparent_is_read(bad):
    assert tracing.parse_traceparent(bad) is None and tracing.trace_id(bad) is None


def test_a_context_given_by_value_is_checked_naming_the_argument():
    # The rules the SQL functions' traceparent and tracestate arguments follow too
    assert tracing.check_context(TP, "shop=1") == {"traceparent": TP, "tracestate": "shop=1"}
    assert tracing.check_context(TP, "") == {"traceparent": TP}
    assert tracing.check_context(None, None) == {}
    for traceparent, state, named in [("nope", None, "traceparent"), (None, "shop=1", "tracestate"),
                                      (TP, "é=1", "tracestate"), (TP, "x" * 513, "tracestate")]:
        with pytest.raises(ValueError, match=f"^{named}:"):
            tracing.check_context(traceparent, state)


def test_the_callers_traceparent_wins_and_headers_that_are_not_a_mapping_are_left_to_validation():
    context = {"traceparent": TP, "tracestate": "relay=1"}
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    assert tracing.with_context({"traceparent": own}, context) == {"traceparent": own}
    assert tracing.with_context({"tenant": "eu"}, context) == {**context, "tenant": "eu"}
    assert tracing.with_context(None, context) == context
    assert tracing.with_context(["not", "a", "mapping"], context) == ["not", "a", "mapping"]
    assert tracing.with_context({"tenant": "eu"}, {}) == {"tenant": "eu"}


def test_without_opentelemetry_the_current_context_is_the_xray_header(monkeypatch):
    monkeypatch.setattr(tracing, "_otel", False)  # as after a failed import
    monkeypatch.setenv("_X_AMZN_TRACE_ID", XRAY)
    assert tracing.current_context() == {"traceparent": TP}
    monkeypatch.delenv("_X_AMZN_TRACE_ID")
    assert tracing.current_context() == {}
    assert isinstance(tracing.batch_span("redis", [message(json.dumps({"traceparent": TP}))]), nullcontext)


@pytest.mark.parametrize(("headers_json", "expected"), [
    (json.dumps({"traceparent": TP, "tracestate": "a=1"}), (TP, "a=1")),
    ('{"tenant": "eu", "traceparent": "%s"}' % TP, (TP, None)),  # as jsonb writes it, with spaces
    ('{"traceparent": "bogus"}', (None, None)),
    ('{"tenant": "eu"}', (None, None)),
    ("[1]", (None, None)),
    (None, (None, None)),
])
def test_the_stored_context_is_read_from_the_headers(headers_json, expected):
    assert tracing.context_of(headers_json) == expected


def message(headers_json: str | None, payload: str = '{"n":1}', key: str | None = "k") -> ClaimedMessage:
    return ClaimedMessage(1, str(uuid.uuid4()), Status.LEASED, "orders", "order.placed", key, payload,
                          headers_json, 1, 5, "2026-12-02T10:00:00.000000Z")


def _email(**changes) -> ClaimedMessage:
    row = message_row({"to": ["ana@example.com"], "subject": "s", "text": "t"} | changes)
    return ClaimedMessage(1, str(row["message_id"]), Status.LEASED, "(default)", "email", None, row["payload"],
                          json.dumps({"traceparent": TP, "tracestate": "a=1"}), 1, 5, "2026-12-02T10:00:00Z")


def _headers(prepared) -> dict[str, str]:
    return {h["Name"]: h["Value"] for h in prepared.request["Content"]["Simple"].get("Headers", [])}


def test_the_email_gets_the_stored_context_as_headers_when_there_is_room():
    send = dict(default_sender="noreply@shop.example", default_configuration_set=None, simple_headers=True)
    assert _headers(prepare(_email(), **send)) == {"traceparent": TP, "tracestate": "a=1"}
    # The email's own traceparent wins
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    assert _headers(prepare(_email(headers={"TraceParent": own}), **send)) == {"TraceParent": own}
    # SES takes 15 custom headers: the tracestate goes first, then the traceparent
    fourteen = {f"X-H{i}": "v" for i in range(14)}
    assert set(_headers(prepare(_email(headers=fourteen), **send))) == set(fourteen) | {"traceparent"}
    fifteen = {f"X-H{i}": "v" for i in range(15)}
    assert _headers(prepare(_email(headers=fifteen), **send)) == fifteen
    # As raw MIME (attachments), the same headers
    raw = prepare(_email(attachments=[("a.txt", b"x")]), **send).request["Content"]["Raw"]["Data"]
    assert f"traceparent: {TP}".encode() in raw and b"tracestate: a=1" in raw


def test_an_eventbridge_entry_carries_the_context_as_its_xray_trace_header():
    publisher = EventBridgePublisher(object(), bus="shop", source="shop.default")
    traced = publisher.entry(message(json.dumps({"source": "shop.orders", "traceparent": TP}), key=None), "0")
    assert traced.request["TraceHeader"] == XRAY and traced.request["Source"] == "shop.orders"
    assert "TraceHeader" not in publisher.entry(message(None, key=None), "1").request


def _entry(argument: str) -> tuple[str, dict[str, str]]:
    """The script's argument as the script reads it: the key, then names and values."""
    key, *rest = argument.split("\0")
    return key, dict(zip(rest[::2], rest[1::2]))


def test_the_entry_fields_of_each_layout():
    m = message(json.dumps({"traceparent": TP, "tracestate": "a=1"}))
    key, fields = _entry(plain_fields(m))
    assert key == "k" and list(fields) == ["id", "type", "key", "payload", "created_at", "headers", "traceparent",
                                            "tracestate"]
    key, fields = _entry(cloudevent_fields("urn:shop")(m))
    assert key == "k" and fields == {
        "specversion": "1.0", "id": m.message_id, "source": "urn:shop", "type": "order.placed",
        "time": m.created_at, "datacontenttype": "application/json", "subject": "k", "data": '{"n":1}',
        "traceparent": TP, "tracestate": "a=1", "outboxheaders": m.headers_json}
    key, fields = _entry(plain_fields(message(None, key=None)))
    assert key == "" and list(fields) == ["id", "type", "payload", "created_at"]
