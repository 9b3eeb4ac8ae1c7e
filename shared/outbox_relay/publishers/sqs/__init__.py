"""The Amazon SQS channel: its settings and publisher on `aws_batch`, listed by its `SPEC`."""

from __future__ import annotations

from ..aws_message import AWS_OPTIONS, MAX_AWS_MESSAGE_BYTES
from ..spec import ChannelLimits, ChannelSpec, Option
from .settings import RELATION_VARIABLES, SqsSettings, check_settings

SPEC = ChannelSpec(
    name="sqs",
    settings=SqsSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.sqs.publisher:build_sqs_publisher",
    messages="outbox_relay.publishers.sqs.message",
    producer="enqueue_sqs",
    enqueue_command="enqueue-sqs",
    enqueue_help="Enqueue one message for the SQS relay's queue and print its message id.",
    enqueue_options=(*AWS_OPTIONS,
        Option("--header", "headers", "A message attribute, name=value (repeatable, at most 7).", "pairs="),
    ),
    metrics=(),
    # SendMessageBatch: 10 entries and 256 KiB per call ("Amazon SQS quotas").
    limits=ChannelLimits(entries_per_call=10, bytes_per_call=MAX_AWS_MESSAGE_BYTES, payload_bytes=MAX_AWS_MESSAGE_BYTES),
    template_prefix="Sqs",
    messaging_system="aws_sqs",
)
