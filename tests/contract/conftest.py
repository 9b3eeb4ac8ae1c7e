"""The contract suite's fixtures: `harness`, one per channel harness
(`support.channel_harnesses`), on this test's database and Redis prefix."""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest

from outbox_relay.publishers.base import Deadline
from outbox_relay.store import LeaseStore
from support.channel_harnesses import HARNESSES, FakeHarness, RedisHarness, SesHarness
from support.network import tcp_redis  # noqa: F401 (fixture)
from support.ses import aws_env, ses  # noqa: F401 (fixtures)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a harness passes reaches `load_settings`: no OUTBOX_* of the machine's."""
    for key in list(os.environ):
        if key.startswith("OUTBOX_") or key in ("REDIS_URL", "DATABASE_URL"):
            monkeypatch.delenv(key)


# SES on moto costs most per test; the default run keeps Redis and the fake (moto's SES
# is covered there by tests/integration/test_ses_*.py), `-m slow` runs SES too (decision 0043).
@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.slow) if name == "ses" else name
                        for name in HARNESSES])
def harness(request, clean_env, app_engine, database_url) -> Iterator[Any]:
    # Each harness takes only the fixtures its downstream needs (no moto for Redis, no Redis for SES).
    if request.param == "redis":
        yield RedisHarness(app_engine, database_url, request.getfixturevalue("redis_client"),
                           request.getfixturevalue("redis_prefix"), request.getfixturevalue("tcp_redis"))
    elif request.param == "ses":
        request.getfixturevalue("ses")
        yield SesHarness(app_engine, database_url)
    else:
        yield FakeHarness(app_engine)


@pytest.fixture
def store(harness, relay_engine) -> LeaseStore:
    return LeaseStore(relay_engine, harness.channel, default_max_attempts=3, error_max_chars=300)


@pytest.fixture
def plenty() -> Deadline:
    return Deadline(lambda: 60_000, margin_seconds=5)
