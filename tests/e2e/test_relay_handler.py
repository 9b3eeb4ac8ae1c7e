"""The real handler (functions/relay/app.py) on the sample events in events/."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from sqlalchemy import text

from outbox_relay import observability as obs
from outbox_relay import runtime
from outbox_relay.errors import ConfigurationError
from outbox_relay.local import LocalContext, load_handler, project_root
from outbox_relay.producer import enqueue_events_bulk

EVENTS = project_root() / "events"
SUMMARY_KEYS = {"channel", "claimed", "delivered", "retried", "dead", "released", "lease_lost"}


def event(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


def emf_blobs(text_out: str) -> list[dict]:
    blobs = []
    for line in text_out.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            blobs.append(json.loads(line))
    return blobs


def value(v):
    """EMF values may be a number or a list of numbers."""
    return sum(v) if isinstance(v, list) else v


@pytest.fixture
def log_stream():
    """Everything the Powertools logger writes during the test."""
    stream = io.StringIO()
    handler = obs.logger.registered_handler
    previous = handler.setStream(stream)
    yield stream
    handler.setStream(previous)


@pytest.fixture
def handler(relay_env):
    return load_handler("relay")


def seed(app_engine, prefix: str, n: int) -> None:
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=prefix + "orders", type="order.placed", payload={"n": i})
                                   for i in range(n)])


@pytest.mark.parametrize("sample", ["relay-redis-scheduler.json", "eventbridge-scheduled-event.json"])
def test_handler_relays_a_batch_and_returns_the_summary(handler, app_engine, redis_client, redis_prefix, sample,
                                                        capsys, monkeypatch):
    monkeypatch.setenv("OUTBOX_BATCH_SIZE", "7")
    seed(app_engine, redis_prefix, 10)
    summary = handler(event(sample), LocalContext(60))
    assert SUMMARY_KEYS <= set(summary)
    assert (summary["channel"], summary["claimed"], summary["delivered"]) == ("redis", 7, 7)
    assert redis_client.xlen(redis_prefix + "orders") == 7
    # EMF metrics: one blob with the channel dimension and the relay's counts
    (blob,) = emf_blobs(capsys.readouterr().out)
    assert blob["channel"] == "redis" and value(blob["Claimed"]) == 7 and value(blob["Delivered"]) == 7
    names = {m["Name"] for m in blob["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {"Claimed", "Delivered", "Retried", "DeadLettered", "Released", "LeaseLost", "BatchDuration",
            "OldestPendingAge"} <= names


def test_warm_invocations_reuse_the_dependencies(handler, app_engine, redis_prefix):
    seed(app_engine, redis_prefix, 4)
    handler(event("relay-redis-scheduler.json"), LocalContext(60))
    deps = runtime.get_dependencies()
    second = handler(event("relay-redis-scheduler.json"), LocalContext(60))
    assert runtime.get_dependencies() is deps
    assert second["claimed"] == 0
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message WHERE status = 'delivered'")).scalar() == 4


def test_logs_carry_ids_and_counts_but_no_payload(handler, app_engine, redis_prefix, capsys, log_stream):
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=redis_prefix + "pii", type="user.signed_up",
                                        payload={"email": "jiwoo.park@example.com", "name": "박지우"})])
    handler(event("relay-redis-scheduler.json"), LocalContext(60))
    out = capsys.readouterr().out + log_stream.getvalue()
    assert "jiwoo.park@example.com" not in out and "박지우" not in out and "\\ubc15" not in out
    log = next(json.loads(line) for line in out.splitlines() if '"relay batch done"' in line)
    assert log["delivered"] == 1 and log["function_request_id"]


def test_a_schedule_for_another_channel_is_refused(handler):
    with pytest.raises(ConfigurationError) as info:
        handler({"source": "outbox.scheduler", "channel": "ses"}, LocalContext(60))
    assert info.value.variable == "OUTBOX_CHANNEL"


def test_a_timeout_not_shorter_than_the_lease_is_refused(handler, app_engine, redis_prefix, rows_after=None):
    seed(app_engine, redis_prefix, 1)
    with pytest.raises(ConfigurationError) as info:
        handler(event("relay-redis-scheduler.json"), LocalContext(130))  # lease is 120 s
    assert info.value.variable == "OUTBOX_LEASE_SECONDS"
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT status, attempts FROM outbox_message")).one() == ("pending", 0)


def test_bad_configuration_stops_the_cold_start(relay_env, monkeypatch):
    monkeypatch.setenv("OUTBOX_LEASE_SECONDS", "10")
    runtime.reset()
    handler = load_handler("relay")
    with pytest.raises(ConfigurationError) as info:
        handler(event("relay-redis-scheduler.json"), LocalContext(60))
    assert info.value.variable == "OUTBOX_LEASE_SECONDS"


def test_a_short_context_releases_and_starts_nothing(handler, app_engine, redis_client, redis_prefix):
    seed(app_engine, redis_prefix, 3)
    summary = handler(event("relay-redis-scheduler.json"), LocalContext(4))  # margin is 5 s
    assert summary["claimed"] == 0 and "deadline" in summary["skipped"]
    assert redis_client.exists(redis_prefix + "orders") == 0
