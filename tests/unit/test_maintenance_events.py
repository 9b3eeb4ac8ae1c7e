"""The maintenance function's events and settings, without a database."""

import json
import os
import uuid

import pytest
from pydantic import ValidationError

from outbox_relay.config import load_maintenance_settings, load_settings
from outbox_relay.errors import ConfigurationError
from outbox_relay.maintenance import RedriveRequest, ScheduledRun
from outbox_relay.models import ErrorClass
from outbox_relay.publishers.registry import Channel
from outbox_tools.lambda_local import project_root

EVENTS = project_root() / "events"


def sample(name):
    return json.loads((EVENTS / name).read_text())


def test_the_scheduled_sample_is_a_maintenance_run():
    run = ScheduledRun.model_validate(sample("maintenance-scheduled.json"))
    assert run.action == "maintenance" and run.schedule_arn.startswith("arn:aws:scheduler:")


def test_an_eventbridge_rule_event_is_a_maintenance_run_too():
    run = ScheduledRun.model_validate(sample("eventbridge-scheduled-event.json"))
    assert run.action == "maintenance" and run.detail_type == "Scheduled Event"


def test_the_redrive_sample_selects_by_channel_and_error_class():
    request = RedriveRequest.model_validate(sample("maintenance-redrive.json"))
    selection = request.selection()
    assert (selection.channel, selection.error_class, selection.everything) == (Channel.REDIS, "transient", False)
    assert request.dry_run is False


def test_redrive_by_ids():
    ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    selection = RedriveRequest.model_validate({"action": "redrive", "ids": ids}).selection()
    assert [str(i) for i in selection.message_ids] == ids


@pytest.mark.parametrize(("event", "field"), [
    ({"action": "redrive", "error_clas": "transient"}, "error_clas"),
    ({"action": "redrive", "error_class": "bad"}, "error_class"),
    ({"action": "redrive", "dry_run": "perhaps"}, "dry_run"),
    # Booleans are JSON booleans: a string is refused, never read as true or false
    ({"action": "redrive", "dry_run": "false"}, "dry_run"),
    ({"action": "redrive", "all": "yes"}, "all"),
    ({"action": "redrive", "all": 1}, "all"),
])
def test_redrive_requests_are_strict(event, field):
    with pytest.raises(ValidationError) as info:
        RedriveRequest.model_validate(event)
    assert info.value.errors()[0]["loc"][0] == field


def test_error_classes_are_the_relays():
    assert {e.value for e in ErrorClass} >= {"transient", "permanent", "lease_expired"}


@pytest.fixture
def env(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("OUTBOX_", "DATABASE_", "REDIS_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DATABASE_URL", "postgresql+pg8000://u@h/db")
    return monkeypatch


def test_maintenance_settings_need_no_redis_and_ignore_the_lease(env):
    # A relay with this environment would refuse to start...
    env.setenv("OUTBOX_FUNCTION_TIMEOUT_SECONDS", "900")
    with pytest.raises(ConfigurationError):
        load_settings()
    # ...the maintenance function needs neither REDIS_URL nor a lease longer than its timeout
    settings = load_maintenance_settings()
    assert settings.retain_delivered_seconds == 7 * 86400 and settings.retain_dead_seconds == 30 * 86400


@pytest.mark.parametrize(("variable", "value"), [
    ("OUTBOX_RETAIN_DELIVERED_SECONDS", "0"),
    ("OUTBOX_RETAIN_DEAD_SECONDS", "a month"),
    ("DATABASE_URL", "mysql://u@h/db"),
])
def test_maintenance_settings_still_name_a_bad_variable(env, variable, value):
    env.setenv(variable, value)
    with pytest.raises(ConfigurationError) as info:
        load_maintenance_settings()
    assert info.value.variable == variable


def test_maintenance_settings_read_no_channels_variables(env):
    # Given a Redis URL no relay would take (the maintenance function relays nothing)
    env.setenv("REDIS_URL", "http://not-redis")
    # Then its settings load, without any channel's
    assert load_maintenance_settings().channels == ()


@pytest.mark.parametrize(("model", "event", "field"), [
    # A relay event: an unknown field is not a mode (it would have run batch)
    ("relay", {"source": "outbox.scheduler", "channel": "redis", "mode": "turbo"}, "mode"),
    ("relay", {"chanel": "ses"}, "chanel"),
    # A maintenance run: a dry run that is no field of it must not purge for real
    ("maintenance", {"action": "maintenance", "dry_run": True}, "dry_run"),
])
def test_schedule_events_refuse_unknown_fields(model, event, field):
    from outbox_relay.invocation import ScheduleEvent

    with pytest.raises(ValidationError) as info:
        (ScheduleEvent if model == "relay" else ScheduledRun).model_validate(event)
    assert info.value.errors()[0]["loc"] == (field,)


def test_every_sample_relay_event_and_a_successors_event_are_accepted():
    from outbox_relay.invocation import ScheduleEvent

    for path in [*EVENTS.glob("relay-*.json"), EVENTS / "eventbridge-scheduled-event.json"]:
        ScheduleEvent.model_validate(json.loads(path.read_text()))
    # What a latency-mode poller sends its successor (pollers.Handover._start)
    ScheduleEvent.model_validate({"source": "outbox.handover", "channel": "redis", "predecessor": "p", "reason": "r"})
