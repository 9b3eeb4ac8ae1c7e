"""Configuration errors stop start-up and name the variable."""

import pytest

from outbox_relay.config import load_maintenance_settings, load_settings
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


def test_a_channels_bad_value_names_its_variable_in_that_channels_function(env):
    # Given the SES relay, and a bad value of one of its variables
    env.setenv("OUTBOX_CHANNEL", "ses")
    env.setenv("OUTBOX_SES_QUOTA_DEFERRAL_SECONDS", "1e12")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.variable == "OUTBOX_SES_QUOTA_DEFERRAL_SECONDS" and "less than or equal" in str(info.value)


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


@pytest.mark.parametrize(("ttl", "lease", "timeout"), [("60", "75", "60"), ("133", "75", "59")])
def test_a_dedupe_ttl_shorter_than_the_lease_plus_the_timeout_is_refused(env, ttl, lease, timeout):
    # Given a dedupe TTL that would forget a message id before a crashed invocation's
    # lease expires and the next invocation publishes it again
    env.setenv("OUTBOX_REDIS_DEDUPE_TTL_SECONDS", ttl)
    env.setenv("OUTBOX_LEASE_SECONDS", lease)
    env.setenv("OUTBOX_FUNCTION_TIMEOUT_SECONDS", timeout)
    # When settings are loaded
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    # Then start-up stops, naming the TTL and the two variables it is measured against
    assert info.value.variable == "OUTBOX_REDIS_DEDUPE_TTL_SECONDS"
    assert "OUTBOX_LEASE_SECONDS" in info.value.problem and "OUTBOX_FUNCTION_TIMEOUT_SECONDS" in info.value.problem


def test_a_dedupe_ttl_of_the_lease_plus_the_timeout_is_enough_and_only_the_redis_relay_needs_it(env):
    env.setenv("OUTBOX_REDIS_DEDUPE_TTL_SECONDS", "135")
    env.setenv("OUTBOX_LEASE_SECONDS", "75")
    assert load_settings().redis_dedupe_ttl_seconds == 135
    env.setenv("OUTBOX_REDIS_DEDUPE_TTL_SECONDS", "60")
    env.setenv("OUTBOX_CHANNEL", "ses")
    assert load_settings().channel.value == "ses"
    env.setenv("OUTBOX_CHANNEL", "redis")
    assert "redis_dedupe_ttl_seconds" not in type(load_maintenance_settings()).model_fields


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis://127.0.0.1:6379/notadb", "database"),
        ("redis://127.0.0.1:6379/-1", "database"),
        ("redis://127.0.0.1:6379/0/1", "database"),
        ("redis://127.0.0.1:6379/0?db=x", "db"),
        ("unix:///tmp/redis.sock?db=x", "db"),
        ("redis://127.0.0.1:abc/0", "port"),
        ("rediss://127.0.0.1:99999/0", "port"),
        ("unix://", "socket"),
    ],
)
def test_a_redis_url_that_would_connect_elsewhere_is_refused(env, url, fragment):
    # Given a Redis URL redis-py would silently read as another database (or not at all)
    env.setenv("REDIS_URL", url)
    # Then start-up stops naming REDIS_URL and what is wrong in it
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.variable == "REDIS_URL" and fragment in info.value.problem, info.value


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379", "redis://127.0.0.1:6379/", "redis://127.0.0.1/3",
                                 "rediss://user:p%40ss@cache.example:6380/0", "unix:///tmp/redis.sock",
                                 "unix:///tmp/redis.sock?db=2"])
def test_usable_redis_urls_are_accepted(env, url):
    env.setenv("REDIS_URL", url)
    assert load_settings().redis_url == url


def test_a_stream_trim_beyond_what_xadd_accepts_is_refused(env):
    # Redis takes MAXLEN as a signed 64-bit integer; anything larger fails every publish
    env.setenv("OUTBOX_REDIS_MAXLEN", "99999999999999999999999")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.variable == "OUTBOX_REDIS_MAXLEN" and "9223372036854775807" in info.value.problem
    env.setenv("OUTBOX_REDIS_MAXLEN", str(2**63 - 1))
    assert load_settings().redis_maxlen == 2**63 - 1


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("postgresqlgarbage", "not a SQLAlchemy URL"),
        ("postgresql+pg8000://u@h:abc/db", "port"),
        ("postgresql+pg8000://u@h:99999/db", "port"),
        ("postgresql+psycopg2://u@h/db", "driver must be postgresql+pg8000"),
        ("mysql://u@h/db", "driver must be postgresql+pg8000"),
    ],
)
def test_a_database_url_is_checked_by_one_rule(env, url, fragment):
    env.setenv("DATABASE_URL", url)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.variable == "DATABASE_URL" and fragment in info.value.problem, info.value


