"""Integration fixtures: the real lease store and Redis publisher on this test's database and prefix."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest
import redis as redis_lib
from sqlalchemy import text

from outbox_relay.backoff import Backoff
from outbox_relay.loop import RelayLoop, RelayPolicy
from outbox_relay.models import Mode
from outbox_relay.producer import enqueue_events_bulk
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore
from support.deadline import until_idle
from support.feedback import feedback_handler  # noqa: F401 (fixture)
from support.network import tcp_redis  # noqa: F401 (fixture)
from support.ses import aws_env, enqueue_mail, moto_ses, ses, ses_server, ses_store  # noqa: F401 (fixtures)


@pytest.fixture
def store(relay_engine) -> LeaseStore:
    return LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=3, error_max_chars=300)


@pytest.fixture
def publisher(servers) -> RedisStreamsPublisher:
    client = redis_lib.Redis.from_url(servers.redis_url)
    yield RedisStreamsPublisher(client, dedupe_ttl_seconds=3600)
    client.close()


@pytest.fixture
def policy() -> RelayPolicy:
    return RelayPolicy(batch_size=100, lease_seconds=30,
                       backoff=Backoff(base=10, cap=60, floor=5), throttle_delay_seconds=2)


@pytest.fixture
def plenty() -> Deadline:
    return Deadline(lambda: 60_000, margin_seconds=5)


@pytest.fixture(params=[Mode.BATCH, Mode.DRAIN, pytest.param(Mode.LATENCY, marks=pytest.mark.slow)],
                ids=lambda m: m.value)
def mode(request) -> Mode:
    """Every invocation mode: a test taking it runs once per mode. The latency-mode
    runs wait out their invocation (1.5 s each), so they are slow; the default run
    covers latency mode end to end in tests/e2e/test_handler_modes.py."""
    return request.param


@pytest.fixture
def invoke(mode):
    """invoke(store, publisher, policy, owner, deadline=None) -> Summary: one invocation in `mode`
    (latency: until 1.5 s after its last claim that found messages, polling every 50 ms;
    others: `deadline` or plenty)."""

    def _invoke(store, publisher, policy, owner, deadline: Deadline | None = None):
        progress = None
        if deadline is None:
            deadline, progress = until_idle() if mode is Mode.LATENCY else (Deadline(lambda: 600_000, 1), None)
        return RelayLoop(store, publisher,
                         dataclasses.replace(policy, mode=mode, poll_interval_seconds=0.05,
                                             poll_max_interval_seconds=0.05), deadline, owner,
                         on_progress=progress).run()

    return _invoke


@pytest.fixture
def enqueue(app_engine, redis_prefix) -> Callable[..., list]:
    """enqueue(n, stream="s", **fields) -> ids; stream names get this test's prefix."""

    def _enqueue(n: int = 1, stream: str = "events", **fields: Any) -> list:
        msgs = [dict(stream=redis_prefix + stream, type=fields.get("type", "thing.happened"),
                     payload=fields.get("payload", {"n": i}),
                     **{k: v for k, v in fields.items() if k not in ("type", "payload")})
                for i in range(n)]
        with app_engine.begin() as conn:
            return enqueue_events_bulk(conn, msgs)

    return _enqueue


@pytest.fixture
def rows(app_engine) -> Callable[[], list[dict]]:
    """rows() -> every outbox row with its body's payload and headers, as a dict,
    ordered by seq, with `due` = available_at <= now()."""

    def _rows() -> list[dict]:
        with app_engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text(
                "SELECT o.*, b.payload, b.headers, available_at <= now() AS due, "
                "EXTRACT(EPOCH FROM available_at - now())::float8 AS due_in, "
                "EXTRACT(EPOCH FROM lease_expires_at - now())::float8 AS lease_left "
                "FROM outbox_message o JOIN outbox_message_body b ON b.seq = o.seq AND b.message_id = o.message_id "
                "ORDER BY o.seq"))]

    return _rows


@pytest.fixture
def expire_leases(app_engine) -> Callable[[], None]:
    """Move every lease into the past, by the database clock (instead of sleeping)."""

    def _expire() -> None:
        with app_engine.begin() as conn:
            conn.execute(text("UPDATE outbox_message SET lease_expires_at = now() - interval '1 second' "
                              "WHERE status = 'leased'"))

    return _expire
