"""Many claimers at once: every message delivered exactly once, none claimed twice while leased."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis as redis_lib
from sqlalchemy import text

from outbox_relay.backoff import Backoff
from outbox_relay.loop import RelayPolicy
from outbox_relay.models import OutcomeKind
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from outbox_relay.store import LeaseStore, lease_token

N = 5000
CLAIMER = Path(__file__).parents[1] / "support" / "claimer.py"


def assert_exactly_once(ids, claims, redis_client, stream, app_engine, released=()):
    # No message was in two claims unless an earlier one gave it back (a batch claimed ahead
    # when an invocation's deadline came); leases are 30 s and nobody crashed, so no takeover
    counts = collections.Counter(seq for seqs in claims for seq in seqs)
    given_back = collections.Counter(released)
    assert len(counts) == N and all(n == 1 + given_back[seq] for seq, n in counts.items())
    # The stream holds each message exactly once
    entries = redis_client.xrange(stream)
    published = collections.Counter(f["id"] for _, f in entries)
    assert len(entries) == N and set(published) == {str(i) for i in ids}
    # And every row says delivered once, with its own entry id
    with app_engine.connect() as conn:
        rows = conn.execute(text("SELECT status, attempts, delivery_ref FROM outbox_message")).fetchall()
    assert collections.Counter((r.status, r.attempts) for r in rows) == {("delivered", 1): N}
    assert {r.delivery_ref for r in rows} == {e for e, _ in entries}


def test_eight_threads_deliver_each_message_once(enqueue, relay_engine, servers, redis_client, redis_prefix,
                                                 app_engine, invoke):
    ids = enqueue(N, stream="conc")
    claims: list[list[int]] = []
    released: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer() -> None:
        try:
            store = LeaseStore(relay_engine, _channel(), default_max_attempts=5)
            client = redis_lib.Redis.from_url(servers.redis_url)
            publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=3600)
            policy = RelayPolicy(batch_size=37, lease_seconds=30, backoff=Backoff())
            original = store.claim

            def claim(*args, **kwargs):
                got = original(*args, **kwargs)
                with lock:
                    claims.append([m.seq for m in got.messages])
                return got

            record = store.record

            def recorded(owner, outcomes):
                with lock:
                    released.extend(o.seq for o in outcomes if o.kind is OutcomeKind.RELEASE)
                return record(owner, outcomes)

            store.claim = claim
            store.record = recorded
            while invoke(store, publisher, policy, lease_token("t")).claimed:
                pass
            client.close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert sum(1 for c in claims if c) > 8  # the work really was shared out
    assert_exactly_once(ids, claims, redis_client, redis_prefix + "conc", app_engine, released)


@pytest.mark.slow
def test_eight_processes_deliver_each_message_once(enqueue, database_url, servers, redis_client, redis_prefix,
                                                   app_engine):
    ids = enqueue(N, stream="procs")
    procs = [subprocess.Popen([sys.executable, str(CLAIMER), database_url, servers.redis_url, "--batch", "41"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    claims, busy = [], 0
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        claims += [line["seqs"] for line in lines]
        busy += any(line["seqs"] for line in lines)
    assert busy >= 4  # several processes really claimed work
    assert_exactly_once(ids, claims, redis_client, redis_prefix + "procs", app_engine)


def _channel():
    from outbox_relay.publishers.registry import Channel

    return Channel.REDIS


@pytest.mark.slow  # a few seconds of overlapping invocations
def test_latency_invocations_handing_over_deliver_each_message_once(enqueue, relay_engine, servers, redis_client,
                                                                    redis_prefix, app_engine):
    from outbox_relay.loop import RelayLoop
    from outbox_relay.models import Mode
    from outbox_relay.publishers.registry import Channel
    from support.deadline import until, wait_for

    # Given an application committing a message every 10 ms
    stop = threading.Event()
    ids: list = []

    def application() -> None:
        while not stop.is_set():
            ids.extend(enqueue(1, stream="handover"))
            stop.wait(0.01)

    # When latency-mode invocations start one after another, each ending (within a second)
    # once the next has delivered, so each overlaps the next
    summaries: dict[int, object] = {}
    windows: dict[int, tuple[float, float]] = {}
    delivering = [threading.Event() for _ in range(4)]
    ends = [threading.Event() for _ in range(4)]

    def invocation(i: int) -> None:
        client = redis_lib.Redis.from_url(servers.redis_url)
        store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=5)
        policy = RelayPolicy(batch_size=50, lease_seconds=30, backoff=Backoff(), mode=Mode.LATENCY,
                             poll_interval_seconds=0.02, poll_max_interval_seconds=0.05)
        started = time.monotonic()
        summaries[i] = RelayLoop(store, RedisStreamsPublisher(client, dedupe_ttl_seconds=3600), policy,
                                 until(ends[i]), lease_token(f"handover-{i}"),
                                 on_progress=lambda s: s.delivered and delivering[i].set()).run()
        windows[i] = (started, time.monotonic())
        client.close()

    stream = redis_prefix + "handover"
    writer = threading.Thread(target=application)
    writer.start()
    runs = []
    try:
        for i in range(4):
            runs.append(threading.Thread(target=invocation, args=(i,)))
            runs[-1].start()
            wait_for(delivering[i].is_set, what=f"invocation {i} delivering")
            if i:
                ends[i - 1].set()
        # (the last runs on until the application has made more than 40 and all are delivered)
        wait_for(lambda: len(ids) > 40, what="the application's messages")
        stop.set()
        writer.join()
        wait_for(lambda: redis_client.xlen(stream) >= len(ids), what="every message delivered")
    finally:
        stop.set()
        for end in ends:
            end.set()
        for t in runs:
            t.join(30)

    # Then the invocations did overlap, each delivered its share, and every message is
    # in the stream exactly once, delivered on its first attempt
    assert all(windows[i][1] > windows[i + 1][0] for i in range(3))
    assert all(summaries[i].delivered > 0 for i in range(4))
    entries = redis_client.xrange(stream)
    assert sorted(f["id"] for _, f in entries) == sorted(str(i) for i in ids)
    with app_engine.connect() as conn:
        rows = conn.execute(text("SELECT status, attempts, EXTRACT(EPOCH FROM delivered_at - created_at) "
                                 "FROM outbox_message")).fetchall()
    assert {(r[0], r[1]) for r in rows} == {("delivered", 1)}
    assert sum(s.delivered for s in summaries.values()) == len(ids)
