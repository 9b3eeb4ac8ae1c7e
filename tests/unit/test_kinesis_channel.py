"""The Kinesis channel without a network: its settings, the producer API's checks and
the `outbox enqueue-kinesis` command (one line naming what is wrong, nothing written),
what a record becomes, the 500-record / 5 MiB / 1 MiB limits, each record's ErrorCode
and the whole call's codes classified, and per-key order across a partial failure."""

from __future__ import annotations

import json
import uuid

import pytest
from botocore.exceptions import ClientError
from test_aws_batch_publishers import Clock, deliver, message
from test_aws_cli import REQUIRED, _runner, engine  # noqa: F401 (fixture)
from test_aws_settings import env  # noqa: F401 (fixture)

from outbox_relay.config import load_settings
from outbox_relay.errors import ConfigurationError, InvalidMessageError, StopBatch
from outbox_relay.models import ErrorClass
from outbox_relay.publishers.kinesis.message import message_row
from outbox_relay.publishers.kinesis.publisher import KinesisPublisher
from outbox_relay.publishers.kinesis.records import MAX_RECORD_BYTES, partition_key
from outbox_tools.cli import main

STREAM = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"


class StubKinesis:
    """A boto3-like Kinesis client: `answer(records)` returns per position None (put) or an
    ErrorCode, or raises for the whole call. Records every call's records."""

    def __init__(self, answer=None):
        self.answer = answer or (lambda records: [None] * len(records))
        self.calls: list[list[dict]] = []
        self.streams: list[dict] = []

    def put_records(self, Records, **stream):  # noqa: N803 (boto3's names)
        self.calls.append(list(Records))
        self.streams.append(stream)
        codes = self.answer(Records)
        return {"FailedRecordCount": sum(c is not None for c in codes),
                "Records": [{"ShardId": "shardId-000000000000", "SequenceNumber": str(100 + i)} if c is None
                            else {"ErrorCode": c, "ErrorMessage": "no"} for i, c in enumerate(codes)]}

    def describe_stream_summary(self, **stream):
        self.streams.append(stream)


def seqs(call) -> list[int]:
    return [uuid.UUID(json.loads(r["Data"])["id"]).int for r in call]


def whole_call(code: str, status: int = 400):
    def answer(records):
        raise ClientError({"Error": {"Code": code, "Message": "refused", "Type": "Sender"},
                           "ResponseMetadata": {"HTTPStatusCode": status}}, "PutRecords")
    return answer


# -- settings ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("settings", "variable", "fragment"), [
    ({"OUTBOX_CHANNEL": "kinesis"}, "OUTBOX_KINESIS_STREAM", "set the stream's name or ARN"),
    ({"OUTBOX_CHANNEL": "kinesis", "OUTBOX_KINESIS_STREAM": "my stream"}, "OUTBOX_KINESIS_STREAM", "stream name"),
    ({"OUTBOX_CHANNEL": "kinesis", "OUTBOX_KINESIS_STREAM": "s" * 129}, "OUTBOX_KINESIS_STREAM", "stream name"),
    ({"OUTBOX_CHANNEL": "kinesis", "OUTBOX_KINESIS_STREAM": "arn:aws:sqs:eu-west-1:123456789012:orders"},
     "OUTBOX_KINESIS_STREAM", "stream ARN"),
    ({"OUTBOX_CHANNEL": "kinesis", "OUTBOX_KINESIS_STREAM": STREAM, "OUTBOX_KINESIS_MAX_CONCURRENCY": "0"},
     "OUTBOX_KINESIS_MAX_CONCURRENCY", "greater than or equal to 1"),
    ({"OUTBOX_CHANNEL": "kinesis", "OUTBOX_KINESIS_STREAM": STREAM, "OUTBOX_KINESIS_MAX_CONCURRENCY": "many"},
     "OUTBOX_KINESIS_MAX_CONCURRENCY", "valid integer"),
    ({"OUTBOX_CHANNEL": "kinesis", "OUTBOX_KINESIS_STREAM": STREAM, "AWS_ENDPOINT_URL_KINESIS": "moto:5000"},
     "AWS_ENDPOINT_URL_KINESIS", "URL"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_setting_is_one_line_naming_the_variable(env, settings, variable, fragment):  # noqa: F811
    for k, v in settings.items():
        env.setenv(k, v)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    text = str(info.value)
    assert info.value.variable == variable
    assert text.startswith(f"{variable}: ") and fragment in text and "\n" not in text, text


@pytest.mark.parametrize("stream", ["orders", "orders.v2_eu-1", STREAM])
def test_a_stream_is_a_name_or_an_arn(env, stream):  # noqa: F811
    env.setenv("OUTBOX_CHANNEL", "kinesis")
    env.setenv("OUTBOX_KINESIS_STREAM", stream)
    assert load_settings().kinesis_stream == stream


# -- the producer API and the command ------------------------------------------------------------------

def test_a_record_over_1_mib_with_its_partition_key_is_refused_at_enqueue():
    # Given a payload that fits on its own, but not with the envelope and a long key
    fits = MAX_RECORD_BYTES - len(message_row(dict(type="t", payload="", key="k"))["payload"]) - 200
    message_row(dict(type="t", payload="x" * fits))
    with pytest.raises(InvalidMessageError) as info:
        message_row(dict(type="t", payload="x" * fits, key="k" * 256))
    assert info.value.field == "payload" and "Kinesis record" in str(info.value) and "1048576" in str(info.value)


def test_the_row_keeps_key_headers_and_payload_text_for_the_relays_stream():
    row = message_row(dict(type="order.placed", payload={"n": 1}, key="customer-77", headers={"tenant": "eu"}))
    assert (row["channel"], row["destination"], row["key"]) == ("kinesis", "(relay)", "customer-77")
    assert (row["payload"], row["headers"]) == ('{"n":1}', '{"tenant":"eu"}')


@pytest.mark.parametrize(("extra", "says"), [
    (["--payload", "{nope"], "--payload"),
    (["--type", " "], "type:"),
    (["--key", ""], "key:"),
    (["--header", "novalue"], "--header"),
    (["--message-id", "nope"], "message_id:"),
    (["--max-attempts", "0"], "max_attempts:"),
    (["--deliver-at", "2030-01-01T00:00:00"], "deliver_at:"),
    (["--payload", json.dumps("x" * MAX_RECORD_BYTES)], "payload:"),
])
def test_enqueue_kinesis_bad_input_is_one_line_and_nothing_is_written(engine, extra, says):  # noqa: F811
    result = _runner().invoke(main, ["enqueue-kinesis", *REQUIRED, *extra])
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("Usage: ", "Try '"))]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert engine.conn.calls == []


