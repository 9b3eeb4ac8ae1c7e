"""The Amazon EventBridge channel: its settings and publisher on `aws_batch`, listed by its `SPEC`."""

from __future__ import annotations

from ..aws_message import AWS_OPTIONS, MAX_AWS_MESSAGE_BYTES
from ..spec import ChannelLimits, ChannelSpec, Option
from .settings import RELATION_VARIABLES, EventBridgeSettings, check_settings

SPEC = ChannelSpec(
    name="eventbridge",
    settings=EventBridgeSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.eventbridge.publisher:build_eventbridge_publisher",
    messages="outbox_relay.publishers.eventbridge.message",
    producer="enqueue_eventbridge",
    enqueue_command="enqueue-eventbridge",
    enqueue_help="Enqueue one EventBridge event (the payload, a JSON object, is its detail) and print its message id.",
    enqueue_options=(*AWS_OPTIONS,
        Option("--source", "source", "The event's source; else OUTBOX_EVENTBRIDGE_SOURCE."),
        Option("--bus", "bus", "The event bus (name or ARN); else OUTBOX_EVENTBRIDGE_BUS."),
    ),
    metrics=(),
    # PutEvents: 10 entries and 256 KiB per call ("Amazon EventBridge quotas").
    limits=ChannelLimits(entries_per_call=10, bytes_per_call=MAX_AWS_MESSAGE_BYTES, payload_bytes=MAX_AWS_MESSAGE_BYTES),
    template_prefix="EventBridge",
    messaging_system="aws_eventbridge",
)
