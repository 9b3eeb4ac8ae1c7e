"""Kinesis publisher: ``PutRecords`` does not keep the order of records within a call, so the shared rounds
(`aws_batch`) put one record of a key in a call, the next once it is in the stream (docs/channels.md)."""

from __future__ import annotations

from typing import Any, Sequence

from ...models import ClaimedMessage, DeliveryResult, ErrorClass
from ..aws_batch import AwsBatchPublisher
from ..aws_client import client_for
from ..aws_entries import Answers, Entry, positional_answers
from ..aws_errors import ErrorCodes
from ..registry import Channel
from .records import BYTES_PER_CALL, MAX_RECORD_BYTES, RECORDS_PER_CALL, partition_key, record_bytes, record_data
from .settings import stream_parameter

# A record's ErrorCode is a throttle or InternalFailure; the rest are the whole call's ("PutRecords", Errors).
CODES = ErrorCodes(
    throttled=frozenset({"ProvisionedThroughputExceededException", "KMSThrottlingException",
                         "LimitExceededException", "ThrottlingException"}),
    configuration=frozenset({"ResourceNotFoundException", "KMSAccessDeniedException", "KMSDisabledException",
                             "KMSInvalidStateException", "KMSNotFoundException", "KMSOptInRequired"}),
    permanent=frozenset({"InvalidArgumentException", "ValidationException"}),
    transient=frozenset({"InternalFailure", "InternalFailureException", "ServiceUnavailable",
                         "ServiceUnavailableException"}),
)


class KinesisPublisher(AwsBatchPublisher):
    """Puts records on one stream (OUTBOX_KINESIS_STREAM, a name or an ARN)."""

    channel = Channel.KINESIS
    service = "kinesis"
    codes = CODES
    entries_per_call = RECORDS_PER_CALL
    bytes_per_call = BYTES_PER_CALL

    def __init__(self, client: Any, *, stream: str, max_concurrency: int = 4) -> None:
        super().__init__(client, max_concurrency=max_concurrency)
        self.stream = stream_parameter(stream)

    def probe(self) -> None:
        self.client.describe_stream_summary(**self.stream)

    def entry(self, m: ClaimedMessage, entry_id: str) -> Entry | DeliveryResult:
        data = record_data(m.message_id, m.type, m.key, m.headers_json, m.payload_json)
        partition = partition_key(m.key, m.message_id)
        size = record_bytes(data, partition)
        if size > MAX_RECORD_BYTES:
            return DeliveryResult(m.seq, error_class=ErrorClass.PERMANENT,
                                  error=f"kinesis: record is {size} bytes with its partition key; the limit is "
                                        f"{MAX_RECORD_BYTES}")
        return Entry(m, {"Data": data.encode("utf-8"), "PartitionKey": partition}, size)

    def call(self, entries: Sequence[Entry]) -> Answers:
        reply = self.client.put_records(Records=[e.request for e in entries], **self.stream)
        return positional_answers(entries, reply.get("Records") or (), lambda a: a.get("SequenceNumber") and
                                  f"kinesis:{a.get('ShardId')}:{a['SequenceNumber']}")


def build_kinesis_publisher(settings: Any, client: Any | None = None) -> KinesisPublisher:
    return KinesisPublisher(client_for(settings, client, "kinesis", "Kinesis", settings.kinesis_max_concurrency),
                            stream=settings.kinesis_stream, max_concurrency=settings.kinesis_max_concurrency)
