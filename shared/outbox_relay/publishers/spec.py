"""What a channel's package exports: one `ChannelSpec`, listed in `registry`.

Everything outside `publishers/<channel>/` that differs by channel reads it from
here (runtime, settings, the producer API, observability, the CLI, the template
tests), so a new channel is a new package and one line in the registry
(docs/howto/add-a-channel.md, decision 0061).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

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
class Option:
    """One option of a channel's `outbox enqueue-…` command: `flag` gives the producer
    API's keyword `field`. `kind` says how the command line's text becomes the value:
    text, int, json (JSON text or @file), file-text (text or @file), time (ISO 8601),
    list (repeatable), pairs= / pairs: (repeatable NAME=VALUE / Name: value), files
    (repeatable paths, read as attachments)."""

    flag: str
    field: str
    help: str = ""
    kind: str = "text"
    required: bool = False


#: The options every channel's command has, after its own.
COMMON_OPTIONS = (
    Option("--message-id", "message_id", "Idempotency key (UUID)."),
    Option("--deliver-at", "deliver_at", "ISO 8601 time with offset, e.g. 2026-12-01T09:00:00+09:00.", "time"),
    Option("--max-attempts", "max_attempts", "Retry budget of this message, 1-1000.", "int"),
)


@dataclass(frozen=True)
class ChannelSpec:
    """One channel, as the rest of the relay knows it."""

    #: Its name: what `OUTBOX_CHANNEL` and the `channel` column hold (`registry.Channel`).
    name: str
    #: Its settings: a pydantic model of its own variables, composed with the common
    #: ones into its function's settings (`config.settings_for`).
    settings: type[BaseSettings]
    #: Relations between its settings and the common ones: `check(settings, relayed)`
    #: raises ValueError naming the variable; `relayed` is true when this channel is the one
    #: the function relays (the feedback function reads SES's settings and relays none).
    check_settings: Callable[[Any, bool], None]
    #: Variables its relation checks may name first (so a failure names the right one).
    relation_variables: tuple[str, ...]
    #: `module:function` that builds its publisher (which carries its gate) from the
    #: settings, on a cold start. A dotted path, not the function: the settings read
    #: this registry, and the publisher's modules read the settings (through logging).
    builder: str
    #: The module of its message (imported by producers only): `message_row(fields, now,
    #: context)` checks one message's fields (the producer API's keyword arguments) and
    #: returns the row to write, raising `InvalidMessageError` naming the field; and its
    #: named producer API function, `producer`.
    messages: str
    producer: str
    #: Its `outbox` enqueue command: the name, what it says it enqueues, its own options
    #: (the common ones follow).
    enqueue_command: str
    enqueue_help: str
    enqueue_options: tuple[Option, ...]
    #: Metrics only its publisher emits (its `counters`), by name.
    metrics: tuple[str, ...]
    limits: ChannelLimits
    #: The template's resource prefix (`<Prefix>RelayFunction`, `Enable<Prefix>`).
    template_prefix: str
    #: Its `messaging.system` in the relay's spans (OpenTelemetry semantic conventions;
    #: a system they do not list goes by its own name).
    messaging_system: str
    #: Young-generation GC threshold once the container is initialised (`runtime.settle_gc`);
    #: None keeps CPython's default (publishers that leave reference cycles behind).
    gc_young_threshold: int | None = None
    #: What its enqueue command calls one message when refusing it ("invalid message: …").
    enqueue_noun: str = "message"

    def build_publisher(self, settings: Any) -> Publisher:
        """Its publisher for `settings` (`builder`)."""
        return _resolve(self.builder)(settings)

    def message_row(self, fields: Mapping[str, Any], now: Any = None,
                    context: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The row the producer API writes for these fields (`messages`)."""
        return importlib.import_module(self.messages).message_row(fields, now, context)

    def producer_function(self) -> Callable[..., Any]:
        """Its named producer API function (`producer.<producer>`)."""
        return getattr(importlib.import_module(self.messages), self.producer)


def _resolve(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
