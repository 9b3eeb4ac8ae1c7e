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
    assert registry.register("a", 60) == (None, 0, 0)  # the channel's first: no gap to measure
    first = registry.renew("a", None)
    assert (first.registered, first.newer, first.others) == (True, 0, 0)

    gap, live, slot = registry.register("b", 60)
    assert (gap, live, slot) == (0.0, 1, 0)  # one slot kept: it takes the oldest's
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
    assert registry.register("b", 60) == (0.0, 1, 0)  # a registration run again keeps the first one

    # A successor b started that has not registered yet is on its way: no other poller starts one
    assert registry.register("x", 60)[1] == 2 and registry.renew("x", None).registered
    assert not registry.request_successor("a", 15)
    registry.leave("x")

    registry.leave("a")
    registry.leave("b")
    time.sleep(0.3)
    gap, live, _ = registry.register("c", 60)
    assert live == 0 and 0.25 <= gap < 2.0
    assert registry.renew("gone", None).registered is False


def test_the_registry_keeps_pollers_in_slots_and_adds_one_at_a_time(relay_engine):
    # Given two slots kept: the first two pollers take one each, a third the oldest's
    registry = PollerRegistry(relay_engine, Channel.REDIS, ttl_seconds=5, slots=2)
    assert [registry.register(o, 60)[2] for o in ("a", "b")] == [0, 1]
    assert registry.register("c", 60)[2] == 0
    assert registry.renew("a", None).newer == 1 and registry.renew("b", None).newer == 0
    # A successor takes the slot it was started for, and only its predecessor leaves for it
    assert registry.request_successor("b", 15)
    assert registry.register("b2", 60, 1)[2] == 1
    assert registry.renew("b", None).newer == 1 and registry.renew("c", None).newer == 0
    assert not registry.request_successor("b", 15)  # asked once already, and b2 is newer
    registry.leave("a")
    registry.leave("b")

    # An add goes to the first free slot of the maximum, one per channel at a time
    assert registry.add("c", 4, 15) == 2
    assert registry.add("b2", 4, 15) is None  # c's add is within the cooldown
    assert registry.register("added", 60, 2)[2] == 2
    assert registry.add("added", 4, 15) is None
    with relay_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_poller SET add_requested_at = add_requested_at - interval '10 s'"))
    assert registry.add("b2", 4, 15) == 3
    registry.register("added2", 60, 3)
    with relay_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_poller SET add_requested_at = add_requested_at - interval '10 s'"))
    assert registry.add("c", 4, 15) is None  # every slot of the maximum is held


def test_each_poller_is_told_its_part_and_one_part_while_a_poller_takes_parts_otherwise(relay_engine):
    # Given two pollers in two slots
    registry = PollerRegistry(relay_engine, Channel.REDIS, ttl_seconds=5, slots=3)
    assert [registry.register(o, 60)[2] for o in ("a", "b")] == [0, 1]
    # Then each is told its place among the live slots and their count
    assert [(r.part, r.parts) for r in (registry.renew("a", None), registry.renew("b", None))] == [(0, 2), (1, 2)]
    # When a poller of the version before, which took parts otherwise, is live in the third slot
    registry.register("old", 60)
    with relay_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_poller SET parts_by_range = false WHERE owner = 'old'"))
    # Then the others take one part, the whole channel, until it is gone
    assert [(r.part, r.parts) for r in (registry.renew("a", None), registry.renew("b", None))] == [(0, 1), (0, 1)]
    registry.leave("old")
    assert [(r.part, r.parts) for r in (registry.renew("a", None), registry.renew("b", None))] == [(0, 2), (1, 2)]


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