@pytest.mark.parametrize("scheme", ["postgresql+pg8000", "postgresql", "postgres"])
def test_every_postgresql_scheme_is_accepted_by_the_relay_and_the_command_line(env, scheme):
    from outbox_relay.db import base_url
    from outbox_tools.cli.common import database_url

    # Given a DATABASE_URL with any of the PostgreSQL schemes
    env.setenv("DATABASE_URL", f"{scheme}://u:pw@db.example:5433/shop")
    # Then the relay's settings, the relay's engine URL and the command line all take it, as pg8000
    settings = load_settings()
    assert base_url(settings).render_as_string(hide_password=False) == "postgresql+pg8000://u:pw@db.example:5433/shop"
    assert database_url() == "postgresql+pg8000://u:pw@db.example:5433/shop"


@pytest.mark.parametrize(
    ("variables", "named", "fragment"),
    [
        ({"OUTBOX_REDIS_TRIM": "acknowledged"}, "OUTBOX_REDIS_TRIM", "OUTBOX_REDIS_MAXLEN above 0"),
        ({"OUTBOX_REDIS_TRIM": "oldest"}, "OUTBOX_REDIS_TRIM", "maxlen"),
        ({"OUTBOX_REDIS_ON_FULL": "drop"}, "OUTBOX_REDIS_ON_FULL", "hold"),
        ({"OUTBOX_REDIS_WAIT_REPLICAS": "1", "OUTBOX_REDIS_WAIT_TIMEOUT_MS": "5000"},
         "OUTBOX_REDIS_WAIT_TIMEOUT_MS", "OUTBOX_REDIS_SOCKET_TIMEOUT_SECONDS"),
        ({"OUTBOX_REDIS_WAIT_TIMEOUT_MS": "0"}, "OUTBOX_REDIS_WAIT_TIMEOUT_MS", "greater than or equal to 1"),
        ({"OUTBOX_REDIS_WAIT_REPLICAS": "-1"}, "OUTBOX_REDIS_WAIT_REPLICAS", "greater than or equal to 0"),
        ({"OUTBOX_REDIS_MEMORY_HIGH": "1.5"}, "OUTBOX_REDIS_MEMORY_HIGH", "less than or equal to 1"),
    ],
)
def test_bad_redis_durability_and_trimming_settings_name_their_variable(env, variables, named, fragment):
    for k, v in variables.items():
        env.setenv(k, v)
    with pytest.raises(ConfigurationError) as exc:
        load_settings()
    assert exc.value.variable == named and fragment in exc.value.problem and "\n" not in str(exc.value)


def test_redis_durability_and_trimming_settings_are_read(env):
    for k, v in {"OUTBOX_REDIS_TRIM": "acknowledged", "OUTBOX_REDIS_MAXLEN": "1000", "OUTBOX_REDIS_ON_FULL": "trim",
                 "OUTBOX_REDIS_WAIT_REPLICAS": "1", "OUTBOX_REDIS_WAIT_TIMEOUT_MS": "250"}.items():
        env.setenv(k, v)
    s = load_settings()
    assert (s.redis_trim.value, s.redis_maxlen, s.redis_on_full.value, s.redis_wait_replicas,
            s.redis_wait_timeout_ms) == ("acknowledged", 1000, "trim", 1, 250)


def test_the_redis_publisher_is_built_with_the_durability_and_trimming_settings(env):
    from outbox_relay.runtime import build_publisher

    for k, v in {"OUTBOX_REDIS_TRIM": "acknowledged", "OUTBOX_REDIS_MAXLEN": "1000", "OUTBOX_REDIS_WAIT_REPLICAS": "2",
                 "OUTBOX_REDIS_WAIT_TIMEOUT_MS": "250", "OUTBOX_REDIS_MEMORY_HIGH": "0.8"}.items():
        env.setenv(k, v)
    publisher = build_publisher(load_settings())
    assert (publisher.trimming, publisher.maxlen, publisher.wait_replicas, publisher.wait_timeout_ms,
            publisher.memory_high) == ("hold", 1000, 2, 250, 0.8)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [("redis://127.0.0.1:6379/1", "database 0 only"), ("unix:///tmp/redis.sock", "not a unix:// socket")],
)
def test_a_cluster_url_with_another_database_or_a_socket_is_refused(env, url, fragment):
    env.setenv("OUTBOX_REDIS_CLUSTER", "true")
    env.setenv("REDIS_URL", url)
    with pytest.raises(ConfigurationError) as exc:
        load_settings()
    assert exc.value.variable == "REDIS_URL" and fragment in exc.value.problem


def test_a_cluster_url_of_a_node_is_accepted(env):
    env.setenv("OUTBOX_REDIS_CLUSTER", "true")
    env.setenv("REDIS_URL", "rediss://relay:secret@clustercfg.example.cache.amazonaws.com:6379")
    assert load_settings().redis_cluster is True


