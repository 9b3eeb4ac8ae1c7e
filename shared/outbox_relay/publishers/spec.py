"""What a channel's package exports, one `ChannelSpec`: everything outside its package that differs
by channel reads it, so a new channel is a package and a line in the registry (decision 0061)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

    from .base import Publisher


@dataclass(frozen=True)
class ChannelLimits:
    """Per downstream call, messages and bytes (None: the claim's bounds); the largest message, bytes."""

    entries_per_call: int | None
    bytes_per_call: int | None
    payload_bytes: int


@dataclass(frozen=True)
class Option:
    """One option of a channel's `outbox enqueue-…` command, `flag` giving the keyword `field`; `kind`:
    text, int, json, file-text (@file allowed), time (ISO 8601), list, pairs= / pairs:, files."""

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

    #: What `OUTBOX_CHANNEL` and the `channel` column hold.
    name: str
    #: Its own variables, composed with the common ones (`config.settings_for`).
    settings: type[BaseSettings]
    #: Raises ValueError naming the variable; `relayed` is false where a function only reads them (feedback).
    check_settings: Callable[[Any, bool], None]
    #: Variables its relation checks may name first (so a failure names the right one).
    relation_variables: tuple[str, ...]
    #: `module:function` building its publisher: a path, as the publisher's modules read the settings (logging).
    builder: str
    #: The module (imported by producers only) of `message_row(fields, now, context)` and `producer`.
    messages: str
    producer: str
    enqueue_command: str
    enqueue_help: str
    enqueue_options: tuple[Option, ...]  # the common ones follow
    #: Metrics only its publisher emits (its `counters`).
    metrics: tuple[str, ...]
    limits: ChannelLimits
    #: The template's resource prefix (`<Prefix>RelayFunction`, `Enable<Prefix>`).
    template_prefix: str
    #: Its `messaging.system` in spans (OpenTelemetry's name, else its own).
    messaging_system: str
    #: Young-generation GC threshold once initialised (`runtime.settle_gc`); None: CPython's default.
    gc_young_threshold: int | None = None
    #: What its enqueue command calls one message when refusing it ("invalid message: …").
    enqueue_noun: str = "message"

    def build_publisher(self, settings: Any) -> Publisher:
        return _resolve(self.builder)(settings)

    def message_row(self, fields: Mapping[str, Any], now: Any = None,
                    context: Mapping[str, str] | None = None) -> dict[str, Any]:
        return importlib.import_module(self.messages).message_row(fields, now, context)

    def producer_function(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.messages), self.producer)


def _resolve(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
