"""The contract suite's fixtures: `harness`, one per channel harness
(`support.channel_harnesses`), on this test's database and Redis prefix."""

from __future__ import annotations

import os
from typing import Any

import pytest

from outbox_relay.publishers.base import Deadline
from outbox_relay.store import LeaseStore
from support.aws_harness import aws_endpoint, moto_server  # noqa: F401 (fixtures)
from support.channel_harnesses import HARNESSES
from support.network import tcp_redis  # noqa: F401 (fixture)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a harness passes reaches `load_settings`: no OUTBOX_* of the machine's."""
    for key in list(os.environ):
        if key.startswith("OUTBOX_") or key in ("REDIS_URL", "DATABASE_URL"):
            monkeypatch.delenv(key)


# A harness that says `slow` runs under `-m slow` only, so the default run stays quick (decision 0043).
@pytest.fixture(params=[pytest.param(name, marks=[pytest.mark.slow] if h.slow else [])
                        for name, h in HARNESSES.items()])
def harness(request, clean_env) -> Any:
    # Each harness asks for the fixtures its downstream needs only (no moto for Redis, no Redis for SES).
    return HARNESSES[request.param].make(request)


@pytest.fixture
def store(harness, relay_engine) -> LeaseStore:
    return LeaseStore(relay_engine, harness.channel, default_max_attempts=3, error_max_chars=300)


@pytest.fixture
def plenty() -> Deadline:
    return Deadline(lambda: 60_000, margin_seconds=5)
