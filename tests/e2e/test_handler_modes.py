"""Each invocation mode end to end through the real handler: Redis Streams on the
real Redis, SES on moto in server mode; the delivery-lag metric's EMF values
against the lags the rows give; the idle cost of a latency-mode invocation."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import text

from outbox_relay.lag import GROWTH
from outbox_relay.producer import enqueue_email, enqueue_events_bulk
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from outbox_tools.local_ses import LocalSesServer
from support.deadline import wait_for

EVENTS = project_root() / "events"


def event(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


def emf_blobs(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"_aws"' in line]


def as_list(v) -> list:
    return v if isinstance(v, list) else [v]


def seed(app_engine, prefix: str, n: int, stream: str = "orders") -> None:
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=prefix + stream, type="order.placed", payload={"n": i})
                                   for i in range(n)])


def rows(app_engine) -> list:
    with app_engine.connect() as conn:
        return conn.execute(text(
            "SELECT status, attempts, message_id::text AS message_id, delivery_ref, "
            "(EXTRACT(EPOCH FROM delivered_at - greatest(created_at, scheduled_at)) * 1000)::float8 AS lag_ms "
            "FROM outbox_message ORDER BY seq")).all()


@pytest.fixture
def mode_env(relay_env, monkeypatch):
    def _set(mode: str, **extra: str):
        monkeypatch.setenv("OUTBOX_MODE", mode)
        for k, v in extra.items():
            monkeypatch.setenv(k, v)
        return load_handler("relay")

    return _set


@pytest.mark.parametrize(("mode", "expected"), [("batch", 10), ("drain", 25),
                                                 pytest.param("latency", 25, marks=pytest.mark.slow)])
def test_each_mode_relays_to_redis_and_every_message_is_once_in_the_stream(mode, expected, mode_env, app_engine,
                                                                          redis_client, redis_prefix, capsys):
    # Given 25 messages and a batch of 10
    handler = mode_env(mode, OUTBOX_BATCH_SIZE="10", OUTBOX_DEADLINE_MARGIN_SECONDS="1")
    seed(app_engine, redis_prefix, 25)

    # When one invocation runs (latency mode until its deadline, 2 s away)
    started = time.monotonic()
    summary = handler(event("relay-redis-scheduler.json"), LocalContext(3.0 if mode == "latency" else 60))
    took = time.monotonic() - started

    # Then what each mode does was delivered, once, and the rows say so
    assert (summary["mode"], summary["claimed"], summary["delivered"]) == (mode, expected, expected)
    entries = redis_client.xrange(redis_prefix + "orders")
    assert len(entries) == expected == len({f["id"] for _, f in entries})
    assert [r.status for r in rows(app_engine)].count("delivered") == expected
    if mode == "latency":
        assert 1.8 < took < 3.0  # it polled until the deadline's margin, and ended before the timeout
    # And the summary and the EMF carry the delivery lag
    lag = summary["delivery_lag_ms"]
    assert lag["count"] == expected and lag["p50"] is not None and lag["max"] >= lag["p99"] >= lag["p50"]
    blobs = emf_blobs(capsys.readouterr().out)
    assert sum(sum(as_list(b.get("Delivered", 0))) for b in blobs) == expected


def test_latency_mode_delivers_what_is_committed_while_it_runs(mode_env, app_engine, redis_client, redis_prefix):
    # Given a latency-mode invocation running (until told to end), and an application
    # committing 10 messages, one every 100 ms, meanwhile
    handler = mode_env("latency", OUTBOX_DEADLINE_MARGIN_SECONDS="0.5", OUTBOX_POLL_INTERVAL_SECONDS="0.1")
    context = LocalContext(120)
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(summary=handler(event("relay-redis-scheduler.json"),
                                                                              context)))
    runner.start()
    try:
        time.sleep(0.2)
        for _ in range(10):
            seed(app_engine, redis_prefix, 1, stream="live")
            time.sleep(0.1)
        wait_for(lambda: redis_client.xlen(redis_prefix + "live") >= 10, what="the 10 messages in the stream")
    finally:
        context.leave_only(1.0)
        runner.join(30)

    # Then every message committed while it ran reached the stream, each within a second of its commit
    delivered = [r for r in rows(app_engine) if r.status == "delivered"]
    assert len(delivered) == 10 and all(r.status == "delivered" for r in rows(app_engine))
    assert max(r.lag_ms for r in delivered) < 1000
    assert redis_client.xlen(redis_prefix + "live") == len(delivered) == result["summary"]["delivered"]


def test_the_lag_metric_matches_the_lags_of_the_rows(mode_env, app_engine, redis_prefix, capsys):
    # Given 150 messages, some scheduled a little in the past (the lag counts from the later of
    # created_at and scheduled_at)
    handler = mode_env("drain", OUTBOX_BATCH_SIZE="40")
    seed(app_engine, redis_prefix, 150)
    time.sleep(0.05)

    # When a drain invocation delivers them
    summary = handler(event("relay-redis-scheduler.json"), LocalContext(60))
    assert summary["delivered"] == 150

    # Then DeliveryLag carries 100 values standing for the 150 lags (quantiles), DeliveryLagMax the
    # largest, and both agree with the rows within the histogram's precision
    lags = sorted(r.lag_ms for r in rows(app_engine))
    (blob,) = [b for b in emf_blobs(capsys.readouterr().out) if "DeliveryLag" in b]
    values = as_list(blob["DeliveryLag"])
    assert len(values) == 100
    tolerance = lambda v: max(1.5, v * (GROWTH - 1) * 1.5)  # noqa: E731 (2% buckets, whole milliseconds)
    assert abs(as_list(blob["DeliveryLagMax"])[0] - lags[-1]) <= 1.0
    for i, v in enumerate(values):  # value i stands for the (i + 0.5)/100 quantile
        true = lags[min(len(lags) - 1, int((i + 0.5) / 100 * len(lags)))]
        assert abs(v - true) <= tolerance(true) + 1.0, (i, v, true)
    names = {m["Name"]: m["Unit"] for m in blob["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert names["DeliveryLag"] == names["DeliveryLagMax"] == "Milliseconds"
    # and the summary's p50 is the rows' median, within the same precision
    median = lags[len(lags) // 2]
    assert abs(summary["delivery_lag_ms"]["p50"] - median) <= tolerance(median) + 1.0


def test_a_few_lags_are_emitted_exactly(mode_env, app_engine, redis_prefix, capsys):
    handler = mode_env("batch")
    seed(app_engine, redis_prefix, 3)
    handler(event("relay-redis-scheduler.json"), LocalContext(60))
    lags = sorted(r.lag_ms for r in rows(app_engine))
    (blob,) = [b for b in emf_blobs(capsys.readouterr().out) if "DeliveryLag" in b]
    values = sorted(as_list(blob["DeliveryLag"]))
    assert len(values) == 3 and all(abs(v - t) <= max(1.5, t * 0.03) for v, t in zip(values, lags))


@pytest.mark.slow
def test_a_long_invocation_flushes_its_metrics_while_it_runs(mode_env, app_engine, redis_prefix, capsys):
    # Given a latency invocation of 3.5 s that flushes its metrics every second
    handler = mode_env("latency", OUTBOX_METRICS_INTERVAL_SECONDS="1", OUTBOX_DEADLINE_MARGIN_SECONDS="0.5")
    seed(app_engine, redis_prefix, 5)
    handler(event("relay-redis-scheduler.json"), LocalContext(3.5))
    blobs = emf_blobs(capsys.readouterr().out)
    # Then several EMF documents came out, each with the channel, the counts adding up once
    assert len(blobs) >= 3 and all(b["channel"] == "redis" for b in blobs)
    assert sum(sum(as_list(b.get("Delivered", 0))) for b in blobs) == 5
    assert sum(sum(as_list(b.get("Claimed", 0))) for b in blobs) == 5


@pytest.mark.slow  # waits out a 2.5 s invocation; latency mode stays in the default run above
def test_an_idle_latency_invocation_costs_one_claim_per_poll(mode_env, app_engine, relay_engine, redis_prefix):
    # Given a table with a delivered history and nothing to deliver
    from sqlalchemy import event as sa_event

    from outbox_relay import runtime
    from outbox_relay.models import Outcome, OutcomeKind
    from outbox_relay.publishers.registry import Channel
    from outbox_relay.store import LeaseStore

    seed(app_engine, redis_prefix, 30)
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=3)
    claimed = store.claim("history", 30, 60).messages
    store.record("history", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1-1") for m in claimed])
    handler = mode_env("latency", OUTBOX_POLL_INTERVAL_SECONDS="0.1", OUTBOX_DEADLINE_MARGIN_SECONDS="0.5")
    runtime.get_dependencies()
    statements: list[str] = []
    sa_event.listen(runtime.get_engine(), "before_cursor_execute", lambda *a: statements.append(a[2]))

    # When a latency invocation polls for 2 s
    summary = handler(event("relay-redis-scheduler.json"), LocalContext(2.5))

    # Then it ran one claim per poll, no age query, and the poller registry's own
    # statements: its registration, a renewal five times per time-to-live (5 s), its leaving
    # (every 0.1 s, as the machine allows: a few polls are enough to count)
    assert summary["claimed"] == 0 and summary["polls"] >= 5
    claims = [s for s in statements if "outbox_poller" not in s]
    registry = [s for s in statements if "outbox_poller" in s]
    # (the last poll may find, after its gate, no time left to claim)
    assert summary["polls"] - 1 <= len(claims) <= summary["polls"]
    assert 3 <= len(registry) <= 2 + 2.5 / 1.0 + 1
    assert summary["oldest_pending_age_seconds"] == 0.0


@pytest.fixture
def local_ses():
    with LocalSesServer(max_send_rate=30) as server:
        server.verify("noreply@shop.example")
        yield server


@pytest.mark.parametrize("mode", ["batch", "drain", pytest.param("latency", marks=pytest.mark.slow)])
def test_each_mode_sends_email_through_ses_on_moto(mode, local_ses, relay_env, monkeypatch, app_engine):
    # Given six emails and the SES relay pointed at moto in server mode
    for k, v in {"OUTBOX_CHANNEL": "ses", "OUTBOX_MODE": mode, "OUTBOX_BATCH_SIZE": "4",
                 "OUTBOX_SES_FROM": "Shop <noreply@shop.example>", "AWS_ENDPOINT_URL_SESV2": local_ses.url,
                 "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with app_engine.begin() as conn:
        for i in range(6):
            enqueue_email(conn, to=[f"user{i}@example.com"], subject=f"mail {i}", text="body")
    handler = load_handler("relay")

    # When one invocation runs
    monkeypatch.setenv("OUTBOX_DEADLINE_MARGIN_SECONDS", "4")
    summary = handler(event("relay-ses-scheduler.json"), LocalContext(6.5 if mode == "latency" else 60))

    # Then batch mode sent one batch, the others all six, and moto recorded exactly those
    expected = 4 if mode == "batch" else 6
    assert (summary["mode"], summary["delivered"]) == (mode, expected)
    sent = local_ses.sent_messages()
    assert len(sent) == expected
    assert sorted(d for m in sent for d in m.destinations["ToAddresses"]) == \
        sorted(f"user{i}@example.com" for i in range(expected))
