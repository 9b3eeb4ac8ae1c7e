"""The SQS, SNS and EventBridge relays end to end through the real handler, on moto in
server mode (reached over HTTP, as AWS is): messages written with the producer API and
with the `outbox enqueue-*` commands, one scheduled invocation, then the rows in
PostgreSQL and what the queue, the topic's subscriber and the bus's rule target received."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from outbox_relay.producer import enqueue_eventbridge, enqueue_sns, enqueue_sqs
from outbox_tools.cli import main
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from support.aws_harness import aws_client, aws_endpoint, moto_server, unique  # noqa: F401 (fixtures)

SES_EVENT = json.loads((project_root() / "events" / "relay-ses-scheduler.json").read_text())


def scheduled(channel: str) -> dict:
    return {**SES_EVENT, "channel": channel}


def rows(app_engine) -> list:
    with app_engine.connect() as conn:
        return conn.execute(text("SELECT message_id::text AS id, status, attempts, delivery_ref FROM outbox_message "
                                 "ORDER BY seq")).all()


def drain(client, url: str) -> list[dict]:
    got = []
    while messages := client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                                             WaitTimeSeconds=0).get("Messages", []):
        got += messages
        client.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                                           for i, m in enumerate(messages)])
    return got


def attrs(m: dict) -> dict[str, str]:
    return {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()}


@pytest.fixture
def relay(relay_env, aws_endpoint, monkeypatch):  # noqa: F811 (fixture)
    def _relay(channel: str, **env: str):
        monkeypatch.setenv("OUTBOX_CHANNEL", channel)
        monkeypatch.setenv("OUTBOX_BATCH_SIZE", "25")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        return load_handler("relay")

    return _relay


def queue(endpoint: str, fifo: bool = False) -> tuple[str, str]:
    sqs = aws_client("sqs", endpoint)
    url = sqs.create_queue(QueueName=unique("e2e") + (".fifo" if fifo else ""),
                           Attributes={"FifoQueue": "true"} if fifo else {})["QueueUrl"]
    return url, sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_the_sqs_relay_sends_each_message_once_with_its_attributes(fifo, relay, app_engine, aws_endpoint,  # noqa: F811
                                                                   database_url):
    # Given a queue, 30 messages of three keys written in a transaction, and one from the command line
    url, _ = queue(aws_endpoint, fifo)
    with app_engine.begin() as conn:
        ids = [str(enqueue_sqs(conn, type="order.placed", payload={"n": i}, key=f"order-{i % 3}",
                               headers={"tenant": "t1"})) for i in range(30)]
    out = CliRunner().invoke(main, ["enqueue-sqs", "--type", "order.note", "--payload", '{"text": "안녕"}',
                                    "--header", "tenant=t2"], env={"DATABASE_URL": database_url})
    assert out.exit_code == 0, out.output
    ids.append(out.output.strip())
    handler = relay("sqs", OUTBOX_SQS_QUEUE_URL=url, OUTBOX_MODE="drain")
    # When one scheduled invocation runs
    summary = handler(scheduled("sqs"), LocalContext(60))
    # Then every row is delivered once, with the SQS message id as its delivery ref
    assert summary["delivered"] == 31
    assert {(r.status, r.attempts) for r in rows(app_engine)} == {("delivered", 1)}
    assert all(r.delivery_ref.startswith("sqs:") for r in rows(app_engine))
    # And the queue holds each once: the body is the payload, the id, type, key and headers attributes,
    # and each key's messages are in their order
    got = drain(aws_client("sqs", aws_endpoint), url)
    assert sorted(attrs(m)["outbox-message-id"] for m in got) == sorted(ids)
    first = next(m for m in got if attrs(m)["outbox-message-id"] == ids[0])
    assert json.loads(first["Body"]) == {"n": 0}
    assert attrs(first) == {"outbox-message-id": ids[0], "outbox-type": "order.placed", "outbox-key": "order-0",
                            "tenant": "t1"}
    for k in range(3):
        assert [json.loads(m["Body"])["n"] for m in got if attrs(m).get("outbox-key") == f"order-{k}"] == \
            list(range(k, 30, 3))


def test_the_sns_relay_publishes_to_a_fifo_topic_in_key_order(relay, app_engine, aws_endpoint):  # noqa: F811
    # Given a FIFO topic with a FIFO queue subscribed, and 20 messages of two keys
    sns = aws_client("sns", aws_endpoint)
    topic = sns.create_topic(Name=unique("e2e") + ".fifo", Attributes={"FifoTopic": "true"})["TopicArn"]
    url, arn = queue(aws_endpoint, fifo=True)
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    with app_engine.begin() as conn:
        ids = [str(enqueue_sns(conn, type="stock.changed", payload={"n": i}, key=f"sku-{i % 2}")) for i in range(20)]
    # When one invocation runs
    summary = relay("sns", OUTBOX_SNS_TOPIC_ARN=topic)(scheduled("sns"), LocalContext(60))
    # Then all went, once each, each key in its order
    assert summary["delivered"] == 20
    got = drain(aws_client("sqs", aws_endpoint), url)
    assert sorted(attrs(m)["outbox-message-id"] for m in got) == sorted(ids)
    for k in range(2):
        assert [json.loads(m["Body"])["n"] for m in got if attrs(m)["outbox-key"] == f"sku-{k}"] == \
            list(range(k, 20, 2))


def test_the_eventbridge_relay_puts_events_with_the_message_id_in_the_detail(
        relay, app_engine, aws_endpoint, database_url):  # noqa: F811 (fixture)
    # Given a bus whose rule sends its events to a queue, and events with and without their own source
    events = aws_client("events", aws_endpoint)
    bus = unique("e2e")
    events.create_event_bus(Name=bus)
    url, arn = queue(aws_endpoint)
    events.put_rule(Name="all", EventBusName=bus, EventPattern=json.dumps({"detail-type": ["order.placed"]}))
    events.put_targets(Rule="all", EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
    with app_engine.begin() as conn:
        own = str(enqueue_eventbridge(conn, type="order.placed", payload={"order": 1}, source="shop.orders"))
        default = str(enqueue_eventbridge(conn, type="order.placed", payload={"order": 2}))
    out = CliRunner().invoke(main, ["enqueue-eventbridge", "--type", "order.placed", "--payload", '{"order": 3}',
                                    "--source", "shop.cli"], env={"DATABASE_URL": database_url})
    assert out.exit_code == 0, out.output
    # When one invocation runs
    summary = relay("eventbridge", OUTBOX_EVENTBRIDGE_BUS=bus, OUTBOX_EVENTBRIDGE_SOURCE="shop.default")(
        scheduled("eventbridge"), LocalContext(60))
    # Then each event reached the rule's target once, its detail the payload plus the message id
    assert summary["delivered"] == 3
    got = {json.loads(m["Body"])["detail"]["outbox-message-id"]: json.loads(m["Body"])
           for m in drain(aws_client("sqs", aws_endpoint), url)}
    assert set(got) == {own, default, out.output.strip()}
    assert got[own]["detail"] == {"outbox-message-id": own, "order": 1}
    assert (got[own]["source"], got[default]["source"]) == ("shop.orders", "shop.default")
    assert got[own]["detail-type"] == "order.placed"
    assert {r.status for r in rows(app_engine)} == {"delivered"}


def test_an_sqs_relay_whose_queue_is_gone_claims_nothing(relay, app_engine, aws_endpoint):  # noqa: F811
    # Given messages, and a queue URL naming no queue
    with app_engine.begin() as conn:
        enqueue_sqs(conn, type="t", payload=1)
    missing = queue(aws_endpoint)[0].rsplit("/", 1)[0] + "/" + unique("missing")
    # When an invocation runs: the gate closes, and nothing is claimed or spent
    summary = relay("sqs", OUTBOX_SQS_QUEUE_URL=missing)(scheduled("sqs"), LocalContext(60))
    assert summary["claimed"] == 0 and summary["gate_closed"]
    assert [(r.status, r.attempts) for r in rows(app_engine)] == [("pending", 0)]