@pytest.mark.slow  # two processes, about 20 s
def test_an_older_poller_leaves_once_a_newer_one_polls(database_url, servers, app_engine, redis_client, redis_prefix):
    # Given a poller process with 40 s to run, and messages committed all along
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")} | {
        "DATABASE_URL": database_url, "REDIS_URL": servers.redis_url, "OUTBOX_CHANNEL": "redis",
        "OUTBOX_MODE": "latency", "OUTBOX_DEADLINE_MARGIN_SECONDS": "1", "OUTBOX_POLLER_TTL_SECONDS": "1",
        "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_NAMESPACE": "OutboxRelayTest"}
    older = _poller(env, 40.0)
    ids: list[str] = []
    started = time.monotonic()
    while time.monotonic() - started < 3:
        ids += seed(app_engine, redis_prefix + "h", 5)
        time.sleep(0.05)

    # When a newer one starts (with time to poll after a cold start on a loaded machine)
    newer = _poller(env, 15.0)
    newer_started = time.monotonic()
    out, _ = older.communicate(timeout=30)
    older_took = time.monotonic() - newer_started
    left = time.monotonic()  # messages for the newer one, however long the older took to leave
    while time.monotonic() - left < 3:
        ids += seed(app_engine, redis_prefix + "h", 5)
        time.sleep(0.05)
    newer_out, _ = newer.communicate(timeout=30)

    # Then the older one left once the newer one polled (a cold start and a heartbeat),
    # long before its deadline, and every message is in the stream once
    first, second = json.loads(out.splitlines()[-1]), json.loads(newer_out.splitlines()[-1])
    assert first["handover"]["left_for_newer"] and older_took < 20.0
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
                                                  "predecessor": summary["lease_owner"], "reason": "deadline",
                                                  "slot": 0})]
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


@pytest.mark.slow  # four poller processes, about 15 s
def test_several_pollers_one_killed_mid_run_lose_nothing_and_keep_each_keys_order(database_url, servers, app_engine,
                                                                                  redis_client, redis_prefix):
    import collections
    import signal

    # Given OUTBOX_POLLERS=3: three poller processes of one channel, and an application
    # committing messages of 20 keys all along
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")} | {
        "DATABASE_URL": database_url, "REDIS_URL": servers.redis_url, "OUTBOX_CHANNEL": "redis",
        "OUTBOX_MODE": "latency", "OUTBOX_POLLERS": "3", "OUTBOX_DEADLINE_MARGIN_SECONDS": "1",
        # A registration lives 3 s: a loaded machine may starve a heartbeat for a second
        "OUTBOX_POLLER_TTL_SECONDS": "3", "OUTBOX_BATCH_SIZE": "20",
        "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_NAMESPACE": "OutboxRelayTest"}
    stream = redis_prefix + "k"
    order: dict[str, tuple[str, int]] = {}  # message id -> (key, its place among the key's)
    counts: collections.Counter = collections.Counter()

    def commit(n: int) -> None:
        rows = []
        for _ in range(n):
            rows.append(dict(stream=stream, type="t", payload={"n": 1}, key=f"key{(len(order) + len(rows)) % 20}"))
        with app_engine.begin() as conn:
            ids = enqueue_events_bulk(conn, rows)
        for i, row in zip(ids, rows):
            order[str(i)] = (row["key"], counts[row["key"]])
            counts[row["key"]] += 1

    pollers = [_poller(env, 30.0) for _ in range(3)]
    try:
        # Each poller's slot row, once written, stays: cold starts on a loaded machine need
        # not overlap to the instant for the test to go on
        wait_for(lambda: _slots(app_engine) == 3, what="three pollers registered")
        started = time.monotonic()
        while time.monotonic() - started < 3:
            commit(20)
            time.sleep(0.02)

        # When one is killed -9 mid-run, while messages keep coming
        wait_for(lambda: redis_client.xlen(stream) > 0, what="deliveries")
        pollers[1].send_signal(signal.SIGKILL)
        pollers[1].wait(30)
        started = time.monotonic()
        while time.monotonic() - started < 3:
            commit(20)
            time.sleep(0.02)
        wait_for(lambda: redis_client.xlen(stream) >= len(order), what="every message in the stream")
        outs = [json.loads(pollers[i].communicate(timeout=60)[0].splitlines()[-1]) for i in (0, 2)]
    finally:
        for p in pollers:
            if p.poll() is None:
                p.kill()
                p.wait(30)

    # Then the other two polled on side by side, each in its own slot, none leaving for the other
    assert len({o["handover"]["slot"] for o in outs}) == 2 and not any(o["handover"]["left_for_newer"] for o in outs)
    assert all(o["delivered"] > 0 for o in outs)
    with app_engine.connect() as conn:
        slots = conn.execute(text("SELECT slot, taken_over_at IS NOT NULL FROM outbox_poller ORDER BY slot")).all()
        statuses = conn.execute(text("SELECT DISTINCT status FROM outbox_message")).scalars().all()
    assert [s for s, _ in slots] == [0, 1, 2] and sum(t for _, t in slots) == 1  # the killed one's, taken over
    assert statuses == ["delivered"]
    # and nothing was lost, nothing published twice (the dedupe absorbs a killed batch's
    # redelivery), each key's messages in the stream in the order they were committed
    entries = [f for _, f in redis_client.xrange(stream)]
    assert sorted(f["id"] for f in entries) == sorted(order)
    places: dict[str, list[int]] = collections.defaultdict(list)
    for f in entries:
        key, place = order[f["id"]]
        assert f["key"] == key
        places[key].append(place)
    assert all(p == sorted(p) for p in places.values())


