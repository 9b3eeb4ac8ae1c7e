"""Cluster mode (OUTBOX_REDIS_CLUSTER=true) on a Redis Cluster of the test's own: three
primaries with a replica each on free loopback ports (docs/channels.md, "Cluster mode").

Streams spread over every slot; a failover (CLUSTER FAILOVER on a replica, and a killed
primary) and a slot migration in the middle of a drain; a consumer group lagging behind
a bounded stream. Afterwards every message recorded delivered is in its stream, and no
message id is there twice. Each test starts its own cluster (they change its topology)
and stops its nodes by pid.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter

import pytest
from sqlalchemy import text

from outbox_relay.loop import RelayLoop
from outbox_relay.models import Mode
from outbox_relay.producer import enqueue_events_bulk
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.redis.client import create_redis_client
from outbox_relay.publishers.redis.settings import RedisTrim
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from support.redis_nodes import OwnCluster

pytestmark = pytest.mark.slow

FAR = Deadline(lambda: 600_000, 1)


@pytest.fixture
def cluster(tmp_path):
    own = OwnCluster(tmp_path).start()
    yield own
    own.stop()


@pytest.fixture
def drain(policy):
    return dataclasses.replace(policy, batch_size=1000, mode=Mode.DRAIN)


def _publisher(cluster: OwnCluster, **kwargs) -> RedisStreamsPublisher:
    return RedisStreamsPublisher(create_redis_client(cluster.url, cluster=True, socket_timeout_seconds=5),
                                 dedupe_ttl_seconds=3600, **kwargs)


def _enqueue(app_engine, prefix: str, streams: int, per_stream: int) -> list[str]:
    names = [f"{prefix}s{i}" for i in range(streams)]
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=name, type="thing.happened", payload={"n": n})
                                   for n in range(per_stream) for name in names])
    return names


def _delivered(app_engine) -> int:
    with app_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM outbox_message WHERE status = 'delivered'")).scalar_one()


def _drain_until_done(store, publisher, policy, rows, seconds: float = 60) -> None:
    """Drain until every row is delivered: after a failover the gate stays closed (or
    batches are released) until the cluster serves every slot again."""
    give_up = time.monotonic() + seconds
    while True:
        summary = RelayLoop(store, publisher, policy, FAR, "after").run()
        if {r["status"] for r in rows()} == {"delivered"}:
            return
        assert time.monotonic() < give_up, (Counter(r["status"] for r in rows()), summary.skipped, summary.stopped)
        time.sleep(0.1)


def _assert_every_delivered_is_there_once(cluster: OwnCluster, rows, streams: list[str]) -> None:
    client = cluster.client()
    final = rows()
    assert {r["status"] for r in final} == {"delivered"}
    seen: Counter = Counter()
    entries = set()
    for stream in streams:
        for entry_id, fields in client.xrange(stream):
            seen[fields[b"id"].decode()] += 1
            entries.add((stream, entry_id.decode()))
    assert seen == Counter({str(r["message_id"]): 1 for r in final})  # none missing, none twice
    assert {(r["destination"], r["delivery_ref"]) for r in final} == entries
    client.close()


def _start_drain(store, publisher, policy) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """A drain in a thread; `done` when it ended. Until `fault` is set (the test is about
    to inject one), a drain that ended early (the machine's load cut its batches) is
    followed by another, so that one is running when the fault comes."""
    done, fault = threading.Event(), threading.Event()

    def run() -> None:
        try:
            while True:
                summary = RelayLoop(store, publisher, policy, FAR, "during").run()
                if fault.is_set() or summary.claimed == 0:
                    return
        finally:
            done.set()

    worker = threading.Thread(target=run)
    worker.start()
    return worker, done, fault


def _wait_until_primary(cluster: OwnCluster, node, seconds: float = 30) -> None:
    give_up = time.monotonic() + seconds
    while cluster.role_of(node) != "master":
        assert time.monotonic() < give_up, "the replica did not become a primary"
        time.sleep(0.01)


def _wait_for_deliveries(app_engine, done: threading.Event, at_least: int, fault: threading.Event) -> None:
    give_up = time.monotonic() + 60
    while _delivered(app_engine) < at_least:
        assert not done.is_set(), "the drain ended before the fault"
        assert time.monotonic() < give_up
        time.sleep(0.005)
    fault.set()


def test_a_cluster_unreachable_at_cold_start_closes_the_gate_until_it_answers(tmp_path, app_engine, store, drain,
                                                                            rows, redis_prefix):
    # Given a client made while no node of the cluster listens yet
    own = OwnCluster(tmp_path)
    url = own.url
    publisher = RedisStreamsPublisher(create_redis_client(url, cluster=True, socket_timeout_seconds=1),
                                      dedupe_ttl_seconds=3600)
    streams = _enqueue(app_engine, redis_prefix, 3, 10)
    try:
        # When an invocation runs: the gate closes, as for one node, and nothing is claimed
        summary = RelayLoop(store, publisher, drain, FAR, "cold").run()
        # (which exception redis-py raises depends on how far its first contact got)
        assert summary.claimed == 0 and summary.skipped in ("redis unavailable (RedisClusterException)",
                                                            "redis unavailable (RedisClusterUnreachableError)")
        assert {r["status"] for r in rows()} == {"pending"} and all(r["attempts"] == 0 for r in rows())
        # And once the cluster answers on that node, the next invocation delivers
        own.start()
        if own.url != url:
            pytest.skip("the node's port was taken before it started (it moved to another)")
        summary = RelayLoop(store, publisher, drain, FAR, "warm").run()
        assert summary.delivered == 30
        _assert_every_delivered_is_there_once(own, rows, streams)
    finally:
        own.stop()


def test_a_drain_over_100_streams_reaches_every_primary(cluster, app_engine, store, drain, rows, redis_prefix):
    streams = _enqueue(app_engine, redis_prefix, 100, 20)
    publisher = _publisher(cluster)
    summary = RelayLoop(store, publisher, drain, FAR, "a").run()
    assert summary.delivered == 2000 and summary.batches == 2
    client = cluster.client()
    serving = {cluster.node_of_slot(client.keyslot(s)).port for s in streams}
    assert len(serving) == 3
    _assert_every_delivered_is_there_once(cluster, rows, streams)


def test_a_graceful_failover_mid_drain_loses_and_duplicates_nothing(cluster, app_engine, store, drain, rows,
                                                                    redis_prefix):
    streams = _enqueue(app_engine, redis_prefix, 100, 200)
    publisher = _publisher(cluster, wait_replicas=1, wait_timeout_ms=1000)
    worker, done, fault = _start_drain(store, publisher, dataclasses.replace(drain, batch_size=1000))
    _wait_for_deliveries(app_engine, done, 2000, fault)
    # CLUSTER FAILOVER on a replica: it takes over its primary's slots, the old primary follows it
    victim = cluster.primary_nodes()[0]
    heir = cluster.replica_of(victim)
    heir.client().execute_command("CLUSTER", "FAILOVER")
    _wait_until_primary(cluster, heir)
    assert not done.is_set(), "the drain ended before the failover did"
    worker.join(timeout=120)
    cluster.wait_ok()
    _drain_until_done(store, publisher, drain, rows)
    _assert_every_delivered_is_there_once(cluster, rows, streams)


def test_a_killed_primary_mid_drain_loses_nothing_recorded_delivered_with_wait(cluster, app_engine, store, drain,
                                                                               rows, redis_prefix):
    streams = _enqueue(app_engine, redis_prefix, 100, 200)
    publisher = _publisher(cluster, wait_replicas=1, wait_timeout_ms=1000)
    worker, done, fault = _start_drain(store, publisher, dataclasses.replace(drain, batch_size=1000))
    _wait_for_deliveries(app_engine, done, 2000, fault)
    # SIGKILL a primary: its replica is promoted once the others notice (cluster-node-timeout)
    victim = cluster.primary_nodes()[0]
    heir = cluster.replica_of(victim)
    victim.kill()
    worker.join(timeout=120)
    before = _delivered(app_engine)
    assert 2000 <= before < 20_000
    _wait_until_primary(cluster, heir)
    # The lost node comes back empty (as a replaced node would) and joins as the new primary's
    # replica: until then the new primary has no replica, and WAIT 1 keeps its gate closed
    victim.start()
    cluster.wait_ok()
    _drain_until_done(store, publisher, drain, rows)
    _assert_every_delivered_is_there_once(cluster, rows, streams)


def _migrate(cluster: OwnCluster, slot: int) -> None:
    """Move `slot` to another primary the way redis-cli --cluster reshard does:
    IMPORTING / MIGRATING, MIGRATE its keys, then SETSLOT NODE on every primary."""
    source = cluster.node_of_slot(slot)
    target = next(n for n in cluster.primary_nodes() if n.port != source.port)
    src, dst = source.client(decode_responses=True), target.client(decode_responses=True)
    src_id, dst_id = cluster.node_id(source), cluster.node_id(target)
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        time.sleep(0.01)  # let the relay publish while the slot is half moved
    for node in cluster.primary_nodes():
        node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


def test_a_slot_migration_mid_drain_loses_and_duplicates_nothing(cluster, app_engine, store, drain, rows,
                                                                  redis_prefix):
    hot = f"{{{redis_prefix}hot}}"
    names = [hot + f".s{i}" for i in range(5)]  # one hash slot, the one that moves
    others = _enqueue(app_engine, redis_prefix, 20, 50)
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=name, type="thing.happened", payload={"n": n})
                                   for n in range(400) for name in names])
    publisher = _publisher(cluster)
    worker, done, fault = _start_drain(store, publisher, dataclasses.replace(drain, batch_size=100))
    _wait_for_deliveries(app_engine, done, 300, fault)
    _migrate(cluster, cluster.client().keyslot(hot))
    worker.join(timeout=120)
    _drain_until_done(store, publisher, drain, rows)
    _assert_every_delivered_is_there_once(cluster, rows, names + others)


def test_a_lagging_group_holds_a_bounded_stream_in_a_cluster(cluster, app_engine, store, policy, rows,
                                                             redis_prefix):
    stream = f"{redis_prefix}bounded"
    client = cluster.client()
    client.xgroup_create(stream, "g", id="0", mkstream=True)
    publisher = _publisher(cluster, maxlen=10, trim=RedisTrim.ACKNOWLEDGED)
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=stream, type="t", payload={"n": n}) for n in range(15)])
    summary = RelayLoop(store, publisher, dataclasses.replace(policy, throttle_delay_seconds=0), FAR, "a").run()
    # The group has read nothing: the stream stops at its bound, the rest is held, none is lost
    assert summary.delivered == 10 and summary.throttled == 5 and client.xlen(stream) == 10
    assert sorted(r["status"] for r in rows()) == ["delivered"] * 10 + ["pending"] * 5


def test_a_batch_costs_one_round_trip_per_node_whatever_its_size(cluster, app_engine, store, policy, rows,
                                                                  redis_prefix):
    from bench.counting import RoundTripCounter

    client = create_redis_client(cluster.url, cluster=True)
    trips = RoundTripCounter(client)
    publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=3600)
    streams = _enqueue(app_engine, redis_prefix, 100, 11)  # 1,100: a batch of 100, then one of 1,000
    RelayLoop(store, publisher, dataclasses.replace(policy, batch_size=1), FAR, "warm").run()  # connect, load the script
    trips.take()
    per_batch = []
    for size in (100, 1000):
        summary = RelayLoop(store, publisher, dataclasses.replace(policy, batch_size=size), FAR, f"b{size}").run()
        assert summary.delivered == min(size, 1100 - 1 - 100 * (size == 1000))
        per_batch.append(trips.take())
    # the gate's INFO on each of the 3 primaries, then one pipeline per node the batch touched
    assert per_batch == [6, 6]
    _assert_every_delivered_is_there_once(cluster, rows, streams)


def test_with_wait_only_the_calls_on_a_node_whose_replica_lags_are_released(cluster, app_engine, store, policy,
                                                                            rows, redis_prefix):
    streams = _enqueue(app_engine, redis_prefix, 30, 5)
    client = cluster.client()
    lagging = cluster.primary_nodes()[0]
    on_lagging = {s for s in streams if cluster.node_of_slot(client.keyslot(s)).port == lagging.port}
    assert 0 < len(on_lagging) < 30
    # The paused replica never acknowledges, however long WAIT waits; the healthy ones need
    # the room on a loaded machine, where 300 ms released their calls too.
    publisher = _publisher(cluster, wait_replicas=1, wait_timeout_ms=3000)
    # Given the replica of one primary that stops answering
    replica = cluster.replica_of(lagging)
    replica.pause()
    try:
        summary = RelayLoop(store, publisher, dataclasses.replace(policy, batch_size=1000), FAR, "a").run()
    finally:
        replica.resume()
    # Then what the other nodes' replicas acknowledged is recorded delivered, and only
    # the lagging node's messages are released with attempts refunded
    by_stream = Counter(r["destination"] for r in rows() if r["status"] == "delivered")
    assert set(by_stream) == set(streams) - on_lagging and summary.delivered == 5 * (30 - len(on_lagging))
    released = [r for r in rows() if r["status"] != "delivered"]
    assert {r["destination"] for r in released} == on_lagging
    assert {(r["status"], r["attempts"]) for r in released} == {("pending", 0)}
    # And once the replica answers, the rest goes out, each message once
    _drain_until_done(store, publisher, dataclasses.replace(policy, batch_size=1000, mode=Mode.DRAIN), rows)
    _assert_every_delivered_is_there_once(cluster, rows, streams)