def test_enqueue_kinesis_writes_one_message_and_prints_its_id(engine):  # noqa: F811
    result = _runner().invoke(main, ["enqueue-kinesis", *REQUIRED, "--key", "customer-77", "--header", "t=eu"])
    assert result.exit_code == 0, result.stderr
    (_, row), = engine.conn.calls
    assert str(row["message_id"]) == result.stdout.strip()
    assert (row["channel"], row["key"], row["headers"]) == ("kinesis", "customer-77", '{"t":"eu"}')


# -- what a record becomes -----------------------------------------------------------------------------

def test_a_record_is_an_envelope_of_the_stored_texts_keyed_by_the_ordering_key():
    client = StubKinesis()
    m = message(1, key="customer-77", payload='{"total": 12.50}', headers='{"tenant":"eu"}')
    by_seq, _, raised = deliver(KinesisPublisher(client, stream=STREAM), [m])
    assert raised is None and by_seq[1].delivery_ref == "kinesis:shardId-000000000000:100"
    (record,) = client.calls[0]
    assert record["PartitionKey"] == "customer-77"
    assert record["Data"] == (b'{"id":"%s","type":"order.placed","key":"customer-77","headers":{"tenant":"eu"},'
                              b'"payload":{"total": 12.50}}' % m.message_id.encode())
    assert client.streams == [{"StreamARN": STREAM}]


def test_a_stream_name_is_sent_as_stream_name_and_a_keyless_record_is_keyed_by_its_message_id():
    client = StubKinesis()
    m = message(2)
    deliver(KinesisPublisher(client, stream="orders"), [m])
    assert client.streams == [{"StreamName": "orders"}]
    assert client.calls[0][0]["PartitionKey"] == m.message_id
    assert json.loads(client.calls[0][0]["Data"]) == {"id": m.message_id, "type": "order.placed", "payload": {"n": 1}}


def test_a_key_longer_than_a_partition_key_becomes_its_digest():
    assert partition_key("k" * 256, "id") == "k" * 256
    long = partition_key("k" * 257, "id")
    assert long.startswith("sha256-") and len(long) == 71 and long == partition_key("k" * 257, "other")


def test_a_record_over_1_mib_at_send_time_is_permanent_and_never_sent():
    client = StubKinesis()
    by_seq, _, _ = deliver(KinesisPublisher(client, stream=STREAM),
                           [message(1, payload='"' + "x" * MAX_RECORD_BYTES + '"'), message(2)])
    assert by_seq[1].error_class is ErrorClass.PERMANENT and "1048576" in by_seq[1].error
    assert [seqs(c) for c in client.calls] == [[2]]


# -- limits per call -----------------------------------------------------------------------------------

def test_calls_carry_at_most_500_records():
    client = StubKinesis()
    by_seq, _, _ = deliver(KinesisPublisher(client, stream=STREAM, max_concurrency=1),
                           [message(i) for i in range(1, 1202)])
    assert [len(c) for c in client.calls] == [500, 500, 201]
    assert len(by_seq) == 1201 and all(r.error_class is None for r in by_seq.values())


