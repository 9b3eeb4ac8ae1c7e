"""The Kinesis relay against moto's server and the real PostgreSQL: what the stream
recorded (read back with GetRecords), per shard and per key; per-key order across a
partial failure; calls within PutRecords' limits (moto refuses a call over them too)."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import text

from outbox_relay.config import load_settings
from outbox_relay.loop import RelayLoop
from outbox_relay.producer import enqueue_kinesis
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.registry import Channel, spec_for
from outbox_relay.store import LeaseStore
from support.aws_harness import (  # noqa: F401 (fixtures)
    Faults,
    StreamReader,
    aws_client,
    aws_endpoint,
    kinesis_record_type,
    moto_server,
    unique,
)
from support.channel_harnesses import POLICY


@pytest.fixture
def stream(aws_endpoint):  # noqa: F811
    """A stream of four shards of this test's own, and its reader."""
    client = aws_client("kinesis", aws_endpoint)
    name = unique("kinesis")
    client.create_stream(StreamName=name, ShardCount=4)
    client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    return name, StreamReader(client, name)


def relay(relay_engine, database_url, stream_name, faults: Faults | None = None, calls: list | None = None,
          batch_size: int = POLICY.batch_size):
    """One invocation of the Kinesis relay, built as runtime builds it; its summary. One call at a
    time: moto numbers a shard's records unlocked, so concurrent puts to one shard can overwrite."""
    publisher = spec_for(Channel.KINESIS).build_publisher(
        load_settings(channel="kinesis", database_url=database_url, kinesis_stream=stream_name,
                      kinesis_max_concurrency=1))
    if faults is not None:
        faults.install(publisher.client)
    if calls is not None:
        publisher.client.meta.events.register("provide-client-params.kinesis.PutRecords",
                                              lambda params, **_: calls.append(list(params["Records"])))
    store = LeaseStore(relay_engine, Channel.KINESIS, default_max_attempts=3, error_max_chars=300)
    policy = dataclasses.replace(POLICY, batch_size=batch_size)
    return RelayLoop(store, publisher, policy, Deadline(lambda: 60_000, 5), "owner").run()


def rows(app_engine) -> dict[str, dict]:
    with app_engine.connect() as conn:
        return {r.message_id: dict(r._mapping) for r in conn.execute(text(
            "SELECT message_id::text AS message_id, key, status, last_error_class, delivery_ref "
            "FROM outbox_message ORDER BY seq"))}


def test_records_land_keyed_by_the_ordering_key_in_order_per_shard(stream, app_engine, relay_engine,
                                                                    database_url):
    # Given five keys' messages interleaved, and keyless ones
    name, reader = stream
    with app_engine.begin() as conn:
        ids = [str(enqueue_kinesis(conn, type="order.placed", payload={"n": i}, key=f"customer-{i % 5}",
                                   headers={"tenant": "eu"})) for i in range(20)]
        keyless = [str(enqueue_kinesis(conn, type="order.viewed", payload={"n": i})) for i in range(6)]
    # When one invocation relays them
    summary = relay(relay_engine, database_url, name)
    # Then the stream holds each once, with the envelope the consumer reads
    assert summary.delivered == 26
    got = reader.records()
    assert sorted(r["id"] for r in got) == sorted(ids + keyless)
    by_id = {r["id"]: r for r in got}
    assert by_id[ids[7]]["payload"] == {"n": 7} and by_id[ids[7]]["headers"] == {"tenant": "eu"}
    assert by_id[ids[7]]["type"] == "order.placed" and by_id[ids[7]]["key"] == "customer-2"
    # a key's records share a shard (their partition key is the key), in enqueue order
    for k in range(5):
        mine = [r for r in got if r.get("key") == f"customer-{k}"]
        assert {r["_partition"] for r in mine} == {f"customer-{k}"} and len({r["_shard"] for r in mine}) == 1
        assert [r["payload"]["n"] for r in mine] == list(range(k, 20, 5))
    # a keyless record's partition key is its message id
    assert all(by_id[i]["_partition"] == i and "key" not in by_id[i] for i in keyless)
    # and each row says where its record landed
    stored = rows(app_engine)
    assert {r["status"] for r in stored.values()} == {"delivered"}
    assert stored[ids[0]]["delivery_ref"].startswith(f"kinesis:{by_id[ids[0]]['_shard']}:")


def test_a_throttled_record_holds_its_key_back_and_the_key_keeps_its_order(stream, app_engine, relay_engine,
                                                                           database_url):
    # Given key a's first record will be refused by its shard, and key b beside it
    name, reader = stream
    with app_engine.begin() as conn:
        a = [str(enqueue_kinesis(conn, type="throttled" if i == 0 else "ok", payload={"a": i}, key="a"))
             for i in range(3)]
        b = [str(enqueue_kinesis(conn, type="ok", payload={"b": i}, key="b")) for i in range(3)]
    faults = Faults("kinesis", "PutRecords", "Records", True, kinesis_record_type,
                    reply=("Records", "FailedRecordCount"))
    faults.answers["throttled"] = ("ProvisionedThroughputExceededException", False)
    # When one invocation runs
    relay(relay_engine, database_url, name, faults)
    # Then b went in order, a's first was throttled and its later records were not put
    assert reader.read() == b
    stored = rows(app_engine)
    assert stored[a[0]]["last_error_class"] == "throttled"
    assert [stored[m]["status"] for m in a] == ["pending"] * 3
    # When the shard takes records again and the key is due
    faults.answers.clear()
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET available_at = now() WHERE status = 'pending'"))
    relay(relay_engine, database_url, name, faults)
    # Then a's records follow in enqueue order
    assert reader.read() == b + a


def test_calls_carry_at_most_500_records_and_5_mib(stream, app_engine, relay_engine, database_url):
    # Given 1,010 small records and 12 of about 900 KiB
    name, reader = stream
    with app_engine.begin() as conn:
        for i in range(1010):
            enqueue_kinesis(conn, type="small", payload={"n": i})
        for i in range(12):
            enqueue_kinesis(conn, type="large", payload="x" * (900 * 1024))
    calls: list[list[dict]] = []
    # When the relay drains them, claiming a thousand at a time
    total = 0
    for _ in range(20):
        total += relay(relay_engine, database_url, name, calls=calls, batch_size=1000).delivered
        if total == 1022:
            break
    # Then every call kept within PutRecords' limits, and the stream holds them all
    assert total == 1022 and len(reader.read()) == 1022
    assert max(len(c) for c in calls) == 500
    sizes = [sum(len(r["Data"]) + len(r["PartitionKey"].encode()) for r in c) for c in calls]
    assert 4 * 1024 * 1024 < max(sizes) <= 5 * 1024 * 1024
