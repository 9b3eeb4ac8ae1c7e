"""The Redis Streams channel: settings (`settings`), the client (`client`), reply
errors (`replies`), the publish script (`script`), the publisher the relay drives
(`streams`), and its builder (`build`). `SPEC` is what the registry lists."""

from __future__ import annotations

from typing import Any

from ...models import Channel
from ..spec import ChannelLimits, ChannelSpec
from .metrics import METRICS
from .settings import RELATION_VARIABLES, RedisSettings, check_settings

#: Allocations (net new container objects) between young-generation collections
#: in a Redis relay once `runtime.settle_gc` ran; CPython's default is 700.
GC_YOUNG_THRESHOLD = 20_000


def message_row(**fields: Any) -> dict[str, Any]:
    """The row `producer.enqueue_event` writes for these keyword arguments (validated)."""
    from ...events import event_row

    return event_row(fields)


def _limits() -> ChannelLimits:
    from ...events import MAX_EVENT_PAYLOAD_BYTES

    # One pipeline carries the whole claimed batch, bounded by OUTBOX_BATCH_SIZE and
    # OUTBOX_BATCH_MAX_BYTES: Redis puts no limit of its own on it.
    return ChannelLimits(entries_per_call=None, bytes_per_call=None, payload_bytes=MAX_EVENT_PAYLOAD_BYTES)


SPEC = ChannelSpec(
    channel=Channel.REDIS,
    settings=RedisSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.redis.build:build_redis_publisher",
    validator="outbox_relay.publishers.redis:message_row",
    producer="enqueue_event",
    enqueue_command="enqueue-event",
    metrics=METRICS,
    limits=_limits(),
    template_prefix="Redis",
    # A Redis batch builds a few tuples per message, freed by reference counting,
    # and no cycles: the default threshold only makes the collector find nothing.
    gc_young_threshold=GC_YOUNG_THRESHOLD,
)