def _slots(app_engine) -> int:
    with app_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM outbox_poller")).scalar_one()


def _live_pollers(app_engine) -> int:
    with app_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM outbox_poller WHERE left_at IS NULL "
                                 "AND expires_at > now()")).scalar_one()


def test_a_poller_facing_an_old_backlog_adds_one_poller_through_lambda(relay_env, monkeypatch, moto_lambda,
                                                                       app_engine, redis_client, redis_prefix):
    # Given one poller kept, up to three while the oldest due message is older than a second,
    # and a backlog 30 s old that small batches take a while to drain
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "stack-relay-redis")
    for name, value in {"OUTBOX_MODE": "latency", "OUTBOX_DEADLINE_MARGIN_SECONDS": "1",
                        "OUTBOX_POLLER_TTL_SECONDS": "1", "OUTBOX_POLLERS_MAX": "3", "OUTBOX_BATCH_SIZE": "5",
                        "OUTBOX_POLLERS_ADD_AGE_SECONDS": "1"}.items():
        monkeypatch.setenv(name, value)
    seed(app_engine, redis_prefix + "old", 3000)
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET available_at = available_at - interval '30 s', "
                          "created_at = created_at - interval '30 s'"))

    summary = load_handler("relay")(EVENT, LocalContext(3.0))

    # Then it asked for one poller in the next slot, once (one add per channel at a time;
    # moto runs no code, so none registered)
    added = [e for _, e in moto_lambda if e["reason"] == "backlog"]
    assert added == [{"source": "outbox.handover", "channel": "redis", "predecessor": None, "reason": "backlog",
                      "slot": 1}]
    assert summary["handover"]["slot"] == 0 and summary["delivered"] > 0
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_poller WHERE add_requested_at IS NOT NULL")).scalar_one() == 1


# A poller process whose self-invoke starts another such process (what Lambda would
# run), unless the test has written the stop file; each writes its summary to a file.
_SCALING_POLLER = """
import json, os, subprocess, sys
from outbox_relay import runtime
from outbox_tools.lambda_local import LocalContext, load_handler
event, timeout, folder = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]

def starter(name, region):
    def start(event):
        if os.path.exists(os.path.join(folder, "stop")):
            raise RuntimeError("the test is over")
        log = open(os.path.join(folder, f"{len(os.listdir(folder))}-{os.getpid()}.log"), "w")
        subprocess.Popen([sys.executable, "-c", "SCRIPT = " + repr(SCRIPT) + "\\n" + SCRIPT, json.dumps(event),
                          timeout, folder],
                         stdout=log, stderr=subprocess.STDOUT)
    return start

runtime.lambda_starter = starter
with open(os.path.join(folder, f"{os.getpid()}.pid"), "w") as f:
    f.write(json.dumps(event))
summary = load_handler("relay")(event, LocalContext(float(timeout)))
with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
    f.write(json.dumps(summary))
"""
_SCALING_POLLER = "SCRIPT = " + repr(_SCALING_POLLER) + "\n" + _SCALING_POLLER


