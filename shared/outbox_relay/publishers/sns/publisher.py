"""Amazon SNS publisher: ``PublishBatch`` to one topic, standard or FIFO (docs/channels.md, "SNS")."""

from __future__ import annotations

from typing import Any, Sequence

from ...models import ClaimedMessage, DeliveryResult
from ..aws_batch import AwsBatchPublisher
from ..aws_client import client_for
from ..aws_entries import Answers, Entry, attributed_entry, batch_answers
from ..aws_errors import ErrorCodes
from ..registry import Channel

CODES = ErrorCodes(
    throttled=frozenset({"Throttled", "ThrottlingException", "Throttling", "KMSThrottling",
                         "TooManyRequestsException"}),
    configuration=frozenset({"NotFound", "NotFoundException", "KMSAccessDenied", "KMSDisabled",
                             "KMSInvalidState", "KMSNotFound", "KMSOptInRequired", "InvalidSecurity",
                             "AuthorizationError"}),
    permanent=frozenset({"InvalidParameter", "InvalidParameterValue", "ValidationException",
                         "EmptyBatchRequest"}),
    transient=frozenset({"InternalError", "InternalFailure", "ServiceUnavailable"}),
)


class SnsPublisher(AwsBatchPublisher):
    """Publishes to one SNS topic (`topic_arn`, OUTBOX_SNS_TOPIC_ARN), `max_concurrency` calls at once."""

    channel = Channel.SNS
    service = "sns"
    codes = CODES

    def __init__(self, client: Any, *, topic_arn: str, max_concurrency: int = 4) -> None:
        super().__init__(client, max_concurrency=max_concurrency)
        self.topic_arn = topic_arn
        self.fifo = topic_arn.endswith(".fifo")

    def probe(self) -> None:
        self.client.get_topic_attributes(TopicArn=self.topic_arn)

    def entry(self, m: ClaimedMessage, entry_id: str) -> Entry | DeliveryResult:
        return attributed_entry(m, entry_id, "sns", "Message", self.fifo)

    def call(self, entries: Sequence[Entry]) -> Answers:
        reply = self.client.publish_batch(TopicArn=self.topic_arn,
                                          PublishBatchRequestEntries=[e.request for e in entries])
        return batch_answers(reply, "sns")


def build_sns_publisher(settings: Any, client: Any | None = None) -> SnsPublisher:
    return SnsPublisher(client_for(settings, client, "sns", "SNS", settings.sns_max_concurrency),
                        topic_arn=settings.sns_topic_arn, max_concurrency=settings.sns_max_concurrency)
