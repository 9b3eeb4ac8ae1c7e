"""ElastiCache IAM authentication (OUTBOX_REDIS_IAM_AUTH): the token is a SigV4-presigned
`connect` request for the cache, without its scheme, renewed before it expires; the
settings refuse what ElastiCache would refuse at connect."""

from __future__ import annotations

from urllib.parse import parse_qs

import botocore.session
import pytest

from outbox_relay.config import load_settings
from outbox_relay.errors import ConfigurationError
from outbox_relay.publishers.redis.client import ElastiCacheIamCredentials

BASE = {"DATABASE_URL": "postgresql+pg8000://u@h/db", "REDIS_URL": "rediss://relay-user@cache.example.com:6379",
        "OUTBOX_REDIS_IAM_AUTH": "true", "OUTBOX_REDIS_IAM_CACHE_NAME": "orders-cache"}


@pytest.fixture
def env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith(("OUTBOX_", "DATABASE_", "REDIS_", "AWS_")):
            monkeypatch.delenv(key)
    for k, v in BASE.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    return monkeypatch


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("serverless", [False, True])
def test_the_token_is_a_presigned_connect_request_for_the_cache(env, serverless):
    clock = Clock()
    provider = ElastiCacheIamCredentials("relay-user", "orders-cache", "eu-west-1", serverless=serverless,
                                         session=botocore.session.get_session(), clock=clock)
    signed: list[str] = []
    sign = provider._sign
    provider._sign = lambda: signed.append(sign()) or signed[-1]
    user, token = provider.get_credentials()
    host, _, query = token.partition("/?")
    params = {k: v[0] for k, v in parse_qs(query).items()}
    assert user == "relay-user" and host == "orders-cache" and not token.startswith("https://")
    assert params["Action"] == "connect" and params["User"] == "relay-user"
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256" and params["X-Amz-Expires"] == "900"
    assert params["X-Amz-Credential"].startswith("AKIDEXAMPLE/") and "/eu-west-1/elasticache/" in params[
        "X-Amz-Credential"]
    assert ("ResourceType" in params) is serverless and len(params["X-Amz-Signature"]) == 64
    # The same token while it is fresh; signed again once it is 10 minutes old
    clock.now = 599
    assert provider.get_credentials()[1] == token and len(signed) == 1
    clock.now = 601
    provider.get_credentials()
    assert len(signed) == 2


def test_the_relay_builds_its_client_with_the_token(env):
    from outbox_relay.runtime import build_publisher

    env.setenv("AWS_REGION", "eu-west-1")
    publisher = build_publisher(load_settings())
    provider = publisher.client.connection_pool.connection_kwargs["credential_provider"]
    assert isinstance(provider, ElastiCacheIamCredentials)
    assert (provider.user, provider.cache_name, provider.region) == ("relay-user", "orders-cache", "eu-west-1")


@pytest.mark.parametrize(
    ("variable", "value", "named", "fragment"),
    [
        ("OUTBOX_REDIS_IAM_CACHE_NAME", None, "OUTBOX_REDIS_IAM_CACHE_NAME", "replication group id"),
        ("OUTBOX_REDIS_IAM_CACHE_NAME", "Not A Name", "OUTBOX_REDIS_IAM_CACHE_NAME", "pattern"),
        ("REDIS_URL", "redis://relay-user@cache.example.com:6379", "REDIS_URL", "only over TLS"),
        ("REDIS_URL", "rediss://cache.example.com:6379", "REDIS_URL", "user's id"),
        ("OUTBOX_REDIS_IAM_SERVERLESS", "perhaps", "OUTBOX_REDIS_IAM_SERVERLESS", "true or false"),
    ],
)
def test_iam_settings_that_cannot_work_are_refused_naming_the_variable(env, variable, value, named, fragment):
    if value is None:
        env.delenv(variable)
    else:
        env.setenv(variable, value)
    with pytest.raises(ConfigurationError) as exc:
        load_settings()
    assert exc.value.variable == named and fragment in exc.value.problem


def test_without_a_region_the_token_cannot_be_signed(env):
    from outbox_relay.runtime import build_publisher

    with pytest.raises(ConfigurationError) as exc:
        build_publisher(load_settings())
    assert exc.value.variable == "AWS_DEFAULT_REGION"
