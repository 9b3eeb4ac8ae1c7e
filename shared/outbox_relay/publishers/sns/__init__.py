"""The Amazon SNS channel: its settings and publisher on `aws_batch`, listed by its `SPEC`."""

from __future__ import annotations

from ..aws_message import AWS_OPTIONS, MAX_AWS_MESSAGE_BYTES
from ..spec import ChannelLimits, ChannelSpec, Option
from .settings import RELATION_VARIABLES, SnsSettings, check_settings

SPEC = ChannelSpec(
    name="sns",
    settings=SnsSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.sns.publisher:build_sns_publisher",
    messages="outbox_relay.publishers.sns.message",
    producer="enqueue_sns",
    enqueue_command="enqueue-sns",
    enqueue_help="Enqueue one message for the SNS relay's topic and print its message id.",
    enqueue_options=(*AWS_OPTIONS,
        Option("--header", "headers", "A message attribute, name=value (repeatable, at most 7).", "pairs="),
    ),
    metrics=(),
    # PublishBatch: 10 entries and 256 KiB per call ("Amazon SNS quotas").
    limits=ChannelLimits(entries_per_call=10, bytes_per_call=MAX_AWS_MESSAGE_BYTES, payload_bytes=MAX_AWS_MESSAGE_BYTES),
    template_prefix="Sns",
    messaging_system="aws_sns",
)
