"""Fixtures shared by every test layer.

Servers are found like `outbox demo` finds them (DATABASE_URL / REDIS_URL,
then the local services on their standard ports, then embedded servers from
pip). Each test gets a migrated database with an empty outbox (the test
process's own, cloned once from a migrated template and emptied before each
test) and its own Redis key prefix; both are removed at the end.
"""

from __future__ import annotations

import itertools
import os
import uuid
from typing import Iterator

import pytest
import redis as redis_lib
from hypothesis import settings as hypothesis_settings
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from outbox_migrations import upgrade
from outbox_relay import runtime
from outbox_tools.servers import Servers, create_database, drop_database, find_servers, with_database
from support.rows import EMPTY

# Property tests judge results, not speed: no per-example deadline (2 shared cores).
hypothesis_settings.register_profile("outbox", deadline=None)
hypothesis_settings.load_profile("outbox")

RUN_ID = uuid.uuid4().hex[:8]
_counter = itertools.count()


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    found = find_servers()
    yield found
    found.close()


@pytest.fixture(scope="session")
def template_db(servers: Servers) -> Iterator[str]:
    """A migrated database that every test's database is cloned from."""
    name = f"outbox_test_{RUN_ID}_tpl"
    drop_database(servers.database_url, name)
    create_database(servers.database_url, name)
    engine = create_engine(with_database(servers.database_url, name), poolclass=NullPool)
    upgrade(engine)
    engine.dispose()
    yield name
    drop_database(servers.database_url, name)


@pytest.fixture(scope="session")
def reused_db(servers: Servers, template_db: str) -> Iterator[str]:
    """This process's test database, cloned once from the template and emptied
    before each test (cloning a database per test cost most of the run)."""
    name = f"outbox_test_{RUN_ID}_{os.getpid()}"
    admin = create_engine(servers.database_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"'))
    admin.dispose()
    yield name
    drop_database(servers.database_url, name)



@pytest.fixture
def database_url(servers: Servers, reused_db: str) -> Iterator[str]:
    """URL of a migrated database with an empty outbox, for this test only: no
    connection of an earlier test is left on it."""
    url = with_database(servers.database_url, reused_db)
    admin = create_engine(servers.database_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": reused_db})
    admin.dispose()
    engine = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as conn:
        conn.execute(text("SET lock_timeout = '10s'"))
        conn.execute(EMPTY)
    engine.dispose()
    yield url


@pytest.fixture
def empty_database_url(servers: Servers) -> Iterator[str]:
    """URL of a fresh database with no schema at all (for migrations), this test's only."""
    name = f"outbox_test_{RUN_ID}_{os.getpid()}_{next(_counter)}_empty"
    create_database(servers.database_url, name)
    yield with_database(servers.database_url, name)
    drop_database(servers.database_url, name)


@pytest.fixture
def app_engine(database_url: str) -> Iterator[Engine]:
    """An engine as an application would use it (transactions, for the producer API)."""
    engine = create_engine(database_url, poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def relay_engine(database_url: str) -> Iterator[Engine]:
    """The relay's own engine (`db.create_relay_engine`: autocommit, its pool and listeners)."""
    from outbox_relay.config import load_settings
    from outbox_relay.db import create_relay_engine

    engine = create_relay_engine(load_settings(database_url=database_url, redis_url="redis://unused:6379/0",
                                               database_pool_size=4))
    yield engine
    engine.dispose()


def _delete_matching(client: redis_lib.Redis, prefix: str) -> None:
    for pattern in (f"{prefix}*", f"{{{prefix}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])


@pytest.fixture(scope="session")
def _redis_sweep(servers: Servers) -> Iterator[None]:
    """After the run, remove every key this run created, whichever test made it."""
    yield
    client = redis_lib.Redis.from_url(servers.redis_url)
    _delete_matching(client, f"t{RUN_ID}")
    client.close()


@pytest.fixture
def redis_prefix(servers: Servers, _redis_sweep: None) -> Iterator[str]:
    """A key prefix of this test's own; stream names in the test start with it.
    Its keys (streams and `{prefix…}` dedupe keys) are deleted after the test."""
    prefix = f"t{RUN_ID}{os.getpid()}x{next(_counter)}."
    yield prefix
    client = redis_lib.Redis.from_url(servers.redis_url)
    _delete_matching(client, prefix)
    client.close()


@pytest.fixture
def redis_client(servers: Servers, redis_prefix: str) -> Iterator[redis_lib.Redis]:
    client = redis_lib.Redis.from_url(servers.redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def relay_env(monkeypatch: pytest.MonkeyPatch, database_url: str, servers: Servers) -> Iterator[None]:
    """Environment for the real handler on this test's database and Redis."""
    for key in list(os.environ):
        if key.startswith("OUTBOX_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", servers.redis_url)
    monkeypatch.setenv("OUTBOX_CHANNEL", "redis")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "OutboxRelayTest")
    monkeypatch.delenv("DATABASE_SECRET_ARN", raising=False)
    monkeypatch.delenv("REDIS_URL_SECRET_ARN", raising=False)
    runtime.reset()
    yield
    runtime.reset()


#: The slowest tests of the default run whose behaviour a quicker test there also covers: they run
#: under `-m slow` (.ci/run runs it), so the README's test command stays within its three minutes.
SLOW_VARIANTS = frozenset({
    "tests/integration/test_flow_faults.py::test_a_latency_poller_rides_through_a_lost_database",
    "tests/integration/test_flow_faults.py::test_batch_and_drain_still_fail_fast_without_the_database",
    "tests/integration/test_flow_faults.py::test_drain_goes_on_past_batches_cut_by_the_byte_budget",
    "tests/integration/test_ordering_model.py::test_per_key_order_holds_under_any_interleaving[skip]",
    "tests/integration/test_handover.py::test_a_dead_pollers_leases_are_taken_over_at_once_and_delivered",
    "tests/integration/test_handover.py::test_a_poller_near_its_deadline_starts_its_successor_through_lambda",
    "tests/integration/test_handover.py::test_a_poller_that_cannot_start_its_successor_says_so_and_goes_on",
    "tests/integration/test_ses_errors.py::test_message_level_error_classes",
    "tests/e2e/test_handler_modes.py::test_latency_mode_delivers_what_is_committed_while_it_runs",
    "tests/bench/test_lambda_model.py::test_invokes_beyond_the_reserved_concurrency_are_throttled_retried_and_dropped",
    "tests/integration/test_claim_plan.py::test_an_outcome_write_reads_its_values_once_when_most_rows_are_leased",
    "tests/integration/test_ses_rate.py::test_claim_is_bounded_by_what_the_rate_allows_before_the_deadline",
    "tests/integration/test_ordering.py::test_eight_relays_at_once_keep_each_keys_order[drain]",
    "tests/integration/test_redis_replication.py::"
    "test_a_batch_the_replica_did_not_acknowledge_is_released_and_published_once_later",
    "tests/integration/test_concurrency.py::test_eight_threads_deliver_each_message_once[drain]",
})


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.nodeid in SLOW_VARIANTS:
            item.add_marker(pytest.mark.slow)
