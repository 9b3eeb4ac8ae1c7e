"""The Amazon SQS channel: settings (`settings`) and the publisher the relay drives
(`publisher`), on the batch calls the AWS channels share (`publishers.aws_batch`).
`SPEC` is what the registry lists."""

from __future__ import annotations

from typing import Any

from ...models import Channel
from ..spec import ChannelLimits, ChannelSpec
from .settings import RELATION_VARIABLES, SqsSettings, check_settings


def message_row(**fields: Any) -> dict[str, Any]:
    """The row `producer.enqueue_sqs` writes for these keyword arguments (validated)."""
    from ...aws_messages import aws_row

    return aws_row(Channel.SQS, fields)


def _limits() -> ChannelLimits:
    from ...aws_messages import MAX_AWS_MESSAGE_BYTES

    # SendMessageBatch: 10 entries and 256 KiB per call ("Amazon SQS quotas").
    return ChannelLimits(entries_per_call=10, bytes_per_call=MAX_AWS_MESSAGE_BYTES, payload_bytes=MAX_AWS_MESSAGE_BYTES)


SPEC = ChannelSpec(
    channel=Channel.SQS,
    settings=SqsSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.sqs.publisher:build_sqs_publisher",
    validator="outbox_relay.publishers.sqs:message_row",
    producer="enqueue_sqs",
    enqueue_command="enqueue-sqs",
    metrics=(),
    limits=_limits(),
    template_prefix="Sqs",
)
