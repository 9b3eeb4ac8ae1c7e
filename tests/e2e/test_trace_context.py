"""Trace context end to end (issue 26, item 3): a producer's span reaches the stream
entry and the email moto recorded; the relay's batch span links to each message's
context; without OpenTelemetry, the Lambda X-Ray header is carried instead, and
nothing of OpenTelemetry is imported."""

from __future__ import annotations

import email
import io
import json
import os
import subprocess
import sys
import textwrap
from email import policy as email_policy

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util._once import Once
from sqlalchemy import text

from outbox_relay import observability as obs
from outbox_relay import runtime, tracing
from outbox_relay.producer import enqueue_email, enqueue_event, enqueue_events_bulk, enqueue_sqs
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from outbox_tools.local_ses import LocalSesServer
from support.aws_harness import aws_client, aws_endpoint, moto_server, unique  # noqa: F401 (fixtures)

ROOT = project_root()
REDIS_EVENT = json.loads((ROOT / "events" / "relay-redis-scheduler.json").read_text())
SES_EVENT = json.loads((ROOT / "events" / "relay-ses-scheduler.json").read_text())


@pytest.fixture
def spans():
    """An OpenTelemetry SDK as the global tracer provider for this test, its spans kept
    in memory. The API sets the global provider once per process; the test puts the
    previous one back so that other tests run without an SDK."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = None, Once()
    trace.set_tracer_provider(provider)
    yield provider, exporter
    provider.shutdown()
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


def _hex(ctx) -> tuple[str, str]:
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _injected() -> str:
    """The current span's traceparent as OpenTelemetry's own W3C propagator writes it."""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier["traceparent"]


def test_a_producer_span_reaches_the_stream_entry_and_the_relay_span_links_to_it(
        spans, relay_env, app_engine, redis_client, redis_prefix, monkeypatch):
    provider, exporter = spans
    monkeypatch.delenv("_X_AMZN_TRACE_ID", raising=False)
    stream = redis_prefix + "orders"
    tracer = provider.get_tracer("shop")
    # Given an event enqueued inside a producer's span, a bulk of two inside another, and one outside any
    with tracer.start_as_current_span("place order") as producer:
        with app_engine.begin() as conn:
            first = enqueue_event(conn, stream=stream, type="order.placed", payload={"n": 1}, key="o-1")
        expected = _injected()
    with tracer.start_as_current_span("import orders") as importer:
        with app_engine.begin() as conn:
            bulk = enqueue_events_bulk(conn, [dict(stream=stream, type="order.placed", payload={"n": n})
                                              for n in (2, 3)])
        expected_bulk = _injected()
    with app_engine.begin() as conn:
        untraced = enqueue_event(conn, stream=stream, type="order.placed", payload={"n": 4})

    # When the relay runs
    summary = load_handler("relay")(REDIS_EVENT, LocalContext(60))
    assert summary["delivered"] == 4

    # Then each entry carries its producer's traceparent (as a field and in its headers); none without one
    fields = {f["id"]: f for _, f in redis_client.xrange(stream)}
    trace_id, span_id = _hex(producer.get_span_context())
    assert expected.startswith(f"00-{trace_id}-{span_id}-")
    assert fields[str(first)]["traceparent"] == expected
    assert json.loads(fields[str(first)]["headers"])["traceparent"] == expected
    bulk_trace, bulk_span = _hex(importer.get_span_context())
    assert {fields[str(i)]["traceparent"] for i in bulk} == {expected_bulk}
    assert "traceparent" not in fields[str(untraced)] and "headers" not in fields[str(untraced)]

    # And the relay's span for the batch is a PRODUCER send span that links to each context, parented by neither
    (send,) = [s for s in exporter.get_finished_spans() if s.name.startswith("send")]
    assert send.name == f"send {stream}" and send.kind is trace.SpanKind.PRODUCER
    assert send.attributes["messaging.system"] == "redis"
    assert send.attributes["messaging.batch.message_count"] == 4
    linked = sorted((_hex(link.context), link.attributes["messaging.message.id"]) for link in send.links)
    assert linked == sorted([((trace_id, span_id), str(first))]
                            + [((bulk_trace, bulk_span), str(i)) for i in bulk])
    assert send.parent is None or send.parent.trace_id not in (producer.get_span_context().trace_id,
                                                               importer.get_span_context().trace_id)


def test_a_producer_span_reaches_the_email_header_moto_recorded(spans, relay_env, app_engine, monkeypatch):
    provider, exporter = spans
    monkeypatch.delenv("_X_AMZN_TRACE_ID", raising=False)
    with LocalSesServer(max_send_rate=50) as ses:
        ses.verify("noreply@shop.example")
        monkeypatch.setenv("OUTBOX_CHANNEL", "ses")
        monkeypatch.setenv("OUTBOX_SES_FROM", "Shop <noreply@shop.example>")
        monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", ses.url)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(key, value)
        runtime.reset()
        # Given an email enqueued inside a producer's span (an attachment: moto records raw MIME whole)
        with provider.get_tracer("shop").start_as_current_span("ship order") as producer:
            with app_engine.begin() as conn:
                message_id = enqueue_email(conn, to=["박지우 <jiwoo@example.com>"], subject="Shipped",
                                           text="On its way.", attachments=[("receipt.txt", b"1 x tea")])
            expected = _injected()
        # When the SES relay runs
        summary = load_handler("relay")(SES_EVENT, LocalContext(30))
        assert summary["delivered"] == 1
        (sent,) = ses.sent_messages()

    # Then the email moto recorded has the producer's traceparent header, and its message id tag
    mime = email.message_from_string(sent.raw_data, policy=email_policy.default)
    trace_id, span_id = _hex(producer.get_span_context())
    assert expected.startswith(f"00-{trace_id}-{span_id}-") and mime["traceparent"] == expected
    # And the relay's batch span links to it
    (send,) = [s for s in exporter.get_finished_spans() if s.name.startswith("send")]
    assert send.attributes["messaging.system"] == "aws_ses"
    assert [(_hex(link.context), link.attributes["messaging.message.id"]) for link in send.links] == \
        [((trace_id, span_id), str(message_id))]


# Run in a process of its own, where importing anything under `opentelemetry` fails.
WITHOUT_OTEL = textwrap.dedent("""
    import importlib.abc, json, sys

    class NoOpenTelemetry(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"{name} is blocked in this test")

    sys.meta_path.insert(0, NoOpenTelemetry())
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool
    from outbox_relay.producer import enqueue_email, enqueue_event
    from outbox_tools.lambda_local import LocalContext, load_handler

    stream, url, event = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    engine = create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        mid = enqueue_event(conn, stream=stream, type="order.placed", payload={"n": 1})
        enqueue_email(conn, to=["ana@example.com"], subject="s", text="t")
    summary = load_handler("relay")(event, LocalContext(60))
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(json.dumps({"message_id": str(mid), "delivered": summary["delivered"], "loaded": loaded}))
""")


def test_without_opentelemetry_the_lambda_xray_header_is_carried_and_nothing_is_imported(
        relay_env, database_url, redis_client, redis_prefix, app_engine):
    # Given a process where OpenTelemetry cannot be imported, inside a Lambda invocation traced by X-Ray
    stream = redis_prefix + "orders"
    env = {**os.environ, "_X_AMZN_TRACE_ID":
           "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1;Lineage=a87bd80c:0"}
    # When it enqueues an event and an email, and the relay runs
    done = subprocess.run([sys.executable, "-c", WITHOUT_OTEL, stream, database_url, json.dumps(REDIS_EVENT)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Then the event is delivered with the X-Ray trace as its traceparent, and nothing of OpenTelemetry was loaded
    assert result["delivered"] == 1 and result["loaded"] == []
    ((_, entry),) = redis_client.xrange(stream)
    assert entry["traceparent"] == "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
    # And the email's message holds it too, in its headers, for the SES relay to add
    with app_engine.connect() as conn:
        stored = conn.execute(text("SELECT b.headers FROM outbox_message m JOIN outbox_message_body b USING (message_id) "
                                   "WHERE m.channel = 'ses'")).scalar_one()
    assert stored == {"traceparent": "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"}


def test_an_sqs_message_carries_the_context_as_an_attribute_where_it_fits(
        relay_env, aws_endpoint, app_engine, monkeypatch):  # noqa: F811 (fixture)
    # Given a queue, and two messages enqueued in a Lambda invocation traced by X-Ray: one with
    # room among its attributes, one whose seven headers leave none
    monkeypatch.setenv("_X_AMZN_TRACE_ID", "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
    monkeypatch.setattr(tracing, "_otel", False)  # the X-Ray header, whatever this process imported
    sqs = aws_client("sqs", aws_endpoint)
    url = sqs.create_queue(QueueName=unique("trace"))["QueueUrl"]
    full = {f"h{i}": "v" for i in range(7)}
    with app_engine.begin() as conn:
        roomy = str(enqueue_sqs(conn, type="order.placed", payload={"n": 1}))
        crowded = str(enqueue_sqs(conn, type="order.placed", payload={"n": 2}, key="k", headers=full))
    # When the SQS relay runs
    monkeypatch.setenv("OUTBOX_CHANNEL", "sqs")
    monkeypatch.setenv("OUTBOX_SQS_QUEUE_URL", url)
    assert load_handler("relay")({**SES_EVENT, "channel": "sqs"}, LocalContext(60))["delivered"] == 2
    # Then the first message has a traceparent attribute, and the second is sent with its ten (seven its own)
    got = {}
    while batch := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                                       WaitTimeSeconds=0).get("Messages", []):
        for m in batch:
            values = {k: v["StringValue"] for k, v in m["MessageAttributes"].items()}
            got[values["outbox-message-id"]] = values
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert got[roomy]["traceparent"] == "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
    assert "traceparent" not in got[crowded] and len(got[crowded]) == 10


@pytest.fixture
def log_stream():
    """Everything the Powertools logger writes during the test."""
    stream = io.StringIO()
    handler = obs.logger.registered_handler
    previous = handler.setStream(stream)
    yield stream
    handler.setStream(previous)


def test_a_dead_letter_is_logged_with_its_message_and_trace_ids_and_nothing_personal(
        relay_env, app_engine, redis_client, redis_prefix, log_stream, capsys):
    # Given a traced event for a key that holds a string (every XADD to it fails: the message's fault)
    stream = redis_prefix + "users"
    redis_client.set(stream, "not a stream")
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with app_engine.begin() as conn:
        mid = enqueue_event(conn, stream=stream, type="user.signed_up", headers={"traceparent": traceparent},
                            payload={"email": "jiwoo.park@example.com", "name": "박지우"})
    # When the relay runs
    assert load_handler("relay")(REDIS_EVENT, LocalContext(60))["dead"] == 1
    # Then one line says it was dead-lettered, with its message id, trace id and error class only
    out = capsys.readouterr().out + log_stream.getvalue()
    (line,) = [json.loads(x) for x in out.splitlines() if '"message dead-lettered"' in x]
    assert (line["message_id"], line["trace_id"], line["error_class"]) == \
        (str(mid), "4bf92f3577b34da6a3ce929d0e0e4736", "permanent")
    assert "jiwoo.park@example.com" not in out and "박지우" not in out and "WRONGTYPE" not in json.dumps(line)
