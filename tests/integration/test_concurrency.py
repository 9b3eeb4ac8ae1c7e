"""Many claimers at once: every message delivered exactly once, none claimed twice while leased."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
from pathlib import Path

import redis as redis_lib
from sqlalchemy import text

from outbox_relay.backoff import Backoff
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.redis_streams import RedisStreamsPublisher
from outbox_relay.relay import RelayPolicy, run_batch
from outbox_relay.store import LeaseStore, lease_token

N = 5000
CLAIMER = Path(__file__).with_name("claimer.py")


def assert_exactly_once(ids, claims, redis_client, stream, app_engine):
    # No message was in two claims (leases are 30 s, nobody crashed, so no takeover)
    counts = collections.Counter(seq for seqs in claims for seq in seqs)
    assert len(counts) == N and max(counts.values()) == 1
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
                                                 app_engine):
    ids = enqueue(N, stream="conc")
    claims: list[list[int]] = []
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
                    claims.append([m.seq for m in got])
                return got

            store.claim = claim
            while run_batch(store, publisher, policy, Deadline(lambda: 600_000, 1), lease_token("t")).claimed:
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
    assert_exactly_once(ids, claims, redis_client, redis_prefix + "conc", app_engine)


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
    from outbox_relay.models import Channel

    return Channel.REDIS
