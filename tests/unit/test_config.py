"""Configuration errors stop start-up and name the variable."""

import pytest

from outbox_relay.config import load_settings
from outbox_relay.errors import ConfigurationError

BASE = {"DATABASE_URL": "postgresql+pg8000://u@h/db", "REDIS_URL": "redis://127.0.0.1:6379/0"}


@pytest.fixture
def env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith(("OUTBOX_", "DATABASE_", "REDIS_")):
            monkeypatch.delenv(key)
    for k, v in BASE.items():
        monkeypatch.setenv(k, v)
    return monkeypatch


def test_defaults_are_valid(env):
    s = load_settings()
    assert s.batch_size == 500 and s.lease_seconds == 120 and s.channel.value == "redis"


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("OUTBOX_BATCH_SIZE", "0", "greater than or equal to 1"),
        ("OUTBOX_BATCH_SIZE", "lots", "valid integer"),
        ("OUTBOX_CHANNEL", "kafka", "redis"),
        ("OUTBOX_LEASE_SECONDS", "30", "must be longer than OUTBOX_FUNCTION_TIMEOUT_SECONDS"),
        ("OUTBOX_LEASE_SECONDS", "60", "must be longer than OUTBOX_FUNCTION_TIMEOUT_SECONDS"),
        ("OUTBOX_MAX_ATTEMPTS", "0", "greater than or equal to 1"),
        ("OUTBOX_BACKOFF_CAP_SECONDS", "0.5", "OUTBOX_BACKOFF_CAP_SECONDS"),
        ("DATABASE_URL", "mysql://u@h/db", "PostgreSQL"),
        ("REDIS_URL", "http://nope", "redis://"),
        ("DATABASE_TLS", "maybe", "verify-full"),
        ("OUTBOX_DEADLINE_MARGIN_SECONDS", "70", "must be shorter than OUTBOX_FUNCTION_TIMEOUT_SECONDS"),
        ("OUTBOX_BACKOFF_CAP_SECONDS", "inf", "finite"),
        ("OUTBOX_BACKOFF_CAP_SECONDS", "1e16", "less than or equal"),
        ("OUTBOX_BACKOFF_BASE_SECONDS", "nan", "finite"),
        ("OUTBOX_RETAIN_DELIVERED_SECONDS", "1e16", "less than or equal"),
        ("OUTBOX_SES_QUOTA_DEFERRAL_SECONDS", "1e12", "less than or equal"),
    ],
)
def test_bad_value_names_the_variable(env, variable, value, fragment):
    # Given one bad variable
    env.setenv(variable, value)
    # When settings are loaded at cold start
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    # Then the error names that variable and says what is wrong
    assert info.value.variable == variable
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"{variable}: ")


def test_missing_database_is_named(env):
    env.delenv("DATABASE_URL")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.variable == "DATABASE_URL"


def test_missing_redis_url_is_named_only_for_the_redis_channel(env):
    env.delenv("REDIS_URL")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.variable == "REDIS_URL"
    env.setenv("OUTBOX_CHANNEL", "ses")
    assert load_settings().channel.value == "ses"


def test_secret_arns_replace_urls(env):
    env.delenv("DATABASE_URL")
    env.delenv("REDIS_URL")
    env.setenv("DATABASE_SECRET_ARN", "arn:aws:secretsmanager:us-east-1:123456789012:secret:db")
    env.setenv("REDIS_URL_SECRET_ARN", "arn:aws:secretsmanager:us-east-1:123456789012:secret:redis")
    s = load_settings()
    assert s.database_url is None and s.database_secret_arn.endswith(":db")
