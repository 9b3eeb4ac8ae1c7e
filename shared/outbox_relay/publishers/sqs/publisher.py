"""Amazon SQS publisher: ``SendMessageBatch`` to one queue, standard or FIFO (docs/channels.md, "SQS")."""

from __future__ import annotations

from typing import Any, Sequence

from ...models import ClaimedMessage, DeliveryResult
from ..aws_batch import AwsBatchPublisher
from ..aws_client import client_for
from ..aws_entries import Answers, Entry, attributed_entry, batch_answers
from ..aws_errors import ErrorCodes
from ..registry import Channel

CODES = ErrorCodes(
    throttled=frozenset({"RequestThrottled", "ThrottlingException", "Throttling", "KmsThrottled",
                         "KMS.ThrottlingException", "AWS.SimpleQueueService.RequestThrottled"}),
    configuration=frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist",
                             "AWS.SimpleQueueService.QueueDeletedRecently", "KmsAccessDenied", "KmsDisabled",
                             "KmsInvalidKeyUsage", "KmsInvalidState", "KmsNotFound", "KmsOptInRequired",
                             "KMS.AccessDeniedException", "KMS.DisabledException", "KMS.NotFoundException",
                             "KMS.KMSInvalidStateException", "InvalidAddress",
                             "AWS.SimpleQueueService.UnsupportedOperation", "UnsupportedOperation"}),
    permanent=frozenset({"InvalidMessageContents", "InvalidParameterValue", "MissingParameter",
                         "InvalidAttributeName", "InvalidAttributeValue", "MessageTooLong"}),
    transient=frozenset({"InternalError", "InternalFailure", "ServiceUnavailable",
                         "AWS.SimpleQueueService.ServiceUnavailable"}),
)


class SqsPublisher(AwsBatchPublisher):
    """Sends to one SQS queue (`queue_url`, OUTBOX_SQS_QUEUE_URL), `max_concurrency` calls at once."""

    channel = Channel.SQS
    service = "sqs"
    codes = CODES

    def __init__(self, client: Any, *, queue_url: str, max_concurrency: int = 4) -> None:
        super().__init__(client, max_concurrency=max_concurrency)
        self.queue_url = queue_url
        self.fifo = queue_url.endswith(".fifo")

    def probe(self) -> None:
        self.client.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])

    def entry(self, m: ClaimedMessage, entry_id: str) -> Entry | DeliveryResult:
        return attributed_entry(m, entry_id, "sqs", "MessageBody", self.fifo)

    def call(self, entries: Sequence[Entry]) -> Answers:
        reply = self.client.send_message_batch(QueueUrl=self.queue_url, Entries=[e.request for e in entries])
        return batch_answers(reply, "sqs")


def build_sqs_publisher(settings: Any, client: Any | None = None) -> SqsPublisher:
    return SqsPublisher(client_for(settings, client, "sqs", "SQS", settings.sqs_max_concurrency),
                        queue_url=settings.sqs_queue_url, max_concurrency=settings.sqs_max_concurrency)
