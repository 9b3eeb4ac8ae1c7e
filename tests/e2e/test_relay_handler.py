"""The real handler (functions/relay/app.py) on the sample events in events/."""

from __future__ import annotations

import io
import json

import pytest
from sqlalchemy import text

from outbox_relay import observability as obs
from outbox_relay import runtime
from outbox_relay.errors import ConfigurationError
from outbox_relay.producer import enqueue_events_bulk
from outbox_tools.lambda_local import LocalContext, load_handler, project_root

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


def test_oldest_pending_age_comes_with_the_outcome_write_and_alone_when_no_claim_ran(
        handler, app_engine, redis_client, redis_prefix, monkeypatch):
    from sqlalchemy import event as sa_event

    monkeypatch.setenv("OUTBOX_BATCH_SIZE", "1")
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=redis_prefix + "orders", type="t", payload={"n": i}) for i in range(3)])
        # due 300 s, 120 s and 0 s ago (the database's clock)
        for offset, seconds in ((0, 300), (1, 120), (2, 0)):
            conn.execute(text("UPDATE outbox_message SET available_at = now() - make_interval(secs => :s) "
                              "WHERE seq = (SELECT seq FROM outbox_message ORDER BY seq OFFSET :k LIMIT 1)"),
                         {"s": seconds, "k": offset})
    statements: list[str] = []

    def count(conn, cursor, statement, *args):  # noqa: ANN001
        statements.append(statement)

    handler(event("relay-redis-scheduler.json"), LocalContext(60))  # cold start outside the count
    engine = runtime.get_engine()
    sa_event.listen(engine, "before_cursor_execute", count)
    try:
        # The 120 s one is delivered; the oldest due left is the one due now: age about 0
        second = handler(event("relay-redis-scheduler.json"), LocalContext(60))
        assert second["delivered"] == 1 and 0 <= second["oldest_pending_age_seconds"] < 30
        assert len(statements) == 2  # claim; outcomes with the age
        statements.clear()
        third = handler(event("relay-redis-scheduler.json"), LocalContext(60))
        assert third["delivered"] == 1 and third["oldest_pending_age_seconds"] == 0
        statements.clear()
        # Nothing left to claim: the empty claim says nothing is due, so no statement of its own
        fourth = handler(event("relay-redis-scheduler.json"), LocalContext(60))
        assert fourth["claimed"] == 0 and fourth["oldest_pending_age_seconds"] == 0
        assert len(statements) == 1  # claim
        statements.clear()
        # With the gate closed there is no claim, and the age (of a message due 60 s ago) is read alone
        with app_engine.begin() as conn:
            enqueue_events_bulk(conn, [dict(stream=redis_prefix + "orders", type="t", payload={"n": 9})])
            conn.execute(text("UPDATE outbox_message SET available_at = now() - interval '60 seconds' "
                              "WHERE status = 'pending'"))
        monkeypatch.setattr(runtime.get_dependencies().publisher, "gate", lambda: "redis unavailable (test)")
        fifth = handler(event("relay-redis-scheduler.json"), LocalContext(60))
        assert fifth["claimed"] == 0 and fifth["gate_closed"] and 55 < fifth["oldest_pending_age_seconds"] < 90
        assert len(statements) == 1  # age
    finally:
        sa_event.remove(engine, "before_cursor_execute", count)
    assert redis_client.xlen(redis_prefix + "orders") == 3


def test_the_age_read_with_the_outcomes_is_the_oldest_due_message_left(handler, app_engine, redis_prefix,
                                                                       monkeypatch):
    monkeypatch.setenv("OUTBOX_BATCH_SIZE", "1")
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=redis_prefix + "orders", type="t", payload={"n": i}) for i in range(2)])
        conn.execute(text("UPDATE outbox_message SET available_at = now() - make_interval(secs => 600 - seq)"))
    summary = handler(event("relay-redis-scheduler.json"), LocalContext(60))
    # the first (due 599 s ago) was delivered; the second, due 598 s ago, is left
    assert summary["delivered"] == 1 and 590 <= summary["oldest_pending_age_seconds"] < 640
