"""Faults that must not stop the flow: a key whose first message another session
holds locked, a batch cut by the byte budget, a mass of expired leases after a
fleet-wide crash, PostgreSQL lost under a latency-mode poller."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import pytest
from sqlalchemy import text

from outbox_relay.loop import RelayLoop
from outbox_relay.models import Mode
from outbox_relay.producer import enqueue_events_bulk
from outbox_relay.publishers.base import Deadline
from support.deadline import countdown
from support.forward import Forwarder
from support.network import postgres_target, postgres_through

#: The largest payload the producer API takes: 256 KiB of UTF-8 JSON text.
BIG = {"b": "x" * (256 * 1024 - 16)}


def _per_key(redis_client, stream: str) -> dict[str, list[int]]:
    order: dict[str, list[int]] = collections.defaultdict(list)
    for _, f in redis_client.xrange(stream):
        order[f["key"]].append(int(f["type"]))
    return order


@pytest.mark.parametrize("mode, n, real_time", [
    (Mode.DRAIN, 2_000, False),
    pytest.param(Mode.DRAIN, 10_000, True, marks=pytest.mark.slow),
    pytest.param(Mode.LATENCY, 10_000, True, marks=pytest.mark.slow)],
    ids=["drain-2000", "drain-10000", "latency-10000"])
def test_a_key_whose_first_message_is_locked_holds_up_only_itself(store, publisher, policy, redis_client,
                                                                    redis_prefix, app_engine, rows, mode, n,
                                                                    real_time):
    # Given n messages of one key, then 300 of 30 other keys, and the hot key's first message
    # locked by a session left idle in its transaction (an operator's SELECT … FOR UPDATE)
    stream = redis_prefix + "locked"
    keys = ["hot"] * n + [f"k{i % 30}" for i in range(300)]
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=stream, type=str(i), payload={}, key=k) for i, k in enumerate(keys)])
    # Holds long enough to look at the rows before they end, however loaded the machine; the
    # slow runs wait for them, the quick one moves the clock of the held rows instead.
    store.locked_hold_seconds = (30.0, 30.0) if real_time else (60.0, 60.0)
    relay = dataclasses.replace(policy, batch_size=500, mode=mode)
    with app_engine.connect() as holder:
        holder.execute(text("SELECT seq FROM outbox_message WHERE key = 'hot' ORDER BY seq LIMIT 1 FOR UPDATE"))

        # When a relay runs: a drain until it finds nothing (it ends with time left, not
        # waiting on the lock), latency invocations of a few seconds until the other keys
        # are delivered (bounded: they may never be)
        if mode is Mode.DRAIN:
            RelayLoop(store, publisher, relay, left := countdown(120), "locked").run()
            assert not left.passed()
        began = time.monotonic()
        while mode is Mode.LATENCY and redis_client.xlen(stream) < 300 and time.monotonic() - began < 120:
            RelayLoop(store, publisher, relay, countdown(3), "locked").run()

        # Then the other keys were delivered, each in order, and none of the hot key
        order = _per_key(redis_client, stream)
        assert "hot" not in order and sum(map(len, order.values())) == 300
        assert all(seqs == sorted(seqs) for seqs in order.values())
        # And the hot key's backlog was moved out of the scan, its attempts unspent: a claim
        # of new messages reads those, not the rows behind the lock
        hot = [r for r in rows() if r["key"] == "hot"]
        assert {(r["status"], r["attempts"]) for r in hot} == {("pending", 0)}
        assert sum(not r["due"] for r in hot) >= 0.9 * n
        with app_engine.begin() as conn:
            enqueue_events_bulk(conn, [dict(stream=stream, type=str(n + 300), payload={}, key="late")])
        claim = store.claim("probe", 500, 30)
        assert [m.key for m in claim.messages] == ["late"] and claim.due < 50
        store.release("probe", [m.seq for m in claim.messages])
        # And the key's messages enqueued during the lock wait behind it too
        with app_engine.begin() as conn:
            enqueue_events_bulk(conn, [dict(stream=stream, type=str(n + 301 + i), payload={}, key="hot")
                                       for i in range(5)])
        holder.rollback()

    # When the lock is gone, the key goes on, in order, once its rows' hold ends
    if not real_time:
        with app_engine.begin() as conn:  # as a minute passing would, for the held rows
            conn.execute(text("UPDATE outbox_message SET available_at = available_at - interval '60 seconds' "
                              "WHERE key = 'hot' AND status = 'pending' AND available_at > now()"))
    deadline = time.monotonic() + 180
    drain = dataclasses.replace(relay, mode=Mode.DRAIN)
    while len(_per_key(redis_client, stream)["hot"]) < n + 5 and time.monotonic() < deadline:
        RelayLoop(store, publisher, drain, countdown(60), "after").run()
        time.sleep(0.2)
    hot_order = _per_key(redis_client, stream)["hot"]
    assert hot_order == list(range(n)) + list(range(n + 301, n + 306))


def test_drain_goes_on_past_batches_cut_by_the_byte_budget(enqueue, store, publisher, policy, redis_client,
                                                            redis_prefix, rows):
    # Given 120 payloads of 256 KiB: each pipelined claim takes half of the 32 MiB budget, 64 of them
    ids = enqueue(120, stream="big", payload=BIG)

    # When one drain invocation runs with a minute left
    summary = RelayLoop(store, publisher, dataclasses.replace(policy, batch_size=500, mode=Mode.DRAIN),
                             Deadline(lambda: 60_000, margin_seconds=5), "drain").run()

    # Then a batch cut by the budget counted as full: it went on until all were delivered, intact
    assert (summary.delivered, summary.batches) == (120, 2)
    assert {r["status"] for r in rows()} == {"delivered"}
    entries = redis_client.xrange(redis_prefix + "big", count=1)
    assert len(redis_client.xrange(redis_prefix + "big")) == len(ids) and len(entries[0][1]["payload"]) > 256_000


def test_a_mass_of_expired_leases_is_recovered_in_batches(enqueue, store, publisher, policy, rows, expire_leases,
                                                          redis_client, redis_prefix):
    # Given 2,000 messages claimed by relays that all died (every lease expired at once)
    enqueue(2000, stream="mass")
    for owner in ("a", "b", "c", "d"):
        store.claim(owner, 500, 30).messages
    expire_leases()

    # When one drain invocation runs
    summary = RelayLoop(store, publisher, dataclasses.replace(policy, batch_size=500, mode=Mode.DRAIN),
                             Deadline(lambda: 600_000, margin_seconds=5), "recovery").run()

    # Then they came back at batch speed, not one message per claim, each once, on its second attempt
    assert summary.delivered == 2000 and summary.suspects == 0 and summary.batches <= 8
    assert {(r["status"], r["attempts"]) for r in rows()} == {("delivered", 2)}
    assert len({f["id"] for _, f in redis_client.xrange(redis_prefix + "mass")}) == 2000


def test_batch_mode_delivers_a_requeued_lease_when_its_claim_also_killed_one(enqueue, store, publisher, policy,
                                                                              rows, expire_leases):
    # Given two expired leases: one with attempts left, one with none
    enqueue(1, stream="kept")
    enqueue(1, stream="spent", max_attempts=1)
    store.claim("died", 10, 30).messages
    expire_leases()

    # When one batch-mode invocation runs
    summary = RelayLoop(store, publisher, dataclasses.replace(policy, mode=Mode.BATCH),
                             Deadline(lambda: 600_000, margin_seconds=5), "after").run()

    # Then the claim that killed one and requeued the other is not the batch: the requeued one goes now
    assert summary.dead == 1 and summary.delivered == 1
    assert [(r["status"], r["attempts"]) for r in rows()] == [("delivered", 2), ("dead", 1)]


def test_a_lease_that_expires_again_is_reclaimed_alone(enqueue, store, rows, expire_leases):
    # Given a batch whose holder died, requeued, claimed again, and whose new holder died too
    enqueue(5, stream="again")
    store.claim("first", 10, 30).messages
    expire_leases()
    assert store.claim("second", 10, 30).requeued == 5
    assert len(store.claim("second", 10, 30).messages) == 5
    expire_leases()

    # Then each is now a suspect: re-claimed alone, with nothing else
    claim = store.claim("third", 10, 30)
    assert claim.suspect and len(claim.messages) == 1 and claim.messages[0].attempts == 3


def _poller_through(forwarder: Forwarder, database_url: str, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", postgres_through(forwarder, database_url))


@pytest.fixture
def pg_forwarder(database_url):
    target = postgres_target(database_url)
    forwarder = Forwarder("127.0.0.1", *target).__enter__()
    state = {"forwarder": forwarder, "target": target}
    yield state
    state["forwarder"].cut()


def test_a_latency_poller_rides_through_a_lost_database(relay_env, monkeypatch, database_url, pg_forwarder, app_engine,
                                                        redis_client, redis_prefix):
    from outbox_relay.producer import enqueue_events_bulk
    from outbox_tools.lambda_local import LocalContext, load_handler

    # Given a latency-mode poller that reaches PostgreSQL through a forwarder
    forwarder = pg_forwarder["forwarder"]
    _poller_through(forwarder, database_url, monkeypatch)
    monkeypatch.setenv("OUTBOX_MODE", "latency")
    monkeypatch.setenv("OUTBOX_DEADLINE_MARGIN_SECONDS", "1")
    handler = load_handler("relay")
    event = {"source": "outbox.scheduler", "channel": "redis"}
    out: dict = {}
    poller = threading.Thread(target=lambda: out.update(handler(event, LocalContext(7.0))))
    poller.start()
    time.sleep(1.5)

    # When PostgreSQL cannot be reached for 1.5 s (every connection dropped, new ones refused)
    # while messages are committed
    forwarder.cut()
    with app_engine.begin() as conn:
        ids = enqueue_events_bulk(conn, [dict(stream=redis_prefix + "blip", type="t", payload={"n": i})
                                         for i in range(10)])
    time.sleep(1.5)
    pg_forwarder["forwarder"] = Forwarder("127.0.0.1", *pg_forwarder["target"], port=forwarder.port).__enter__()
    back = time.time()
    poller.join(15)

    # Then the poller waited instead of ending, and delivered within a second of the return
    assert out["delivered"] == 10 and out["gate_closed"]
    assert 1.0 <= out["database_unreachable_seconds"] <= 3.0
    entries = redis_client.xrange(redis_prefix + "blip")
    assert sorted(f["id"] for _, f in entries) == sorted(str(i) for i in ids)
    first_ms = min(int(e.split("-")[0]) for e, _ in entries)
    assert first_ms / 1000 - back <= 1.0
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT DISTINCT status FROM outbox_message")).scalars().all() == ["delivered"]


def test_batch_and_drain_still_fail_fast_without_the_database(store, publisher, policy, database_url):
    from sqlalchemy import create_engine
    from sqlalchemy.exc import DBAPIError

    from outbox_relay.publishers.registry import Channel
    from outbox_relay.store import LeaseStore

    # A relay whose database refuses connections: batch and drain end with the error (the next run retries)
    engine = create_engine("postgresql+pg8000://postgres@127.0.0.1:9/nothing", isolation_level="AUTOCOMMIT")
    nowhere = LeaseStore(engine, Channel.REDIS, default_max_attempts=3)
    for mode in (Mode.BATCH, Mode.DRAIN):
        with pytest.raises(DBAPIError):
            RelayLoop(nowhere, publisher, dataclasses.replace(policy, mode=mode), countdown(2.0), "x").run()
    # Latency mode waits for it instead, until its deadline
    started = time.monotonic()
    summary = RelayLoop(nowhere, publisher, dataclasses.replace(policy, mode=Mode.LATENCY), countdown(1.5, margin=0.2),
                             "y").run()
    assert summary.gate_closed and summary.claimed == 0 and 1.0 <= summary.database_unreachable_seconds < 2.0
    assert time.monotonic() - started < 3
    engine.dispose()


@pytest.mark.slow  # PostgreSQL stopped for 1, 10 and 40 s under one poller: about 70 s
def test_a_latency_poller_rides_through_postgresql_stopped_for_1_10_and_40_seconds(relay_env, monkeypatch, tmp_path,
                                                                                     redis_client, redis_prefix):
    import json
    from datetime import datetime, timedelta, timezone
    from urllib.parse import parse_qs, urlparse

    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from outbox_migrations import upgrade
    from outbox_relay.pollers import PollerRegistry
    from outbox_relay.producer import enqueue_event
    from outbox_relay.publishers.registry import Channel
    from outbox_tools.lambda_local import LocalContext, load_handler

    pgserver = pytest.importorskip("pgserver", reason="embedded PostgreSQL (pip install -e '.[embedded]')")
    from pgserver._commands import pg_ctl

    # Given a PostgreSQL of this test's own, and a latency-mode poller on it
    server = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    socket_dir = parse_qs(urlparse(server.get_uri()).query)["host"][0]
    url = f"postgresql+pg8000://postgres@/postgres?unix_sock={socket_dir}/.s.PGSQL.5432"
    app = create_engine(url, poolclass=NullPool)
    upgrade(app)
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("OUTBOX_MODE", "latency")
    monkeypatch.setenv("OUTBOX_DEADLINE_MARGIN_SECONDS", "2")
    handler = load_handler("relay")
    out: dict = {}
    poller = threading.Thread(target=lambda: out.update(handler({"source": "outbox.scheduler", "channel": "redis"},
                                                                 LocalContext(120.0))))
    poller.start()
    time.sleep(1.0)
    resumed = []
    try:
        for outage in (1, 10, 40):
            # When messages come due just after PostgreSQL stops (-m immediate) for that long
            stream = f"{redis_prefix}down{outage}"
            with app.begin() as conn:
                for i in range(5):
                    enqueue_event(conn, stream=stream, type="t", payload={"i": i},
                                  deliver_at=datetime.now(timezone.utc) + timedelta(seconds=0.3))
            pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user)
            time.sleep(outage)
            pg_ctl(["-w", "-l", str(server.log), "-o", '-h ""', "-o", f"-k {socket_dir}", "start"],
                   pgdata=server.pgdata, user=server.system_user)
            back = time.time()
            waited = time.monotonic()
            while redis_client.xlen(stream) < 5 and time.monotonic() - waited < 10:
                time.sleep(0.05)
            # Then the poller delivered them within a second of its return
            entries = redis_client.xrange(stream)
            assert len(entries) == 5, (outage, entries)
            resumed.append(min(int(e.split("-")[0]) for e, _ in entries) / 1000 - back)
        # A newer poller ends this one (it leaves within a heartbeat)
        PollerRegistry(create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool), Channel.REDIS,
                       ttl_seconds=5).register("newer", 30)
        poller.join(30)
    finally:
        app.dispose()
        try:  # the server it started again is not the one pgserver would stop
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)
        except Exception:
            pass
        server.cleanup()
    assert not poller.is_alive() and out, "the poller did not return"
    assert all(r <= 1.0 for r in resumed), resumed
    assert out["handover"]["left_for_newer"] and out["delivered"] == 15
    # 51 s of outages, plus each restart's time, which a loaded machine stretches
    assert 50 <= out["database_unreachable_seconds"] <= 80, json.dumps(out)
