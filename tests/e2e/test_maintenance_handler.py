"""The real maintenance handler (functions/maintenance/app.py) on the sample
events in events/: rows afterwards, the summary, and its EMF output parsed."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from sqlalchemy import create_engine, text

from outbox_relay import maintenance
from outbox_relay import observability as obs
from outbox_relay.errors import ConfigurationError, InvalidEventError
from outbox_relay.publishers.registry import CHANNELS
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from support.events import counts
from support.events import seed_rows as seed

EVENTS = project_root() / "events"


def event(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


@pytest.fixture
def maintenance_env(monkeypatch, database_url):
    """The maintenance function's environment: the database and retention
    windows only; no REDIS_URL, and a timeout longer than the relay's lease."""
    for key in list(os.environ):
        if key.startswith(("OUTBOX_", "REDIS_", "DATABASE_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("OUTBOX_RETAIN_DELIVERED_SECONDS", str(7 * 86400))
    monkeypatch.setenv("OUTBOX_RETAIN_DEAD_SECONDS", str(30 * 86400))
    monkeypatch.setenv("OUTBOX_FUNCTION_TIMEOUT_SECONDS", "900")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    maintenance.reset()
    yield
    maintenance.reset()


@pytest.fixture
def handler(maintenance_env):
    return load_handler("maintenance")


@pytest.fixture
def db(database_url):
    engine = create_engine(database_url, pool_size=2)
    yield engine
    engine.dispose()


def emf_by_channel(out: str) -> dict[str, dict]:
    """Parse every EMF document printed; check its shape; index by channel."""
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"_aws"' in line]
    # The day partitions' document is the outbox's, with no channel (test_store_partitions.py).
    docs = [doc for doc in docs if obs.PARTITION_MARGIN not in doc]
    by_channel = {}
    for doc in docs:
        (directive,) = doc["_aws"]["CloudWatchMetrics"]
        # The singleton's namespace: POWERTOOLS_METRICS_NAMESPACE at import, else the default
        assert directive["Namespace"] == obs.metrics.namespace and directive["Namespace"]
        assert directive["Dimensions"] == [["channel", "service"]]
        assert doc["service"] == "outbox-relay"
        units = {m["Name"]: m["Unit"] for m in directive["Metrics"]}
        for name in units:
            assert name in doc  # every declared metric has its value
        doc["units"] = units
        assert doc["channel"] not in by_channel, "one EMF document per channel"
        by_channel[doc["channel"]] = doc
    return by_channel


def value(v):
    return sum(v) if isinstance(v, list) else v


@pytest.mark.parametrize("sample", ["maintenance-scheduled.json", "eventbridge-scheduled-event.json"])
def test_scheduled_run_purges_by_the_windows_and_emits_backlog_per_channel(handler, db, capsys, sample):
    # Given old and recent delivered rows and dead letters, and a backlog
    seed(db, 3, "delivered", ago=10 * 86400)
    seed(db, 2, "delivered", channel="ses", ago=8 * 86400)
    seed(db, 1, "delivered", ago=3600)
    seed(db, 2, "dead", ago=40 * 86400, error_class="permanent")
    seed(db, 1, "dead", ago=86400, error_class="permanent")
    seed(db, 1, "dead", channel="ses", ago=86400, error_class="permanent")
    seed(db, 2, "pending", available_ago=300)
    seed(db, 1, "pending", available_ago=-3600)  # deferred: counted in depth, not in age

    # When the daily schedule invokes the function
    summary = handler(event(sample), LocalContext(900))

    # Then rows past their window are gone and the rest stay
    assert counts(db) == {("redis", "delivered"): 1, ("redis", "dead"): 1, ("redis", "pending"): 3,
                          ("ses", "dead"): 1}
    assert summary["action"] == "maintenance"
    purged = summary["purged"]
    assert (purged["delivered"], purged["dead"], purged["complete"]) == (5, 2, True)
    assert summary["retain_delivered_seconds"] == 7 * 86400
    # And the backlog figures are in the summary and in EMF, one document per channel
    backlog = {b["channel"]: b for b in summary["backlog"]}
    assert (backlog["redis"]["pending_depth"], backlog["redis"]["dead_count"]) == (3, 1)
    emf = emf_by_channel(capsys.readouterr().out)
    assert set(emf) == {spec.name for spec in CHANNELS}
    redis, ses = emf["redis"], emf["ses"]
    assert redis["units"] == {"PendingDepth": "Count", "OldestPendingAge": "Seconds", "DeadCount": "Count",
                              "Purged": "Count"}
    assert (value(redis["PendingDepth"]), value(redis["DeadCount"]), value(redis["Purged"])) == (3, 1, 5)
    assert 300 <= value(redis["OldestPendingAge"]) < 330
    assert (value(ses["PendingDepth"]), value(ses["OldestPendingAge"]), value(ses["DeadCount"]),
            value(ses["Purged"])) == (0, 0, 1, 2)


def test_idle_outbox_still_reports_every_channel(handler, capsys):
    summary = handler(event("maintenance-scheduled.json"), LocalContext(900))
    assert summary["purged"]["total"] == 0
    emf = emf_by_channel(capsys.readouterr().out)
    assert set(emf) == {spec.name for spec in CHANNELS}
    for doc in emf.values():
        assert [value(doc[m]) for m in ("PendingDepth", "OldestPendingAge", "DeadCount", "Purged")] == [0, 0, 0, 0]


def test_purge_starts_no_batch_when_the_deadline_is_near(handler, db, capsys):
    # Given rows to purge but only 5 s left in the invocation (the reserve is 10 s)
    seed(db, 4, "delivered", ago=10 * 86400)
    summary = handler(event("maintenance-scheduled.json"), LocalContext(5))
    # Then nothing is deleted, the summary says the purge is incomplete, and the metrics still go out
    assert summary["purged"]["complete"] is False and summary["purged"]["total"] == 0
    assert counts(db) == {("redis", "delivered"): 4}
    assert set(emf_by_channel(capsys.readouterr().out)) == {spec.name for spec in CHANNELS}


def test_redrive_event_moves_the_selected_dead_letters(handler, db, capsys):
    # Given dead letters of several channels and classes
    seed(db, 2, "dead", ago=600, error_class="transient")
    seed(db, 1, "dead", ago=600, error_class="permanent")
    seed(db, 1, "dead", channel="ses", ago=600, error_class="transient")
    seed(db, 2, "delivered", ago=10 * 86400)  # old, but a redrive does not purge

    # When an operator invokes the function with the sample redrive request (redis, transient)
    summary = handler(event("maintenance-redrive.json"), LocalContext(900))

    # Then only those moved: pending, attempts reset, due now
    assert summary["action"] == "redrive"
    assert summary["redrive"]["moved"] == 2 and summary["redrive"]["by_channel"] == {"redis": 2}
    with db.connect() as conn:
        moved = conn.execute(text(
            "SELECT status, attempts, available_at <= now(), dead_at, last_error_class FROM outbox_message "
            "WHERE channel = 'redis' AND last_error_class = 'transient'")).fetchall()
    assert [tuple(r) for r in moved] == [("pending", 0, True, None, "transient")] * 2
    assert counts(db) == {("redis", "pending"): 2, ("redis", "dead"): 1, ("ses", "dead"): 1,
                          ("redis", "delivered"): 2}
    # And the backlog metrics reflect the redrive (no Purged: no purge ran)
    emf = emf_by_channel(capsys.readouterr().out)
    assert (value(emf["redis"]["PendingDepth"]), value(emf["redis"]["DeadCount"])) == (2, 1)
    assert "Purged" not in emf["redis"]["units"]


def test_redrive_event_by_ids_dry_run_changes_nothing(handler, db):
    seed(db, 2, "dead", ago=60, error_class="permanent")
    with db.connect() as conn:
        ids = [str(i) for i in conn.execute(text("SELECT message_id FROM outbox_message ORDER BY seq")).scalars()]
    unknown = str(uuid.uuid4())
    summary = handler({"action": "redrive", "ids": [ids[0], unknown], "dry_run": True}, LocalContext(900))
    assert summary["redrive"]["dry_run"] is True and summary["redrive"]["moved"] == 1
    assert summary["redrive"]["not_dead"] == [unknown]
    assert counts(db) == {("redis", "dead"): 2}


def test_bad_requests_are_refused_by_field_and_change_nothing(handler, db):
    seed(db, 2, "dead", ago=60, error_class="permanent")
    for request, field, fragment in [
        ({"action": "redrive", "chanel": "redis"}, "chanel", "not permitted"),  # a misspelt selector
        ({"action": "redrive", "channel": "kafka"}, "channel", "redis"),
        ({"action": "redrive", "ids": ["nope"]}, "ids.0", "UUID"),
        ({"action": "redrive"}, "event", "say what to redrive"),
        ({"action": "redrive", "all": True, "channel": "redis"}, "event", "takes no ids"),
        ({"action": "redrive", "channel": "redis", "dry_run": "false"}, "dry_run", "boolean"),  # never a real run
        ({"action": "vacuum"}, "action", "maintenance"),
    ]:
        with pytest.raises(InvalidEventError) as info:
            handler(request, LocalContext(900))
        assert info.value.field == field and fragment in str(info.value), (request, str(info.value))
    assert counts(db) == {("redis", "dead"): 2}


def test_configuration_needs_only_the_database(maintenance_env, monkeypatch):
    # No REDIS_URL, a 900 s timeout beside a 120 s lease: fine for maintenance
    deps = maintenance.get_dependencies()
    assert deps.settings.retain_dead_seconds == 30 * 86400
    assert maintenance.get_dependencies() is deps  # built once per container
    maintenance.reset()
    # But a bad retention window or no database stops the cold start, naming the variable
    monkeypatch.setenv("OUTBOX_RETAIN_DEAD_SECONDS", "0")
    with pytest.raises(ConfigurationError) as info:
        maintenance.get_dependencies()
    assert info.value.variable == "OUTBOX_RETAIN_DEAD_SECONDS"
    monkeypatch.setenv("OUTBOX_RETAIN_DEAD_SECONDS", "60")
    monkeypatch.delenv("DATABASE_URL")
    with pytest.raises(ConfigurationError) as info:
        maintenance.get_dependencies()
    assert info.value.variable == "DATABASE_URL"
