"""The Amazon Kinesis Data Streams channel: settings (`settings`), the record's shape
(`records`), the producer API (`enqueue`) and the publisher the relay drives
(`publisher`), on the batch calls the AWS channels share (`publishers.aws_batch`).
`SPEC` is what the registry lists."""

from __future__ import annotations

from ...models import Channel
from ..spec import ChannelLimits, ChannelSpec
from .records import BYTES_PER_CALL, MAX_RECORD_BYTES, RECORDS_PER_CALL
from .settings import RELATION_VARIABLES, KinesisSettings, check_settings

SPEC = ChannelSpec(
    channel=Channel.KINESIS,
    settings=KinesisSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.kinesis.publisher:build_kinesis_publisher",
    validator="outbox_relay.publishers.kinesis.enqueue:kinesis_row",
    producer="enqueue_kinesis",
    enqueue_command="enqueue-kinesis",
    metrics=(),
    limits=ChannelLimits(entries_per_call=RECORDS_PER_CALL, bytes_per_call=BYTES_PER_CALL,
                         payload_bytes=MAX_RECORD_BYTES),
    template_prefix="Kinesis",
)
