"""The Amazon Kinesis Data Streams channel: its settings, record, message and publisher on `aws_batch`."""

from __future__ import annotations

from ..aws_message import AWS_OPTIONS
from ..spec import ChannelLimits, ChannelSpec, Option
from .records import BYTES_PER_CALL, MAX_RECORD_BYTES, RECORDS_PER_CALL
from .settings import RELATION_VARIABLES, KinesisSettings, check_settings

SPEC = ChannelSpec(
    name="kinesis",
    settings=KinesisSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.kinesis.publisher:build_kinesis_publisher",
    messages="outbox_relay.publishers.kinesis.message",
    producer="enqueue_kinesis",
    enqueue_command="enqueue-kinesis",
    enqueue_help="Enqueue one record for the Kinesis relay's stream (the key is its partition key) "
                 "and print its message id.",
    enqueue_options=(*AWS_OPTIONS,
        Option("--header", "headers", "A header of the record, name=value (repeatable).", "pairs="),
    ),
    metrics=(),
    limits=ChannelLimits(entries_per_call=RECORDS_PER_CALL, bytes_per_call=BYTES_PER_CALL,
                         payload_bytes=MAX_RECORD_BYTES),
    template_prefix="Kinesis",
    messaging_system="aws_kinesis",
)
