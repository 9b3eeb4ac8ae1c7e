"""The Redis client the relay talks through: one node or a cluster, TLS and AUTH
from the URL, retries on connection errors, and ElastiCache IAM auth tokens."""

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
    """ElastiCache IAM authentication (ElastiCache User Guide, "Authenticating with
    IAM"): the IAM-enabled user's id, and as its password a SigV4-presigned
    `connect` request for the cache, valid 15 minutes. Redis asks for it only when a
    connection opens; a new token is signed once the last is 10 minutes old."""

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
    """A client for `redis://` or `rediss://` (TLS, certificate verified) URLs,
    with AUTH from the URL, as ElastiCache in-transit encryption needs; with
    `cluster`, redis-py's cluster client (`RedisCluster`), the URL naming any node
    or the configuration endpoint.

    A failed command is retried once on a new connection after 0.1 s (a
    connection that died while the container was frozen); re-sending the
    publish script is safe because it is idempotent. `socket_timeout_seconds`
    bounds connect and each reply, in seconds.
    """
    options = dict(
        socket_timeout=socket_timeout_seconds,
        socket_connect_timeout=socket_timeout_seconds,
        # No idle health check: a scheduled invocation always finds the pooled
        # connection idle, so redis-py would add a PING round trip before the
        # gate's own INFO, which already checks the connection (a dead one fails
        # it and is retried once on a new connection, below).
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
    """A cluster client made when first used. redis-py's asks a node for the slot map
    as it is made; a cluster unreachable at cold start must close the gate, as one
    node would, not fail the container: until it answers, every use raises
    `RedisClusterException` (the gate's "redis unavailable") and tries again."""

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
