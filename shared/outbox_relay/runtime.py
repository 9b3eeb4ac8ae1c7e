"""Per-container wiring for the relay handlers, built on first use (cold start), reused warm."""

from __future__ import annotations

import contextlib
import functools
import gc
from dataclasses import dataclass
from typing import Any

from .backoff import Backoff
from .config import Settings, get_settings
from .db import create_relay_engine
from .loop import RelayPolicy
from .models import Mode
from .pollers import PollerRegistry, Registry, StartSuccessor, lambda_starter
from .publishers.base import Publisher
from .publishers.registry import Channel, spec_for
from .store import LeaseStore


@dataclass(frozen=True)
class Dependencies:
    settings: Settings
    store: LeaseStore
    publisher: Publisher
    policy: RelayPolicy
    pollers: Registry | None = None
    start_successor: StartSuccessor | None = None


def build_publisher(settings: Settings) -> Publisher:
    return spec_for(settings.channel).build_publisher(settings)


def build_policy(settings: Settings) -> RelayPolicy:
    return RelayPolicy(
        batch_size=settings.batch_size, lease_seconds=settings.lease_seconds,
        backoff=Backoff(base=settings.backoff_base_seconds, cap=settings.backoff_cap_seconds,
                        floor=settings.backoff_floor_seconds),
        throttle_delay_seconds=settings.throttle_delay_seconds, batch_max_bytes=settings.batch_max_bytes,
        mode=settings.mode, poll_interval_seconds=settings.poll_interval_seconds,
        poll_max_interval_seconds=settings.poll_max_interval_seconds)


@functools.cache
def get_engine() -> Any:
    return create_relay_engine(get_settings())


@functools.cache
def get_dependencies() -> Dependencies:
    settings = get_settings()
    store = LeaseStore(get_engine(), settings.channel, default_max_attempts=settings.max_attempts,
                       error_max_chars=settings.error_max_chars, ordering_on_dead=settings.ordering_on_dead)
    pollers, start_successor = None, None
    if settings.mode is Mode.LATENCY:
        pollers = PollerRegistry(get_engine(), settings.channel, settings.poller_ttl_seconds, settings.pollers)
        if settings.self_invoke and settings.function_name:
            start_successor = lambda_starter(settings.function_name, settings.region)
    deps = Dependencies(settings, store, build_publisher(settings), build_policy(settings), pollers, start_successor)
    settle_gc(settings.channel)
    return deps


_gc_settled = False


def settle_gc(channel: Channel) -> None:
    """Once, after the container's initialisation: `gc.freeze()` so no collection walks the imported
    modules and clients mid-batch; a channel's `gc_young_threshold` where its batches make no
    cycles (Redis), so the collector does not run to find nothing."""
    global _gc_settled
    if _gc_settled:
        return
    _gc_settled = True
    gc.freeze()
    young = spec_for(channel).gc_young_threshold
    if young is not None:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(young, older, oldest)


def reset() -> None:
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    get_dependencies.cache_clear()
    get_engine.cache_clear()
    get_settings.cache_clear()
    # Metrics not flushed (POWERTOOLS_METRICS_DISABLED) would carry the previous channel's dimension over.
    from .observability import metrics

    metrics.clear_metrics()
    with contextlib.suppress(Exception):  # parameters is optional at runtime
        from aws_lambda_powertools.utilities import parameters

        parameters.clear_caches()
