"""The migration function (functions/migrate/app.py) in-process, on the
custom resource samples in events/: the schema in PostgreSQL afterwards and the
response CloudFormation would get, as received by a local HTTP server.
tests/sam_local runs the same samples in a Lambda container."""

from __future__ import annotations

import json
import os
import threading
from typing import Iterator

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from outbox_migrations import UPGRADE_LOCK_KEY, current_revision, custom_resource, head_revision, upgrade
from outbox_tools.cfn_response import ResponseServer
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from outbox_tools.servers import with_database

EVENTS = project_root() / "events"
TABLES = {"outbox_message", "outbox_message_body", "outbox_alembic_version"}


def sample(name: str, response_url: str) -> dict:
    event = json.loads((EVENTS / f"migrate-{name}.json").read_text())
    return {**event, "ResponseURL": response_url}


def tables(url: str) -> set[str]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        return set(inspect(engine).get_table_names()) & TABLES
    finally:
        engine.dispose()


def revision(url: str) -> str | None:
    engine = create_engine(url, poolclass=NullPool)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


@pytest.fixture
def cfn() -> Iterator[ResponseServer]:
    with ResponseServer() as server:
        yield server


@pytest.fixture
def migrate_env(monkeypatch, empty_database_url):
    """The migration function's environment: the database settings only."""
    for key in list(os.environ):
        if key.startswith(("OUTBOX_", "REDIS_", "DATABASE_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    custom_resource.reset()
    yield empty_database_url
    custom_resource.reset()


@pytest.fixture
def handler(migrate_env):
    return load_handler("migrate")


def test_create_migrates_an_empty_database_and_answers_success(handler, migrate_env, cfn):
    # Given an empty database, when CloudFormation creates the resource
    returned = handler(sample("create", cfn.url("/cfn/create")), LocalContext(900))

    # Then the schema is at head, and CloudFormation got SUCCESS with the revisions
    assert tables(migrate_env) == TABLES and revision(migrate_env) == head_revision()
    (response,) = cfn.wait_for(1)
    assert response.path == "/cfn/create"
    assert response.headers.get("Content-Type") == ""  # the pre-signed URL is signed without one
    event = sample("create", "")
    assert response.body == returned == {
        "Status": "SUCCESS", "Reason": "", "PhysicalResourceId": custom_resource.PHYSICAL_RESOURCE_ID,
        "StackId": event["StackId"], "RequestId": event["RequestId"], "LogicalResourceId": "SchemaMigration",
        "NoEcho": False, "Data": {"Revision": head_revision(), "PreviousRevision": "none"}}


def test_update_of_a_migrated_database_changes_nothing_and_keeps_the_physical_id(handler, migrate_env, cfn):
    handler(sample("create", cfn.url()), LocalContext(900))
    handler(sample("update", cfn.url()), LocalContext(900))
    first, second = cfn.wait_for(2)
    assert second.body["Status"] == "SUCCESS"
    assert second.body["PhysicalResourceId"] == first.body["PhysicalResourceId"] == "outbox-schema"
    assert second.body["Data"] == {"Revision": head_revision(), "PreviousRevision": head_revision()}
    assert revision(migrate_env) == head_revision()


def test_update_from_an_older_revision_upgrades(handler, migrate_env, cfn):
    engine = create_engine(migrate_env, poolclass=NullPool)
    upgrade(engine, "0001")
    engine.dispose()
    handler(sample("update", cfn.url()), LocalContext(900))
    (response,) = cfn.wait_for(1)
    assert response.body["Data"] == {"Revision": head_revision(), "PreviousRevision": "0001"}


def test_delete_keeps_the_schema_and_needs_no_database(handler, migrate_env, cfn, monkeypatch):
    handler(sample("create", cfn.url()), LocalContext(900))
    # The database may already be gone when the stack is deleted
    monkeypatch.setenv("DATABASE_URL", "postgresql+pg8000://nobody@127.0.0.1:1/gone")
    custom_resource.reset()
    handler(sample("delete", cfn.url()), LocalContext(900))
    _, deleted = cfn.wait_for(2)
    assert deleted.body["Status"] == "SUCCESS" and deleted.body["PhysicalResourceId"] == "outbox-schema"
    assert tables(migrate_env) == TABLES


def test_a_failed_migration_answers_failed_in_one_line_and_raises(handler, migrate_env, cfn, monkeypatch):
    missing = make_url(migrate_env).database + "_missing"
    monkeypatch.setenv("DATABASE_URL", with_database(migrate_env, missing))
    custom_resource.reset()
    with pytest.raises(Exception) as info:
        handler(sample("create", cfn.url()), LocalContext(900))
    (response,) = cfn.wait_for(1)
    reason = response.body["Reason"]
    assert response.body["Status"] == "FAILED" and "\n" not in reason
    assert reason.startswith(f"schema migration failed: {type(info.value).__name__}: ")
    assert missing in reason and "log stream local" in reason


def test_bad_settings_answer_failed_naming_the_variable(handler, migrate_env, cfn, monkeypatch):
    monkeypatch.delenv("DATABASE_URL")
    custom_resource.reset()
    with pytest.raises(Exception):
        handler(sample("create", cfn.url()), LocalContext(900))
    (response,) = cfn.wait_for(1)
    assert response.body["Status"] == "FAILED"
    assert "ConfigurationError: DATABASE_URL: set DATABASE_URL or DATABASE_SECRET_ARN" in response.body["Reason"]


@pytest.mark.slow
def test_a_migration_still_waiting_near_the_timeout_answers_failed_once(handler, migrate_env, cfn):
    # Given another upgrade holding the lock, and an invocation with 7 s left (the watchdog answers at 2 s)
    holder = create_engine(migrate_env, poolclass=NullPool)
    with holder.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": UPGRADE_LOCK_KEY})
        conn.commit()
        done = threading.Event()
        worker = threading.Thread(target=lambda: (handler(sample("create", cfn.url()), LocalContext(7)), done.set()))
        worker.start()
        (response,) = cfn.wait_for(1, timeout=20)
        assert response.body["Status"] == "FAILED" and "timeout" in response.body["Reason"]
        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": UPGRADE_LOCK_KEY})
        conn.commit()
    worker.join(60)
    holder.dispose()
    # The migration then ran to its end, but CloudFormation had its one answer
    assert done.is_set() and len(cfn.responses) == 1


def test_events_that_are_not_custom_resource_requests_are_refused_in_one_line(handler):
    with pytest.raises(ValueError) as info:
        handler({"RequestType": "Create"}, LocalContext(900))
    assert str(info.value) == "ResponseURL: Field required (not a CloudFormation custom resource request)"
    with pytest.raises(ValueError, match="RequestType: Input should be 'Create', 'Update' or 'Delete'"):
        handler({**sample("create", "http://127.0.0.1:9/x"), "RequestType": "Replace"}, LocalContext(900))

