"""Amazon Kinesis Data Streams publisher: ``PutRecords`` to one stream, at most 500
records and 5 MiB per call (docs/channels.md, "Kinesis").

Each message is one record: its data is a JSON object carrying the message id, type,
ordering key, headers and payload (`records.record_data`); its partition key is the
ordering key, or the message id for a message without one. ``PutRecords`` does not
keep the order of records within a call, so the shared rounds (`aws_batch`) put at
most one record of a key in a call and its next only once that one is in the stream:
a key's records land in its shard in order, and a failed record holds back its key's
later ones. Each record's ``ErrorCode`` is classified on its own.
"""

from __future__ import annotations

from typing import Any, Sequence

from ...models import ClaimedMessage, DeliveryResult, ErrorClass
from ..aws_batch import AwsBatchPublisher
from ..aws_client import call_timeouts, create_client
from ..aws_entries import Entry
from ..aws_errors import ErrorCodes
from ..registry import Channel
from .records import BYTES_PER_CALL, MAX_RECORD_BYTES, RECORDS_PER_CALL, partition_key, record_bytes, record_data
from .settings import stream_parameter

# A record's ErrorCode is ProvisionedThroughputExceededException or InternalFailure
# ("PutRecordsResultEntry"); the rest are the whole call's ("PutRecords", Errors).
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
    """Puts claimed messages on one Kinesis data stream with ``PutRecords``.

    Args:
        client: a boto3 ``kinesis`` client.
        stream: OUTBOX_KINESIS_STREAM, a name or an ARN.
        max_concurrency: calls in flight at once.
    """

    channel = Channel.KINESIS
    service = "kinesis"
    codes = CODES
    entries_per_call = RECORDS_PER_CALL
    bytes_per_call = BYTES_PER_CALL

    def __init__(self, client: Any, *, stream: str, max_concurrency: int = 4) -> None:
        super().__init__(client, max_concurrency=max_concurrency)
        self.stream = stream_parameter(stream)

    def probe(self) -> None:
        """``DescribeStreamSummary`` of the stream: it exists and we may reach it."""
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

    def call(self, destination: str, entries: Sequence[Entry]) -> dict[str, tuple[str | None, str | None, bool | None]]:
        reply = self.client.put_records(Records=[e.request for e in entries], **self.stream)
        out: dict[str, tuple[str | None, str | None, bool | None]] = {}
        # The reply's records are in the request's order ("PutRecords", Records).
        for e, answer in zip(entries, reply.get("Records") or ()):
            if answer.get("SequenceNumber") and not answer.get("ErrorCode"):
                out[str(e.message.seq)] = (f"kinesis:{answer.get('ShardId')}:{answer['SequenceNumber']}", None, None)
            else:
                out[str(e.message.seq)] = (None, answer.get("ErrorCode") or "Unknown", None)
        return out


def build_kinesis_publisher(settings: Any, client: Any | None = None) -> KinesisPublisher:
    """The Kinesis publisher for `settings` (OUTBOX_KINESIS_*), with a new client unless one is given.
    Raises `ConfigurationError` naming OUTBOX_DEADLINE_MARGIN_SECONDS when it is too small."""
    margin = float(settings.deadline_margin_seconds)
    call_timeouts(margin, "Kinesis")
    return KinesisPublisher(
        client if client is not None else create_client(
            "kinesis", "Kinesis", max_concurrency=settings.kinesis_max_concurrency,
            deadline_margin_seconds=margin, region_name=settings.region),
        stream=settings.kinesis_stream, max_concurrency=settings.kinesis_max_concurrency)
