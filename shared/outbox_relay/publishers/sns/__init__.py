"""The Amazon SNS channel: settings (`settings`) and the publisher the relay drives
(`publisher`), on the batch calls the AWS channels share (`publishers.aws_batch`).
`SPEC` is what the registry lists."""

from __future__ import annotations

from typing import Any

from ...models import Channel
from ..spec import ChannelLimits, ChannelSpec
from .settings import RELATION_VARIABLES, SnsSettings, check_settings


def message_row(**fields: Any) -> dict[str, Any]:
    """The row `producer.enqueue_sns` writes for these keyword arguments (validated)."""
    from ...aws_messages import aws_row

    return aws_row(Channel.SNS, fields)


def _limits() -> ChannelLimits:
    from ...aws_messages import MAX_AWS_MESSAGE_BYTES

    # PublishBatch: 10 entries and 256 KiB per call ("Amazon SNS quotas").
    return ChannelLimits(entries_per_call=10, bytes_per_call=MAX_AWS_MESSAGE_BYTES, payload_bytes=MAX_AWS_MESSAGE_BYTES)


SPEC = ChannelSpec(
    channel=Channel.SNS,
    settings=SnsSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.sns.publisher:build_sns_publisher",
    validator="outbox_relay.publishers.sns:message_row",
    producer="enqueue_sns",
    enqueue_command="enqueue-sns",
    metrics=(),
    limits=_limits(),
    template_prefix="Sns",
)
