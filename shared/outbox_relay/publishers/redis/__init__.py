"""The Redis Streams channel (the publisher is `streams`); `SPEC` is what the registry lists."""

from __future__ import annotations

from ..spec import ChannelLimits, ChannelSpec, Option
from .settings import RELATION_VARIABLES, RedisSettings, check_settings

#: A Redis batch builds a few tuples per message, freed by reference counting, and no cycles:
#: CPython's default threshold (700) only makes the collector find nothing.
GC_YOUNG_THRESHOLD = 20_000
#: The Redis relay's own metrics (its publisher's `counters`), counts per invocation.
NOT_REPLICATED, MEMORY_FULL, STREAM_FULL, TRIMMED_UNACKNOWLEDGED = METRICS = (
    "NotReplicated", "RedisMemoryFull", "StreamFull", "TrimmedUnacknowledged")
#: Redis accepts far more, but a relay batch holds every payload in memory (SQS's limit).
MAX_EVENT_PAYLOAD_BYTES = 256 * 1024

SPEC = ChannelSpec(
    name="redis",
    settings=RedisSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.redis.build:build_redis_publisher",
    messages="outbox_relay.publishers.redis.message",
    producer="enqueue_event",
    enqueue_command="enqueue-event",
    enqueue_help="Enqueue one domain event (in its own transaction) and print its message id.",
    enqueue_options=(
        Option("--stream", "stream", "Redis stream key.", required=True),
        Option("--type", "type", "Event type, e.g. order.placed.", required=True),
        Option("--payload", "payload", "JSON text, or @file.json to read a file.", "json", required=True),
        Option("--key", "key", "Ordering/partition key."),
    ),
    metrics=METRICS,
    # One pipeline carries the whole claimed batch: Redis puts no limit of its own on it.
    limits=ChannelLimits(entries_per_call=None, bytes_per_call=None, payload_bytes=MAX_EVENT_PAYLOAD_BYTES),
    template_prefix="Redis",
    messaging_system="redis",
    gc_young_threshold=GC_YOUNG_THRESHOLD,
)
