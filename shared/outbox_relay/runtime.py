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
from .errors import ConfigurationError
from .models import Channel, Mode
from .pollers import PollerRegistry, Registry, StartSuccessor, lambda_starter
from .publishers.base import Publisher
from .relay import RelayPolicy
from .store import LeaseStore
from .urls import check_redis_url


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


def redis_url(settings: Settings) -> str:
    """`REDIS_URL`, or the string of the `REDIS_URL_SECRET_ARN` secret (cached by Powertools)."""
    if settings.redis_url:
        return settings.redis_url
    from aws_lambda_powertools.utilities import parameters

    try:
        value = parameters.get_secret(settings.redis_url_secret_arn, max_age=300)
    except Exception as exc:
        raise ConfigurationError("REDIS_URL_SECRET_ARN", f"cannot read the secret ({type(exc).__name__})") from exc
    value = value.decode() if isinstance(value, bytes) else str(value)
    if not value.startswith(("redis://", "rediss://")):
        raise ConfigurationError("REDIS_URL_SECRET_ARN", "secret must hold a redis:// or rediss:// URL")
    try:
        check_redis_url(value, cluster=settings.redis_cluster, iam=settings.redis_iam_auth)
    except ValueError as exc:
        raise ConfigurationError("REDIS_URL_SECRET_ARN", f"the secret's URL: {exc}") from None
    return value


def iam_credentials(settings: Settings, url: str) -> Any:
    """The ElastiCache IAM token provider when OUTBOX_REDIS_IAM_AUTH is on, else None."""
    if not settings.redis_iam_auth:
        return None
    from urllib.parse import unquote, urlparse

    from .publishers.redis_client import ElastiCacheIamCredentials

    region = settings.region
    if not region:
        raise ConfigurationError("AWS_DEFAULT_REGION", "the ElastiCache IAM token is signed for a region: set "
                                 "AWS_REGION or AWS_DEFAULT_REGION (Lambda sets AWS_REGION)")
    return ElastiCacheIamCredentials(unquote(urlparse(url).username or ""), str(settings.redis_iam_cache_name),
                                     region, serverless=settings.redis_iam_serverless)


def build_publisher(settings: Settings) -> Publisher:
    if settings.channel is Channel.REDIS:
        from .publishers.redis_client import create_redis_client
        from .publishers.redis_streams import RedisStreamsPublisher

        url = redis_url(settings)
        client = create_redis_client(url, socket_timeout_seconds=settings.redis_socket_timeout_seconds,
                                     cluster=settings.redis_cluster, credential_provider=iam_credentials(settings, url))
        return RedisStreamsPublisher(
            client, dedupe_ttl_seconds=settings.redis_dedupe_ttl_seconds, maxlen=settings.redis_maxlen,
            trim=settings.redis_trim, on_full=settings.redis_on_full, wait_replicas=settings.redis_wait_replicas,
            wait_timeout_ms=settings.redis_wait_timeout_ms, memory_high=settings.redis_memory_high,
            oom_backoff_seconds=settings.redis_oom_backoff_seconds)
    from .publishers.ses.publisher import build_ses_publisher

    return build_ses_publisher(settings)


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
        pollers = PollerRegistry(get_engine(), settings.channel, settings.poller_ttl_seconds)
        if settings.self_invoke and settings.function_name:
            start_successor = lambda_starter(settings.function_name, settings.region)
    deps = Dependencies(settings, store, build_publisher(settings), build_policy(settings), pollers, start_successor)
    settle_gc(settings.channel)
    return deps


#: Allocations (net new container objects) between young-generation collections
#: in a Redis relay once `settle_gc` ran; CPython's default is 700.
GC_YOUNG_THRESHOLD = 20_000
_gc_settled = False


def settle_gc(channel: Channel) -> None:
    """Tune the garbage collector for relaying, once per process, at the end of
    the container's initialisation (the first `get_dependencies`).

    - `gc.freeze()` moves every object that exists by then (imported modules,
      boto3, SQLAlchemy, the engine and clients) to the permanent generation,
      which collections never walk again (Python documentation, "gc — Garbage
      Collector interface", `gc.freeze`), so no full collection walks them in
      the middle of a batch.
    - Redis channel only: the young generation's threshold is raised to
      `GC_YOUNG_THRESHOLD` (`gc.set_threshold`). A Redis batch builds a few
      tuples per message (claimed row, delivery result, outcome), freed by
      reference counting, and no reference cycles, so the default threshold
      only makes the collector run to find nothing. The SES channel keeps the
      default: each send leaves cycles behind (the standard library's email
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
    if channel is Channel.REDIS:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


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
