"""The Redis channel's settings (OUTBOX_REDIS_*, REDIS_URL, REDIS_URL_SECRET_ARN): a mixin of `config.Settings`."""

from __future__ import annotations

import enum
import re
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from ...urls import check_redis_url


class RedisTrim(str, enum.Enum):
    """How streams are kept to OUTBOX_REDIS_MAXLEN (OUTBOX_REDIS_TRIM; docs/channels.md, "Trimming")."""

    MAXLEN = "maxlen"  # XADD MAXLEN ~ n: oldest entries go, read or not
    ACKNOWLEDGED = "acknowledged"  # only entries every consumer group has acknowledged go


class RedisOnFull(str, enum.Enum):
    """What `acknowledged` trimming does with a stream at its bound because a group lags (OUTBOX_REDIS_ON_FULL)."""

    HOLD = "hold"  # publish nothing more to it: released with attempts refunded, metric StreamFull
    TRIM = "trim"  # trim to the bound anyway: metric TrimmedUnacknowledged counts what went unacknowledged


class RedisFormat(str, enum.Enum):
    """The layout of a stream entry's fields (OUTBOX_REDIS_FORMAT; docs/channels.md, "Entry layouts")."""

    FIELDS = "fields"  # id, type, key, payload, created_at, headers, traceparent, tracestate
    CLOUDEVENTS = "cloudevents"  # CloudEvents 1.0 attributes, one field each, the payload as `data`


# RFC 3986: unreserved, reserved and percent characters.
_URI_REFERENCE = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]{1,512}")


class RedisSettings(BaseSettings):
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    """`redis://` or `rediss://` (TLS) URL, with AUTH user/password if any."""
    redis_url_secret_arn: str | None = Field(default=None, validation_alias="REDIS_URL_SECRET_ARN")
    """Secrets Manager secret whose string is the Redis URL (ElastiCache AUTH token inside)."""
    redis_cluster: bool = False
    """OUTBOX_REDIS_CLUSTER: a Redis Cluster; the URL names any node or the configuration endpoint."""
    redis_iam_auth: bool = False
    """OUTBOX_REDIS_IAM_AUTH: log in to ElastiCache with an IAM auth token instead of a password; needs rediss://."""
    redis_iam_cache_name: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]{0,39}$")
    """OUTBOX_REDIS_IAM_CACHE_NAME: the replication group id or serverless cache name the token is for."""
    redis_iam_serverless: bool = False
    """OUTBOX_REDIS_IAM_SERVERLESS: the cache is an ElastiCache Serverless cache."""
    redis_socket_timeout_seconds: float = Field(default=5.0, gt=0, le=60, allow_inf_nan=False)
    redis_dedupe_ttl_seconds: int = Field(default=7 * 24 * 3600, ge=60, le=365 * 24 * 3600)
    """How long a published message id is remembered for idempotent re-publish, seconds."""
    # Redis reads the bound as a signed 64-bit integer and refuses every XADD with a larger one.
    redis_maxlen: int = Field(default=0, ge=0, le=2**63 - 1)
    """Stream length bound, 0 for none: approximate with OUTBOX_REDIS_TRIM=maxlen, hard with acknowledged."""
    redis_trim: RedisTrim = RedisTrim.MAXLEN
    redis_on_full: RedisOnFull = RedisOnFull.HOLD
    redis_format: RedisFormat = RedisFormat.FIELDS
    cloudevents_source: str = "/outbox-relay"
    """OUTBOX_CLOUDEVENTS_SOURCE: the CloudEvents `source` of every entry with OUTBOX_REDIS_FORMAT=cloudevents."""

    redis_wait_replicas: int = Field(default=0, ge=0, le=5)
    """Replicas that must acknowledge a batch's writes (WAIT) before it is recorded delivered."""
    redis_wait_timeout_ms: int = Field(default=1000, ge=1, le=60_000)
    """How long WAIT waits for those replicas, milliseconds (0, wait forever, is refused)."""
    redis_memory_high: float = Field(default=0.9, ge=0.5, le=1.0, allow_inf_nan=False)
    """The gate claims nothing while Redis uses this fraction of its maxmemory (unless it evicts every key)."""
    redis_oom_backoff_seconds: float = Field(default=10.0, ge=0, le=3600, allow_inf_nan=False)
    """After an OOM reply, no claim for this long (Redis not reporting maxmemory) or until below the mark."""

    @field_validator("cloudevents_source")
    @classmethod
    def _uri_reference(cls, v: str) -> str:
        # Consumers route on it: refuse what is not a URI reference rather than send it.
        if not _URI_REFERENCE.fullmatch(v):
            raise ValueError("must be a URI reference of 1-512 RFC 3986 characters (no spaces), e.g. "
                             "urn:shop:orders, https://shop.example/orders or /shop/orders")
        return v


RELATION_VARIABLES = ("REDIS_URL", "OUTBOX_REDIS_DEDUPE_TTL_SECONDS", "OUTBOX_REDIS_TRIM",
                      "OUTBOX_REDIS_WAIT_TIMEOUT_MS", "OUTBOX_REDIS_IAM_CACHE_NAME")


def check_settings(s: Any, relayed: bool) -> None:
    if relayed and s.redis_url is None and s.redis_url_secret_arn is None:
        raise ValueError("REDIS_URL: set REDIS_URL or REDIS_URL_SECRET_ARN for OUTBOX_CHANNEL=redis")
    if s.redis_url is not None:
        try:
            check_redis_url(s.redis_url, cluster=s.redis_cluster, iam=s.redis_iam_auth)
        except ValueError as exc:
            raise ValueError(f"REDIS_URL: {exc}") from None
    if relayed and s.redis_dedupe_ttl_seconds < s.lease_seconds + s.function_timeout_seconds:
        # A crashed invocation's message is published again within a lease and a timeout: its dedupe key must last.
        raise ValueError(
            f"OUTBOX_REDIS_DEDUPE_TTL_SECONDS ({s.redis_dedupe_ttl_seconds}s) must be at least "
            f"OUTBOX_LEASE_SECONDS + OUTBOX_FUNCTION_TIMEOUT_SECONDS ({s.lease_seconds:g}s + "
            f"{s.function_timeout_seconds:g}s), or a message published again after a crash is "
            "not recognised and lands in the stream twice"
        )
    if relayed and s.redis_iam_auth and not s.redis_iam_cache_name:
        raise ValueError("OUTBOX_REDIS_IAM_CACHE_NAME: OUTBOX_REDIS_IAM_AUTH=true signs its token for one cache: "
                         "set its replication group id or serverless cache name")
    if relayed and s.redis_trim is RedisTrim.ACKNOWLEDGED and s.redis_maxlen == 0:
        raise ValueError("OUTBOX_REDIS_TRIM: acknowledged trims a stream down to OUTBOX_REDIS_MAXLEN; "
                         "set OUTBOX_REDIS_MAXLEN above 0, or OUTBOX_REDIS_TRIM=maxlen")
    if relayed and s.redis_wait_replicas and s.redis_wait_timeout_ms / 1000.0 >= s.redis_socket_timeout_seconds:
        # WAIT replies after its timeout: a socket timeout first would make a slow replica a connection failure.
        raise ValueError(
            f"OUTBOX_REDIS_WAIT_TIMEOUT_MS ({s.redis_wait_timeout_ms} ms) must be shorter than "
            f"OUTBOX_REDIS_SOCKET_TIMEOUT_SECONDS ({s.redis_socket_timeout_seconds:g}s), or a replica "
            "that does not answer in time looks like Redis going away")