#: The issue's repro: a short lease, with the timeout and margin that fit it.
SHORT_LEASE = {"OUTBOX_LEASE_SECONDS": "3", "OUTBOX_FUNCTION_TIMEOUT_SECONDS": "2", "OUTBOX_DEADLINE_MARGIN_SECONDS": "1"}


@pytest.mark.parametrize("mode", ["batch", "drain"])
def test_latency_only_settings_do_not_refuse_a_batch_or_drain_relay(env, mode):
    # Given a relay without pollers, a 3 s lease and the poller TTL's default of 5 s, and a successor lead
    for k, v in {**SHORT_LEASE, "OUTBOX_MODE": mode, "OUTBOX_SUCCESSOR_LEAD_SECONDS": "10", "OUTBOX_POLLERS": "3",
                 "OUTBOX_POLLERS_MAX": "2"}.items():
        env.setenv(k, v)
    # Then it starts: neither setting is read in this mode
    s = load_settings()
    assert (s.mode.value, s.lease_seconds, s.poller_ttl_seconds) == (mode, 3, 5)


@pytest.mark.parametrize(("extra", "variable", "fragment"), [
    ({}, "OUTBOX_POLLER_TTL_SECONDS", "must be shorter than OUTBOX_LEASE_SECONDS (3s)"),
    ({"OUTBOX_POLLER_TTL_SECONDS": "2", "OUTBOX_SUCCESSOR_LEAD_SECONDS": "10"}, "OUTBOX_SUCCESSOR_LEAD_SECONDS",
     "at most half"),
    ({"OUTBOX_POLLER_TTL_SECONDS": "2", "OUTBOX_POLLERS": "3", "OUTBOX_POLLERS_MAX": "2"}, "OUTBOX_POLLERS_MAX",
     "must be at least OUTBOX_POLLERS (3)"),
])
def test_latency_only_settings_are_checked_in_latency_mode(env, extra, variable, fragment):
    for k, v in {**SHORT_LEASE, "OUTBOX_MODE": "latency", **extra}.items():
        env.setenv(k, v)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.variable == variable and fragment in str(info.value)


@pytest.mark.parametrize(("variable", "value"), [
    ("OUTBOX_BATCH_SIZE", "5.0"), ("OUTBOX_BATCH_SIZE", " 5 "), ("OUTBOX_BATCH_SIZE", "5_0"),
    ("OUTBOX_BATCH_SIZE", "+5"), ("OUTBOX_MAX_ATTEMPTS", "1e1"), ("DATABASE_POOL_SIZE", "2.0"),
    ("OUTBOX_LEASE_SECONDS", " 130"), ("OUTBOX_LEASE_SECONDS", "1_30"), ("OUTBOX_POLLERS_MAX", "2.0"),
    ("OUTBOX_POLLERS", "0"),
])
def test_a_number_is_taken_only_as_written(env, variable, value):
    env.setenv(variable, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.variable == variable and "\n" not in str(info.value)


def test_numbers_written_plainly_are_read(env):
    for k, v in {"OUTBOX_BATCH_SIZE": "5", "OUTBOX_LEASE_SECONDS": "130.5", "OUTBOX_BACKOFF_CAP_SECONDS": "1e3"}.items():
        env.setenv(k, v)
    s = load_settings()
    assert (s.batch_size, s.lease_seconds, s.backoff_cap_seconds) == (5, 130.5, 1000)


@pytest.mark.parametrize(("variable", "says"), [
    ("OUTBOX_BATCH_SIZ", "did you mean OUTBOX_BATCH_SIZE?"),
    ("OUTBOX_LEASE", "did you mean OUTBOX_LEASE_SECONDS?"),
    ("outbox_ordering_on_death", "did you mean OUTBOX_ORDERING_ON_DEAD?"),
    ("OUTBOX_TURBO", "docs/configuration.md lists them"),
])
def test_an_outbox_variable_no_setting_reads_is_refused_naming_the_closest(env, variable, says):
    env.setenv(variable, "1")
    for load in (load_settings, load_maintenance_settings):
        with pytest.raises(ConfigurationError) as info:
            load()
        assert info.value.variable == variable
        assert str(info.value) == f"{variable}: is not a setting ({says}); rename or remove it"


def test_the_projects_other_outbox_variables_are_not_settings_and_not_refused(env):
    # The `outbox` command's servers, and the test suite's own
    for k, v in {"OUTBOX_SERVERS": "embedded", "OUTBOX_TEST_PGBOUNCER": "/usr/sbin/pgbouncer",
                 "outbox_batch_size": "7"}.items():
        env.setenv(k, v)
    assert load_settings().batch_size == 7
