"""Builds the Redis channel's publisher from the settings (a cold start)."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigurationError
from ...urls import check_redis_url
from .client import ElastiCacheIamCredentials, create_redis_client
from .streams import RedisStreamsPublisher


def redis_url(settings: Any) -> str:
    if settings.redis_url:
        return settings.redis_url
    from ...db import read_secret

    value = str(read_secret("REDIS_URL_SECRET_ARN", settings.redis_url_secret_arn))
    if not value.startswith(("redis://", "rediss://")):
        raise ConfigurationError("REDIS_URL_SECRET_ARN", "secret must hold a redis:// or rediss:// URL")
    try:
        check_redis_url(value, cluster=settings.redis_cluster, iam=settings.redis_iam_auth)
    except ValueError as exc:
        raise ConfigurationError("REDIS_URL_SECRET_ARN", f"the secret's URL: {exc}") from None
    return value


def iam_credentials(settings: Any, url: str) -> Any:
    if not settings.redis_iam_auth:
        return None
    from urllib.parse import unquote, urlparse

    region = settings.region
    if not region:
        raise ConfigurationError("AWS_DEFAULT_REGION", "the ElastiCache IAM token is signed for a region: set "
                                 "AWS_REGION or AWS_DEFAULT_REGION (Lambda sets AWS_REGION)")
    return ElastiCacheIamCredentials(unquote(urlparse(url).username or ""), str(settings.redis_iam_cache_name),
                                     region, serverless=settings.redis_iam_serverless)


def build_redis_publisher(settings: Any) -> RedisStreamsPublisher:
    url = redis_url(settings)
    client = create_redis_client(url, socket_timeout_seconds=settings.redis_socket_timeout_seconds,
                                 cluster=settings.redis_cluster, credential_provider=iam_credentials(settings, url))
    return RedisStreamsPublisher(
        client, dedupe_ttl_seconds=settings.redis_dedupe_ttl_seconds, maxlen=settings.redis_maxlen,
        trim=settings.redis_trim, on_full=settings.redis_on_full, wait_replicas=settings.redis_wait_replicas,
        wait_timeout_ms=settings.redis_wait_timeout_ms, memory_high=settings.redis_memory_high,
        oom_backoff_seconds=settings.redis_oom_backoff_seconds, entry_format=settings.redis_format,
        cloudevents_source=settings.cloudevents_source)
