"""What a channel's package exports: one `ChannelSpec`, listed in `registry`.

Everything outside `publishers/<channel>/` that differs by channel reads it from
here (runtime, settings, observability, the CLI, the template tests), so a new
channel is a new package and one line in the registry (docs/howto/add-a-channel.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..models import Channel

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

    from .base import Publisher


@dataclass(frozen=True)
class ChannelLimits:
    """The downstream's limits, as the publisher and the producer API apply them."""

    #: Messages one downstream call carries (Redis: one pipeline per batch, so the claim's).
    entries_per_call: int | None
    #: Bytes one downstream call carries, None when only the claim's byte budget bounds it.
    bytes_per_call: int | None
    #: The largest message the producer API accepts for this channel, bytes.
    payload_bytes: int


@dataclass(frozen=True)
class ChannelSpec:
    """One channel, as the rest of the relay knows it."""

    channel: Channel
    #: Its settings: a pydantic mixin of `config.Settings` (its environment variables).
    settings: type[BaseSettings]
    #: Relations between its settings, given the whole `Settings`: `check(settings, relayed)`
    #: raises ValueError naming the variable; `relayed` is true when this channel is the one
    #: the function relays (the maintenance function relays none).
    check_settings: Callable[[Any, bool], None]
    #: Variables its relation checks may name first (so a failure names the right one).
    relation_variables: tuple[str, ...]
    #: `module:function` that builds its publisher (which carries its gate) from the
    #: settings, on a cold start. A dotted path, not the function: the settings read
    #: this registry, and the publisher's modules read the settings (through logging).
    builder: str
    #: `module:function` that checks one message's fields for it (keyword arguments of
    #: its producer API function) and returns the row the producer API writes; raises
    #: `InvalidMessageError` naming the field.
    validator: str
    #: The producer API function (`producer.<name>`) that writes one message for it.
    producer: str
    #: The `outbox` command that enqueues one message for it.
    enqueue_command: str
    #: Metrics only its publisher emits (its `counters`), by name.
    metrics: tuple[str, ...]
    limits: ChannelLimits
    #: The template's resource prefix (`<Prefix>RelayFunction`, `Enable<Prefix>`).
    template_prefix: str
    #: Young-generation GC threshold once the container is initialised (`runtime.settle_gc`);
    #: None keeps CPython's default (publishers that leave reference cycles behind).
    gc_young_threshold: int | None = None

    def build_publisher(self, settings: Any) -> Publisher:
        """Its publisher for `settings` (`builder`)."""
        return _resolve(self.builder)(settings)

    def validate_message(self, **fields: Any) -> Mapping[str, Any]:
        """The row the producer API would write for these fields (`validator`)."""
        return _resolve(self.validator)(**fields)


def _resolve(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