@pytest.mark.slow  # pollers scaling up and down as processes, about a minute
def test_pollers_added_for_a_backlog_one_killed_then_shed_lose_nothing_and_keep_each_keys_order(
        database_url, servers, app_engine, redis_client, redis_prefix, tmp_path):
    import collections
    import signal

    # Given one poller kept and up to three while the oldest due message is over a second
    # old, small batches, and a backlog of 40 keys committed 30 s ago
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")} | {
        "DATABASE_URL": database_url, "REDIS_URL": servers.redis_url, "OUTBOX_CHANNEL": "redis",
        "OUTBOX_MODE": "latency", "OUTBOX_POLLERS_MAX": "3", "OUTBOX_POLLERS_ADD_AGE_SECONDS": "1",
        "OUTBOX_DEADLINE_MARGIN_SECONDS": "1", "OUTBOX_POLLER_TTL_SECONDS": "1", "OUTBOX_BATCH_SIZE": "5",
        "OUTBOX_SUCCESSOR_LEAD_SECONDS": "10", "AWS_LAMBDA_FUNCTION_NAME": "stack-relay-redis",
        "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_NAMESPACE": "OutboxRelayTest"}
    stream = redis_prefix + "scale"
    rows = [dict(stream=stream, type="t", payload={"n": i}, key=f"key{i % 40}") for i in range(5000)]
    with app_engine.begin() as conn:
        ids = [str(i) for i in enqueue_events_bulk(conn, rows)]
        conn.execute(text("UPDATE outbox_message SET available_at = available_at - interval '30 s', "
                          "created_at = created_at - interval '30 s'"))
    place = {i: (row["key"], n) for n, (i, row) in enumerate(zip(ids, rows))}

    # When a scheduled run starts, adds pollers, and an added one is killed -9 once it polls
    first = subprocess.Popen([sys.executable, "-c", _SCALING_POLLER, json.dumps(EVENT), "40", str(tmp_path)],
                             env=env, stdout=(tmp_path / "first.log").open("w"), stderr=subprocess.STDOUT)
    most = [0]

    def live() -> int:
        most[0] = max(most[0], _live_pollers(app_engine))
        return most[0]

    try:
        wait_for(lambda: live() >= 2, what="a poller added", seconds=60)
        added = [int(p.stem) for p in tmp_path.glob("*.pid") if json.loads(p.read_text()).get("reason") == "backlog"]
        os.kill(added[0], signal.SIGKILL)
        wait_for(lambda: redis_client.xlen(stream) >= len(ids), what="the backlog delivered", seconds=300)
        # Then, the backlog gone, the added pollers find nothing to do and leave
        wait_for(lambda: _live_pollers(app_engine) == 1, what="back to the one poller kept", seconds=60)
    finally:
        (tmp_path / "stop").write_text("")
        wait_for(lambda: _live_pollers(app_engine) == 0, what="every poller ended", seconds=90)
        first.wait(30)

    # and pollers were added while the backlog was old, never beyond the maximum slots
    assert most[0] >= 2
    with app_engine.connect() as conn:
        slots = conn.execute(text("SELECT slot, count(*) FROM outbox_poller GROUP BY slot ORDER BY slot")).all()
        statuses = conn.execute(text("SELECT DISTINCT status FROM outbox_message")).scalars().all()
    assert [s for s, _ in slots][0] == 0 and max(s for s, _ in slots) <= 2
    shed = [json.loads(p.read_text())["handover"]["shed"] for p in tmp_path.glob("*.json")]
    assert any(shed)
    # and nothing was lost or published twice, each key's messages in the stream in order
    assert statuses == ["delivered"]
    entries = [f for _, f in redis_client.xrange(stream)]
    assert sorted(f["id"] for f in entries) == sorted(ids)
    order: dict[str, list[int]] = collections.defaultdict(list)
    for f in entries:
        order[place[f["id"]][0]].append(place[f["id"]][1])
    assert all(p == sorted(p) for p in order.values())
