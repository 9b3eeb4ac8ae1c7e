"""The poller handover on the real PostgreSQL and Redis: the registry statements,
leases of a dead poller taken over at once, real handler processes overlapping
(the older one leaves for the newer), and the self-invoke through a Lambda
client on moto's server."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
import zipfile

import pytest
from sqlalchemy import text

from outbox_relay.pollers import PollerRegistry
from outbox_relay.producer import enqueue_events_bulk
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from support.deadline import wait_for

EVENT = json.loads((project_root() / "events" / "relay-redis-scheduler.json").read_text())


def seed(app_engine, stream: str, n: int) -> list[str]:
    with app_engine.begin() as conn:
        return [str(i) for i in enqueue_events_bulk(conn, [dict(stream=stream, type="t", payload={"n": i})
                                                           for i in range(n)])]


def test_the_registry_measures_gaps_and_tells_older_pollers_of_newer_ones(relay_engine):
    registry = PollerRegistry(relay_engine, Channel.REDIS, ttl_seconds=5)
    assert registry.register("a", 60) == (None, 0)  # the channel's first: no gap to measure
    first = registry.renew("a", None)
    assert (first.registered, first.newer, first.others) == (True, 0, 0)

    gap, live = registry.register("b", 60)
    assert (gap, live) == (0.0, 1)
    b = registry.renew("b", None)  # b's reference time: a has not renewed since
    assert (b.newer, b.others) == (0, 1)
    assert registry.renew("b", b.at).older_unaware == 1
    a = registry.renew("a", first.at)
    assert (a.newer, a.others) == (1, 1)  # a sees b: it should leave
    assert registry.renew("b", b.at).older_unaware == 0  # a renewed after b's reference: it knows
    assert not registry.request_successor("a", 15)  # refused: b is newer and live
    assert registry.request_successor("b", 15)
    # Asked again after a lost reply, it answers the same (the poller itself asks once)
    assert registry.request_successor("b", 15)
    assert registry.register("b", 60) == (0.0, 1)  # a registration run again keeps the first one

    # A successor b started that has not registered yet is on its way: no other poller starts one
    assert registry.register("x", 60)[1] == 2 and registry.renew("x", None).registered
    assert not registry.request_successor("a", 15)
    registry.leave("x")

    registry.leave("a")
    registry.leave("b")
    time.sleep(0.3)
    gap, live = registry.register("c", 60)
    assert live == 0 and 0.25 <= gap < 2.0
    assert registry.renew("gone", None).registered is False


def test_a_taken_over_poller_is_told_and_its_derived_tokens_leases_go_too(relay_engine, app_engine, redis_prefix):
    # Given a poller that claimed under its token and under one it derived after a lost claim
    seed(app_engine, redis_prefix + "t", 4)
    slow = PollerRegistry(relay_engine, Channel.REDIS, ttl_seconds=1)
    slow.register("stalled", 60)
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=5)
    assert len(store.claim("stalled", 2, 120.0).messages) == 2 and len(store.claim("stalled/1", 2, 120.0).messages) == 2
    time.sleep(1.2)

    # When another poller finds its registration expired
    live = PollerRegistry(relay_engine, Channel.REDIS, ttl_seconds=5)
    live.register("live", 60)
    assert live.renew("live", None).expired == 1
    assert live.take_over() == (1, 4)

    # Then every lease of it expired now, and its own next renewal says it was taken over
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message WHERE lease_expires_at <= now()")).scalar_one() == 4
    assert slow.renew("stalled", None).registered is False


def test_a_dead_pollers_leases_are_taken_over_at_once_and_delivered(relay_env, monkeypatch, relay_engine, app_engine,
                                                                    redis_client, redis_prefix):
    # Given 30 messages leased for 120 s to a poller whose registration expired (killed -9)
    ids = seed(app_engine, redis_prefix + "orphans", 30)
    dead = PollerRegistry(relay_engine, Channel.REDIS, ttl_seconds=1)
    dead.register("dead-poller", 60)
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=5)
    assert len(store.claim("dead-poller", 30, 120.0).messages) == 30
    time.sleep(1.2)

    # When a latency-mode poller runs until the 30 are in the stream (then a second more)
    monkeypatch.setenv("OUTBOX_MODE", "latency")
    monkeypatch.setenv("OUTBOX_POLLER_TTL_SECONDS", "1")
    monkeypatch.setenv("OUTBOX_DEADLINE_MARGIN_SECONDS", "1")
    context, out = LocalContext(120), {}
    poller = threading.Thread(target=lambda: out.update(load_handler("relay")(EVENT, context)))
    poller.start()
    try:
        wait_for(lambda: redis_client.xlen(redis_prefix + "orphans") >= 30, what="the 30 in the stream")
    finally:
        context.leave_only(2.0)
        poller.join(30)
    summary = out

    # Then it took the leases over at once (not after 120 s), requeued them (a first
    # expiry) and delivered each once, in one batch
    assert summary["handover"]["leases_taken_over"] == 30
    assert summary["delivered"] == 30 and summary["suspects"] == 0
    entries = redis_client.xrange(redis_prefix + "orphans")
    assert sorted(f["id"] for _, f in entries) == sorted(ids)
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT DISTINCT status, attempts FROM outbox_message")).all() == [("delivered", 2)]
        assert conn.execute(text("SELECT taken_over_at IS NOT NULL FROM outbox_poller "
                                 "WHERE owner = 'dead-poller'")).scalar_one()


_POLLER = """
import json, sys
from outbox_tools.lambda_local import LocalContext, load_handler
event = {"source": "outbox.scheduler", "channel": "redis"}
print(json.dumps(load_handler("relay")(event, LocalContext(float(sys.argv[1])))))
"""


def _poller(env: dict[str, str], timeout: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _POLLER, str(timeout)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


@pytest.mark.slow  # two processes, about 10 s
def test_an_older_poller_leaves_once_a_newer_one_polls(database_url, servers, app_engine, redis_client, redis_prefix):
    # Given a poller process with 20 s to run, and messages committed all along
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")} | {
        "DATABASE_URL": database_url, "REDIS_URL": servers.redis_url, "OUTBOX_CHANNEL": "redis",
        "OUTBOX_MODE": "latency", "OUTBOX_DEADLINE_MARGIN_SECONDS": "1", "OUTBOX_POLLER_TTL_SECONDS": "1",
        "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_NAMESPACE": "OutboxRelayTest"}
    older = _poller(env, 20.0)
    ids: list[str] = []
    started = time.monotonic()
    while time.monotonic() - started < 3:
        ids += seed(app_engine, redis_prefix + "h", 5)
        time.sleep(0.05)

    # When a newer one starts
    newer = _poller(env, 6.0)
    newer_started = time.monotonic()
    out, _ = older.communicate(timeout=30)
    older_took = time.monotonic() - newer_started
    while time.monotonic() - newer_started < 3:
        ids += seed(app_engine, redis_prefix + "h", 5)
        time.sleep(0.05)
    newer_out, _ = newer.communicate(timeout=30)

    # Then the older one left within a couple of seconds (a cold start and a heartbeat),
    # long before its deadline, and every message is in the stream once
    first, second = json.loads(out.splitlines()[-1]), json.loads(newer_out.splitlines()[-1])
    assert first["handover"]["left_for_newer"] and older_took < 8.0
    assert not second["handover"]["left_for_newer"] and second["handover"]["gap_seconds"] == 0.0
    assert first["delivered"] > 0 and second["delivered"] > 0
    entries = redis_client.xrange(redis_prefix + "h")
    assert sorted(f["id"] for _, f in entries) == sorted(ids)
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT DISTINCT status FROM outbox_message")).scalars().all() == ["delivered"]
        assert conn.execute(text("SELECT count(*) FROM outbox_poller WHERE left_at IS NULL")).scalar_one() == 0


@pytest.fixture
def moto_lambda(monkeypatch):
    """moto's server with its Lambda backend that runs no code, a function to
    invoke, and a record of what each invoke carried."""
    import boto3
    from moto.awslambda_simple.models import LambdaSimpleBackend
    from moto.core.config import default_user_config
    from moto.server import ThreadedMotoServer

    monkeypatch.setitem(default_user_config, "lambda", {"use_docker": False})
    invoked: list[tuple[str, dict]] = []
    original = LambdaSimpleBackend.invoke

    def recording(self, function_name, qualifier, body, headers, response_headers):
        invoked.append((function_name, json.loads(body)))
        return original(self, function_name, qualifier, body, headers, response_headers)

    monkeypatch.setattr(LambdaSimpleBackend, "invoke", recording)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = "http://127.0.0.1:%d" % server.get_host_and_port()[1]
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_LAMBDA": url}.items():
        monkeypatch.setenv(k, v)
    role = boto3.client("iam", endpoint_url=url).create_role(
        RoleName="relay", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("app.py", "def handler(e, c):\n    return e\n")
    boto3.client("lambda", endpoint_url=url).create_function(
        FunctionName="stack-relay-redis", Runtime="python3.12", Role=role, Handler="app.handler",
        Code={"ZipFile": code.getvalue()})
    yield invoked
    server.stop()


def test_a_poller_near_its_deadline_starts_its_successor_through_lambda(relay_env, monkeypatch, moto_lambda,
                                                                        app_engine, redis_client, redis_prefix):
    # Given a latency-mode function named as Lambda names it, 3 s from its deadline (within the lead)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "stack-relay-redis")
    monkeypatch.setenv("OUTBOX_MODE", "latency")
    monkeypatch.setenv("OUTBOX_DEADLINE_MARGIN_SECONDS", "1")
    monkeypatch.setenv("OUTBOX_POLLER_TTL_SECONDS", "1")
    ids = seed(app_engine, redis_prefix + "s", 5)

    summary = load_handler("relay")(EVENT, LocalContext(4.0))

    # Then it invoked its own function once, asynchronously, naming itself as the predecessor
    assert summary["handover"]["successor"] == "requested" and summary["delivered"] == 5
    assert moto_lambda == [("stack-relay-redis", {"source": "outbox.handover", "channel": "redis",
                                                  "predecessor": summary["lease_owner"], "reason": "deadline"})]
    assert len(redis_client.xrange(redis_prefix + "s")) == len(ids)
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT successor_requested_at IS NOT NULL FROM outbox_poller")).scalar_one()


def test_a_poller_that_cannot_start_its_successor_says_so_and_goes_on(relay_env, monkeypatch, capfd, caplog):
    # Given no Lambda at the endpoint (nothing listens there)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "stack-relay-redis")
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("OUTBOX_MODE", "latency")
    monkeypatch.setenv("OUTBOX_DEADLINE_MARGIN_SECONDS", "2")
    monkeypatch.setenv("OUTBOX_POLLER_TTL_SECONDS", "1")

    started = time.monotonic()
    summary = load_handler("relay")(EVENT, LocalContext(4.0))

    # Then it polled to its deadline, and said so in a log line and a metric
    assert summary["handover"]["successor"] == "not_started" and time.monotonic() - started > 1.8
    assert any("could not start a successor" in r.getMessage() for r in caplog.records)
    out = capfd.readouterr().out
    assert any('"SuccessorNotStarted"' in line and '"_aws"' in line for line in out.splitlines())


@pytest.mark.slow  # two SES pollers, about 12 s
def test_two_ses_pollers_at_a_handover_stay_within_max_send_rate(database_url, app_engine, monkeypatch):
    import bisect

    from moto.ses.models import SESBackend

    from outbox_relay.producer import enqueue_email
    from outbox_tools.local_ses import LocalSesServer

    # Given 30 emails (60 by the handover), an account whose MaxSendRate is 10 per second, and every send's time noted
    sent_at: list[float] = []
    for name in ("send_email", "send_raw_email"):
        original = getattr(SESBackend, name)

        def noting(self, *args, _original=original, **kwargs):
            sent_at.append(time.monotonic())
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(SESBackend, name, noting)
    def enqueue(numbers: range) -> None:
        with app_engine.begin() as conn:
            for i in numbers:
                enqueue_email(conn, to=[f"user{i}@example.com"], subject="s", text="body")

    enqueue(range(30))
    with LocalSesServer(max_send_rate=10) as ses:
        ses.verify("noreply@shop.example")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "AWS_"))} | {
            "DATABASE_URL": database_url, "OUTBOX_CHANNEL": "ses", "OUTBOX_MODE": "latency",
            "OUTBOX_SES_FROM": "Shop <noreply@shop.example>", "AWS_ENDPOINT_URL_SESV2": ses.url,
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
            "OUTBOX_DEADLINE_MARGIN_SECONDS": "4",
            "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_NAMESPACE": "OutboxRelayTest"}
        script = _POLLER.replace('"channel": "redis"', '"channel": "ses"')
        older = subprocess.Popen([sys.executable, "-c", script, "14"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)

        # When a newer poller starts while the older one is sending its batch, and 30 more come
        waited = time.monotonic()
        while len(sent_at) < 10 and older.poll() is None and time.monotonic() - waited < 20:
            time.sleep(0.05)
        assert len(sent_at) >= 10, (older.poll(), len(sent_at), older.poll() is not None and older.communicate())
        newer = subprocess.Popen([sys.executable, "-c", script, "14"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        time.sleep(0.5)  # its cold start: imports, connections
        enqueue(range(30, 60))
        first, second = (json.loads(p.communicate(timeout=60)[0].splitlines()[-1]) for p in (older, newer))
        recorded = ses.sent_messages()

    # Then the older one left for it, both sent, each email went once, and no second of
    # the handover held more sends than MaxSendRate
    assert first["handover"]["left_for_newer"] and first["delivered"] > 0 and second["delivered"] > 0
    assert first["delivered"] + second["delivered"] == 60 == len(recorded)
    assert sorted(d for m in recorded for d in m.destinations["ToAddresses"]) == \
        sorted(f"user{i}@example.com" for i in range(60))
    sent_at.sort()
    busiest = max(bisect.bisect_left(sent_at, t + 1.0) - i for i, t in enumerate(sent_at))
    assert busiest <= 10, busiest
