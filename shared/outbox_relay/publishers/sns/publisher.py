"""Amazon SNS publisher: ``PublishBatch`` to one topic, standard or FIFO
(docs/channels.md, "SNS").

Each message is one SNS message: the payload JSON is its ``Message``; the message
id, type, ordering key and headers are message attributes (`aws_messages`). On a
FIFO topic the ordering key is the ``MessageGroupId`` (a message without one is a
group of its own) and the message id is the ``MessageDeduplicationId``, as on a
FIFO queue.
"""

from __future__ import annotations

from typing import Any, Sequence

from ...models import Channel, ClaimedMessage, DeliveryResult
from ..aws_batch import AwsBatchPublisher
from ..aws_client import call_timeouts, create_client
from ..aws_entries import Entry, attributed_entry, batch_answers
from ..aws_errors import ErrorCodes

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
    """Publishes claimed messages to one SNS topic with ``PublishBatch``.

    Args:
        client: a boto3 ``sns`` client.
        topic_arn: OUTBOX_SNS_TOPIC_ARN.
        max_concurrency: calls in flight at once.
    """

    channel = Channel.SNS
    service = "sns"
    codes = CODES

    def __init__(self, client: Any, *, topic_arn: str, max_concurrency: int = 4) -> None:
        super().__init__(client, max_concurrency=max_concurrency)
        self.topic_arn = topic_arn
        self.fifo = topic_arn.endswith(".fifo")

    def probe(self) -> None:
        """``GetTopicAttributes`` of the topic: it exists and we may reach it."""
        self.client.get_topic_attributes(TopicArn=self.topic_arn)

    def entry(self, m: ClaimedMessage, entry_id: str) -> Entry | DeliveryResult:
        return attributed_entry(m, entry_id, "sns", "Message", self.fifo)

    def call(self, destination: str, entries: Sequence[Entry]) -> dict[str, tuple[str | None, str | None, bool | None]]:
        reply = self.client.publish_batch(TopicArn=self.topic_arn,
                                          PublishBatchRequestEntries=[e.request for e in entries])
        return batch_answers(reply, "sns")


def build_sns_publisher(settings: Any, client: Any | None = None) -> SnsPublisher:
    """The SNS publisher for `settings` (OUTBOX_SNS_*), with a new client unless one is given.
    Raises `ConfigurationError` naming OUTBOX_DEADLINE_MARGIN_SECONDS when it is too small."""
    margin = float(settings.deadline_margin_seconds)
    call_timeouts(margin, "SNS")
    return SnsPublisher(
        client if client is not None else create_client(
            "sns", "SNS", max_concurrency=settings.sns_max_concurrency, deadline_margin_seconds=margin,
            region_name=settings.region),
        topic_arn=settings.sns_topic_arn, max_concurrency=settings.sns_max_concurrency)
