"""AWS's per-call limits, kept by the publisher itself: moto takes a SendMessageBatch of
any size, SQS does not (10 entries, 256 KiB in all per call: "Amazon SQS quotas")."""

from __future__ import annotations

import pytest

from outbox_relay.config import load_settings
from outbox_relay.loop import RelayLoop
from outbox_relay.producer import enqueue_sqs
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.registry import Channel, spec_for
from outbox_relay.store import LeaseStore
from support.aws_harness import aws_client, aws_endpoint, moto_server, unique  # noqa: F401 (fixtures)
from support.channel_harnesses import POLICY


@pytest.mark.parametrize(("n", "payload_bytes", "most_per_call"), [(25, 10, 10), (9, 100 * 1024, 2)])
def test_each_call_carries_at_most_ten_entries_and_256_kib(n, payload_bytes, most_per_call, app_engine,
                                                          relay_engine, database_url, aws_endpoint):  # noqa: F811
    # Given a queue and n messages whose payloads are about payload_bytes each
    sqs = aws_client("sqs", aws_endpoint)
    url = sqs.create_queue(QueueName=unique("limits"))["QueueUrl"]
    with app_engine.begin() as conn:
        for i in range(n):
            enqueue_sqs(conn, type="t", payload="x" * payload_bytes, key=None)
    publisher = spec_for(Channel.SQS).build_publisher(
        load_settings(channel="sqs", database_url=database_url, sqs_queue_url=url))
    calls: list[list[dict]] = []
    publisher.client.meta.events.register("provide-client-params.sqs.SendMessageBatch",
                                          lambda params, **_: calls.append(list(params["Entries"])))
    # When one invocation delivers them in one claim
    store = LeaseStore(relay_engine, Channel.SQS, default_max_attempts=3, error_max_chars=300)
    summary = RelayLoop(store, publisher, POLICY,
                             Deadline(lambda: 60_000, 5), "owner").run()
    # Then all went, in calls within SQS's limits, as full as those allow
    assert summary.delivered == n
    assert sum(len(c) for c in calls) == n
    assert max(len(c) for c in calls) == most_per_call
    for c in calls:
        assert len(c) <= 10
        assert sum(len(e["MessageBody"].encode()) for e in c) <= 256 * 1024
