"""Per-container wiring for the Lambda handlers: settings, engine, clients,
built once on first use (cold start) and reused by warm invocations.

Nothing here runs at import. Tests call `reset()` after changing the environment.
"""

from __future__ import annotations

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
    """What a relay invocation needs; tests may build their own."""

    settings: Settings
    store: LeaseStore
    publisher: Publisher
    policy: RelayPolicy
    #: Latency mode: the poller registry, and how a poller starts its successor (None: it starts none).
    pollers: Registry | None = None
    start_successor: StartSuccessor | None = None


def build_publisher(settings: Settings) -> Publisher:
    """The publisher of `settings.channel`, built by its package (`publishers/registry.py`)."""
    return spec_for(settings.channel).build_publisher(settings)


def build_policy(settings: Settings) -> RelayPolicy:
    return RelayPolicy(
        batch_size=settings.batch_size,
        lease_seconds=settings.lease_seconds,
        backoff=Backoff(base=settings.backoff_base_seconds, cap=settings.backoff_cap_seconds,
                        floor=settings.backoff_floor_seconds),
        throttle_delay_seconds=settings.throttle_delay_seconds,
        batch_max_bytes=settings.batch_max_bytes,
        mode=settings.mode,
        poll_interval_seconds=settings.poll_interval_seconds,
        poll_max_interval_seconds=settings.poll_max_interval_seconds,
    )


@functools.cache
def get_engine() -> Any:
    return create_relay_engine(get_settings())


@functools.cache
def get_dependencies() -> Dependencies:
    """Settings, store, publisher and policy for this container (built once)."""
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
    """Tune the garbage collector for relaying, once per process, at the end of
    the container's initialisation (the first `get_dependencies`).

    - `gc.freeze()` moves every object that exists by then (imported modules,
      boto3, SQLAlchemy, the engine and clients) to the permanent generation,
      which collections never walk again (Python documentation, "gc — Garbage
      Collector interface", `gc.freeze`), so no full collection walks them in
      the middle of a batch.
    - A channel whose spec sets `gc_young_threshold` gets that young-generation
      threshold (`gc.set_threshold`). Redis sets one (`publishers.redis.GC_YOUNG_THRESHOLD`): a Redis
      batch builds a few tuples per message (claimed row, delivery result,
      outcome), freed by reference counting, and no reference cycles, so the
      default threshold only makes the collector run to find nothing. SES keeps
      the default: each send leaves cycles behind (the standard library's email
      header classes, botocore's response parsers), which a higher threshold
      would keep in memory longer, and SES is paced by its send rate anyway.

    The drain bench reports the time left in the collector ("GC µs/msg",
    docs/benchmark.md). The older generations' thresholds are kept.
    """
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
    """Forget every cached object (tests, or after changing the environment)."""
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    get_dependencies.cache_clear()
    get_engine.cache_clear()
    get_settings.cache_clear()
    # Metrics not flushed (POWERTOOLS_METRICS_DISABLED skips the flush that clears
    # them) would otherwise carry the previous channel's dimension over.
    from .observability import metrics

    metrics.clear_metrics()
    try:
        from aws_lambda_powertools.utilities import parameters

        parameters.clear_caches()
    except Exception:  # pragma: no cover - parameters is optional at runtime
        pass
