"""The Redis client: one node or a cluster, TLS and AUTH from the URL, one retry, ElastiCache IAM tokens."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable
from urllib.parse import urlencode

import redis
from redis.backoff import ExponentialBackoff
from redis.credentials import CredentialProvider
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from ...errors import ConfigurationError


class ElastiCacheIamCredentials(CredentialProvider):
    """ElastiCache IAM auth: as the password, a presigned `connect` request valid 15 minutes, renewed after 10."""

    VALID_SECONDS = 900
    RENEW_AFTER_SECONDS = 600

    def __init__(self, user: str, cache_name: str, region: str, *, serverless: bool = False,
                 session: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.user, self.cache_name, self.region, self.serverless = user, cache_name, region, serverless
        self._session = session
        self._clock = clock
        self._token: str | None = None
        self._signed_at = 0.0
        self._lock = threading.Lock()

    def get_credentials(self) -> tuple[str, str]:
        with self._lock:
            if self._token is None or self._clock() - self._signed_at >= self.RENEW_AFTER_SECONDS:
                self._token = self._sign()
                self._signed_at = self._clock()
            return self.user, self._token

    def _sign(self) -> str:
        import botocore.session
        from botocore.model import ServiceId
        from botocore.signers import RequestSigner

        session = self._session or botocore.session.get_session()
        credentials = session.get_credentials()
        if credentials is None:
            raise RedisConnectionError("no AWS credentials to sign the ElastiCache IAM token")
        signer = RequestSigner(ServiceId("elasticache"), self.region, "elasticache", "v4", credentials,
                               session.get_component("event_emitter"))
        query = {"Action": "connect", "User": self.user}
        if self.serverless:
            query["ResourceType"] = "ServerlessCache"
        url = f"https://{self.cache_name}/?{urlencode(query)}"
        signed = signer.generate_presigned_url(
            {"method": "GET", "url": url, "body": {}, "headers": {}, "context": {}},
            operation_name="connect", expires_in=self.VALID_SECONDS, region_name=self.region)
        # The signer needs a scheme; ElastiCache takes the request without it.
        return signed.removeprefix("https://")


def create_redis_client(url: str, *, socket_timeout_seconds: float = 5.0, cluster: bool = False,
                        credential_provider: Any = None) -> Any:
    """One retry on a new connection (one may die while the container is frozen): the script is idempotent."""
    options = dict(
        socket_timeout=socket_timeout_seconds,
        socket_connect_timeout=socket_timeout_seconds,
        # No health check: the pooled connection is always idle, and the gate's INFO checks it anyway.
        health_check_interval=0,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.1), retries=1),
    )
    if credential_provider is not None:
        options["credential_provider"] = credential_provider
    if cluster:
        from redis.cluster import RedisCluster
        from redis.exceptions import RedisClusterException

        def make() -> Any:
            try:
                return RedisCluster.from_url(url, **options)
            except RedisClusterException as exc:
                # A node that is not in a cluster is a setting to fix, not an outage.
                if "cluster mode is not enabled" in str(exc).lower():
                    raise ConfigurationError("OUTBOX_REDIS_CLUSTER", "the Redis at REDIS_URL is not in cluster "
                                             "mode: set OUTBOX_REDIS_CLUSTER=false, or name a node of the "
                                             "cluster") from None
                raise

        try:
            return make()
        except RedisClusterException:
            return ClusterOnFirstUse(make)
    return redis.Redis.from_url(url, **options)


class ClusterOnFirstUse:
    """A cluster unreachable at cold start closes the gate until it answers instead of failing the container."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Any = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make()
        return getattr(self._client, name)