def test_calls_carry_at_most_5_mib_of_data_and_partition_keys():
    client = StubKinesis()
    payload = '"' + "x" * (900 * 1024) + '"'
    deliver(KinesisPublisher(client, stream=STREAM, max_concurrency=1), [message(i, payload=payload)
                                                                         for i in range(1, 14)])
    sizes = [sum(len(r["Data"]) + len(r["PartitionKey"].encode()) for r in c) for c in client.calls]
    assert [len(c) for c in client.calls] == [5, 5, 3] and max(sizes) <= 5 * 1024 * 1024


# -- outcomes ------------------------------------------------------------------------------------------

def test_each_records_error_code_is_classified_on_its_own():
    codes = {2: "ProvisionedThroughputExceededException", 3: "InternalFailure"}
    client = StubKinesis(lambda records: [codes.get(s) for s in seqs(records)])
    by_seq, _, raised = deliver(KinesisPublisher(client, stream=STREAM), [message(i) for i in (1, 2, 3)])
    assert raised is None
    assert by_seq[1].error_class is None and by_seq[1].delivery_ref
    assert by_seq[2].error_class is ErrorClass.THROTTLED
    assert (by_seq[3].error_class, by_seq[3].error) == (ErrorClass.TRANSIENT, "kinesis: InternalFailure")


def test_a_keys_later_records_wait_for_the_earlier_one_and_are_held_back_when_it_fails():
    # Given key a's three records and key b's two, the first of a throttled by its shard
    client = StubKinesis(lambda records: ["ProvisionedThroughputExceededException" if s == 1 else None
                                          for s in seqs(records)])
    messages = [message(1, key="a"), message(2, key="b"), message(3, key="a"), message(4, key="b"),
                message(5, key="a")]
    by_seq, _, _ = deliver(KinesisPublisher(client, stream=STREAM), messages)
    # Then no call carried two records of a key, b went on in order, and a's later records were not put
    assert [seqs(c) for c in client.calls] == [[1, 2], [4]]
    assert by_seq[1].error_class is ErrorClass.THROTTLED
    assert by_seq[2].delivery_ref and by_seq[4].delivery_ref
    assert {by_seq[3].error_class, by_seq[5].error_class} == {ErrorClass.NOT_ATTEMPTED}


@pytest.mark.parametrize("code", ["ResourceNotFoundException", "KMSAccessDeniedException", "KMSDisabledException",
                                  "KMSNotFoundException", "KMSInvalidStateException", "KMSOptInRequired",
                                  "AccessDeniedException", "UnrecognizedClientException"])
def test_a_whole_call_refusing_the_stream_or_us_stops_the_batch(code):
    by_seq, _, raised = deliver(KinesisPublisher(StubKinesis(whole_call(code)), stream=STREAM),
                                [message(1), message(2)])
    assert isinstance(raised, StopBatch) and code in str(raised) and by_seq == {}


@pytest.mark.parametrize(("code", "status", "error_class"), [
    ("ProvisionedThroughputExceededException", 400, ErrorClass.THROTTLED),
    ("KMSThrottlingException", 400, ErrorClass.THROTTLED),
    ("LimitExceededException", 400, ErrorClass.THROTTLED),
    ("InternalFailure", 500, ErrorClass.TRANSIENT),
    ("ServiceUnavailableException", 503, ErrorClass.TRANSIENT),
])
def test_a_whole_call_throttle_or_failure_applies_to_each_record_unsplit(code, status, error_class):
    client = StubKinesis(whole_call(code, status))
    by_seq, _, raised = deliver(KinesisPublisher(client, stream=STREAM), [message(1), message(2)])
    assert raised is None and len(client.calls) == 1
    assert {r.error_class for r in by_seq.values()} == {error_class}


def test_a_whole_call_invalid_argument_is_split_so_only_the_bad_record_is_dead_lettered():
    def answer(records):
        if 2 in seqs(records):
            whole_call("InvalidArgumentException")(records)
        return [None] * len(records)

    client = StubKinesis(answer)
    by_seq, _, _ = deliver(KinesisPublisher(client, stream=STREAM), [message(i) for i in (1, 2, 3)])
    assert [seqs(c) for c in client.calls] == [[1, 2, 3], [1], [2], [3]]
    assert by_seq[2].error_class is ErrorClass.PERMANENT
    assert by_seq[1].delivery_ref and by_seq[3].delivery_ref


def test_the_gate_describes_the_stream_and_names_a_refusal():
    class Refusing(StubKinesis):
        def describe_stream_summary(self, **stream):
            raise ClientError({"Error": {"Code": "ResourceNotFoundException"}}, "DescribeStreamSummary")

    assert KinesisPublisher(StubKinesis(), stream=STREAM).gate() is None
    assert KinesisPublisher(Refusing(), stream=STREAM).gate() == \
        "kinesis refused the gate's call (ResourceNotFoundException)"


def test_no_call_starts_once_the_deadline_passed():
    client = StubKinesis()
    by_seq, _, _ = deliver(KinesisPublisher(client, stream=STREAM), [message(1)], Clock(4_000).deadline())
    assert client.calls == [] and by_seq == {}
