"""The sample events in events/ and what the tests check after a function ran
on them, shared by the in-process tests (tests/e2e) and the Lambda container
tests (tests/sam_local): which function an event is for, seeding, rows, and
the EMF output against the template's alarms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import text

from outbox_relay import observability as obs
from outbox_relay.producer import enqueue
from outbox_relay.publishers.registry import CHANNELS
from support.rows import insert_rows
from support.template import ROOT, TemplateModel

EVENTS = ROOT / "events"
RELAY_FUNCTION = {s.name: f"Relay{s.template_prefix}Function" for s in CHANNELS}
SENDER = "outbox@example.com"
EMF_DIMENSIONS = {"channel", "service"}  # as tests/unit/test_template.py expects of the template


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def relay_channel(event: dict[str, Any]) -> str | None:
    """The channel a relay event is for (an EventBridge rule event: the Redis relay), else None."""
    if "action" in event or "RequestType" in event:
        return None
    if event.get("detail-type") == "Scheduled Event":
        return event.get("channel", "redis")
    return event.get("channel")


def functions_for(event: dict[str, Any]) -> list[str]:
    """The template's functions an event in events/ is for: a relay's schedule
    event, a maintenance request, a custom resource request for the migration
    function, an SNS delivery of an SES event for the feedback function; an EventBridge rule's "Scheduled Event" suits a relay and maintenance."""
    if "RequestType" in event:
        return ["MigrationFunction"]
    if "Records" in event:  # SES events through the configuration set's SNS destination
        return ["FeedbackFunction"]
    if "action" in event:
        return ["MaintenanceFunction"]
    channel = relay_channel(event)
    functions = [RELAY_FUNCTION[channel]] if channel in RELAY_FUNCTION else []
    if event.get("detail-type") == "Scheduled Event":
        functions.append("MaintenanceFunction")
    return functions


def emf_documents(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{") and '"_aws"' in line]


def assert_emf_matches_the_template(documents: list[dict[str, Any]], channel: str, namespace: str | None) -> None:
    """The EMF output's namespace and dimensions are those the template's alarms watch."""
    model = TemplateModel(every_condition=True)
    watched = [(ns, name, dims) for _, ns, name, dims in model.alarm_metrics() if ns == model.metrics_namespace()]
    watched += [s for s in model.dashboard_series() if s[0] == model.metrics_namespace()]
    assert documents, "the handler wrote no EMF metrics"
    for doc in documents:
        (directive,) = doc["_aws"]["CloudWatchMetrics"]
        if namespace is not None:
            assert directive["Namespace"] == namespace == model.metrics_namespace()
        (dimension_set,) = directive["Dimensions"]
        assert set(dimension_set) == EMF_DIMENSIONS
        emitted = {d: doc[d] for d in dimension_set}
        assert emitted == {"channel": channel, "service": obs.SERVICE}
        for metric in directive["Metrics"]:
            for _, name, dims in watched:
                if name == metric["Name"] and dims["channel"] == channel:
                    assert dims == emitted, f"template watches {name} with {dims}, the code emits {emitted}"


def seed(channel: str, app_engine, redis_prefix: str, n: int = 3) -> str:
    """Enqueue `n` messages for `channel` through the producer API's `enqueue`: type
    order.placed and payload {"n": i}, with a stream for Redis; an email for SES. Returns
    the stream (redis), the recipient domain (ses), or the channel."""
    with app_engine.begin() as conn:
        for i in range(n):
            if channel == "ses":
                enqueue(conn, channel="ses", to=f"customer{i}@example.net", subject=f"Order {i}", text="Thank you.")
            else:
                stream = {"stream": redis_prefix + "events"} if channel == "redis" else {}
                enqueue(conn, channel=channel, type="order.placed", payload={"n": i}, **stream)
    return {"redis": redis_prefix + "events", "ses": "example.net"}.get(channel, channel)


def statuses(app_engine) -> list[tuple[str, str, bool]]:
    with app_engine.connect() as conn:
        rows = conn.execute(text("SELECT channel, status, delivery_ref IS NOT NULL FROM outbox_message"))
        return sorted(tuple(r) for r in rows)


def seed_rows(db, n: int, status: str, *, channel: str = "redis", ago: float = 0.0, error_class: str | None = None,
              available_ago: float = 0.0) -> None:
    """`n` rows in `status`, `ago` seconds after they were delivered / died (database clock)."""
    with db.begin() as conn:
        conn.execute(insert_rows(
            """
            SELECT gen_random_uuid() AS message_id, CAST(:channel AS text) AS channel, 'orders' AS destination,
                   'order.placed' AS type, '{"n": 1}' AS payload, CAST(:status AS text) AS status,
                   CASE WHEN :status = 'pending' THEN 0 ELSE 3 END AS attempts,
                   now() - make_interval(secs => CAST(:available_ago AS float8)) AS available_at,
                   CASE WHEN :status = 'delivered' THEN now() - make_interval(secs => CAST(:ago AS float8)) END
                       AS delivered_at,
                   CASE WHEN :status = 'delivered' THEN '1-0' END AS delivery_ref,
                   CASE WHEN :status = 'dead' THEN now() - make_interval(secs => CAST(:ago AS float8)) END
                       AS dead_at,
                   CASE WHEN :status = 'dead' THEN 'failed' END AS last_error,
                   CAST(:error_class AS text) AS last_error_class
              FROM generate_series(1, :n)
            """, ["channel", "destination", "type", "status", "attempts", "available_at", "delivered_at",
                  "delivery_ref", "dead_at", "last_error", "last_error_class"]),
            {"n": n, "status": status, "channel": channel, "ago": float(ago),
             "available_ago": float(available_ago), "error_class": error_class})


def counts(db) -> dict[tuple[str, str], int]:
    with db.connect() as conn:
        return {(c, s): n for c, s, n in conn.execute(text(
            "SELECT channel, status, count(*) FROM outbox_message GROUP BY channel, status"))}
