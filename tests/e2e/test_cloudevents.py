"""CloudEvents on the Redis stream (issue 26, item 4): with OUTBOX_REDIS_FORMAT=cloudevents
the relay writes CloudEvents 1.0 attributes as entry fields, and a consumer reads them
back with the CloudEvents SDK from PyPI (`cloudevents`), which validates them."""

from __future__ import annotations

import json
from datetime import datetime

from cloudevents.core.formats.json import JSONFormat
from sqlalchemy import text

from outbox_relay.producer import enqueue_event
from outbox_tools.lambda_local import LocalContext, load_handler, project_root

REDIS_EVENT = json.loads((project_root() / "events" / "relay-redis-scheduler.json").read_text())
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def consume(fields: dict[str, str]):
    """What a consumer does with an entry: the fields are the event's attributes, and
    `data` is the JSON text of its data; read as the structured JSON format."""
    document = {**fields, "data": json.loads(fields["data"])}
    return JSONFormat().read(None, json.dumps(document))


def test_a_consumer_reads_the_entries_with_the_cloudevents_sdk(relay_env, app_engine, redis_client, redis_prefix,
                                                                monkeypatch):
    monkeypatch.setenv("OUTBOX_REDIS_FORMAT", "cloudevents")
    monkeypatch.setenv("OUTBOX_CLOUDEVENTS_SOURCE", "urn:shop:orders")
    monkeypatch.delenv("_X_AMZN_TRACE_ID", raising=False)
    stream = redis_prefix + "orders"
    # Given an event with an ordering key, headers and a trace context, and one with none of them
    with app_engine.begin() as conn:
        keyed = enqueue_event(conn, stream=stream, type="order.placed", key="order-42",
                              payload={"order_id": 42, "items": [{"sku": "tea", "note": "Zoë ☕"}]},
                              headers={"tenant": "eu-1", "traceparent": TRACEPARENT, "tracestate": "shop=1"})
        plain = enqueue_event(conn, stream=stream, type="order.cancelled", payload=["a", 1, None])
    with app_engine.connect() as conn:
        created = dict(conn.execute(text("SELECT message_id::text, created_at FROM outbox_message")).all())

    # When the relay runs with the cloudevents layout
    assert load_handler("relay")(REDIS_EVENT, LocalContext(60))["delivered"] == 2

    # Then a consumer parses each entry with the CloudEvents SDK
    entries = {f["id"]: f for _, f in redis_client.xrange(stream)}
    event = consume(entries[str(keyed)])
    assert (event.get_specversion(), event.get_id(), event.get_source(), event.get_type()) == \
        ("1.0", str(keyed), "urn:shop:orders", "order.placed")
    assert event.get_datacontenttype() == "application/json" and event.get_subject() == "order-42"
    assert event.get_data() == {"order_id": 42, "items": [{"sku": "tea", "note": "Zoë ☕"}]}
    assert isinstance(event.get_time(), datetime) and event.get_time() == created[str(keyed)]
    # And the trace context is the distributed tracing extension; the producer's headers an extension too
    assert (event.get_extension("traceparent"), event.get_extension("tracestate")) == (TRACEPARENT, "shop=1")
    assert json.loads(event.get_extension("outboxheaders"))["tenant"] == "eu-1"

    # And an event without a key, headers or trace has no subject and no extension
    other = consume(entries[str(plain)])
    assert other.get_subject() is None and other.get_data() == ["a", 1, None]
    assert set(entries[str(plain)]) == {"specversion", "id", "source", "type", "time", "datacontenttype", "data"}
    # And no field of the `fields` layout is written besides `id` and `type`
    assert not {"payload", "created_at", "key", "headers"} & set(entries[str(keyed)])


def test_the_default_layout_is_fields_with_the_trace_context_as_fields(relay_env, app_engine, redis_client,
                                                                       redis_prefix, monkeypatch):
    monkeypatch.delenv("_X_AMZN_TRACE_ID", raising=False)
    stream = redis_prefix + "orders"
    with app_engine.begin() as conn:
        mid = enqueue_event(conn, stream=stream, type="order.placed", key="k", payload={"n": 1},
                            headers={"traceparent": TRACEPARENT, "tracestate": "shop=1"})
    assert load_handler("relay")(REDIS_EVENT, LocalContext(60))["delivered"] == 1
    ((_, fields),) = redis_client.xrange(stream)
    assert list(fields) == ["id", "type", "key", "payload", "created_at", "headers", "traceparent", "tracestate"]
    assert (fields["id"], fields["key"], json.loads(fields["payload"])) == (str(mid), "k", {"n": 1})
    assert (fields["traceparent"], fields["tracestate"]) == (TRACEPARENT, "shop=1")
