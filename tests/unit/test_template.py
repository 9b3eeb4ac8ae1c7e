"""template.yaml, read as data: what it deploys agrees with what the code does.

- Metric names in the alarms and the dashboard are the names the code emits
  (`observability.METRIC_UNITS`), in the namespace the functions are given,
  with exactly the dimensions of the EMF output (`channel`, and `service`
  which Powertools adds); tests/e2e/test_events.py checks those dimensions
  against the real handler's output.
- The schedules send the events in events/ (Scheduler's input format), which
  the handlers' event models accept.
- Every environment variable the template sets is one the settings read; the
  function timeout and OUTBOX_FUNCTION_TIMEOUT_SECONDS are one parameter.
- IAM: each function may call exactly what its code calls.

No sockets: cfn-lint and `sam validate --lint` run in CI (.ci/run).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import pytest

from outbox_relay import config
from outbox_relay import observability as obs
from outbox_relay.config import Settings
from outbox_relay.invocation import ScheduleEvent
from outbox_relay.models import Mode
from outbox_relay.publishers.redis import METRICS as REDIS_METRICS
from outbox_relay.publishers.registry import CHANNELS, Channel
from support.template import ROOT, TemplateModel

MODEL = TemplateModel(every_condition=True)
TEMPLATE = MODEL.doc
RESOURCES: dict[str, Any] = MODEL.resources
PARAMETERS: dict[str, Any] = TEMPLATE["Parameters"]
resolve = MODEL.resolve
of_type = MODEL.of_type

#: The dimensions of every EMF document the code writes (checked against the
#: handler's real output in tests/e2e/test_events.py).
EMF_DIMENSIONS = {"channel", "service"}
#: The SES feedback function's metrics: service only, and the configuration set for reputation.
REPUTATION_METRICS = {"EmailSent", "EmailBounced", "EmailComplained"}
FEEDBACK_DIMENSIONS = {name: ({"service", "configuration_set"} if name in REPUTATION_METRICS else {"service"})
                       for name in obs.FEEDBACK_METRICS}
# The maintenance run's storage metrics: one document for the whole outbox, no channel.
FEEDBACK_DIMENSIONS.update(dict.fromkeys((obs.PARTITION_MARGIN, obs.TABLE_BYTES), {"service"}))
RELAY_FUNCTIONS = {s.name: f"Relay{s.template_prefix}Function" for s in CHANNELS}
PREFIXES = {s.name: s.template_prefix for s in CHANNELS}
#: A value of each channel's switch parameter that turns it on.
SWITCHES_ON = {"RedisUrlSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:r-AbCdEf",
               "SesSenderIdentity": "example.com",
               "SqsQueueArn": "arn:aws:sqs:eu-west-1:123456789012:orders",
               "SnsTopicArn": "arn:aws:sns:eu-west-1:123456789012:orders",
               "EventBridgeBusName": "default",
               "KinesisStreamArn": "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"}
#: Metrics the issue asks the dashboard to plot for each channel.
DASHBOARD_PER_CHANNEL = {obs.CLAIMED, obs.DELIVERED, obs.RETRIED, obs.DEAD_LETTERED, obs.LEASE_LOST,
                         obs.THROTTLED, obs.BATCH_DURATION, obs.OLDEST_PENDING_AGE, obs.DELIVERY_LAG,
                         obs.DELIVERY_LAG_MAX}
#: Latency mode's poller handover (test_every_relay_metric_in_the_template_is_one_the_code_emits
#: ties these names to the code's).
SECONDS_WITHOUT_POLLER = "SecondsWithoutPoller"
HANDOVER_METRICS = {SECONDS_WITHOUT_POLLER, "SuccessorNotStarted", "LeasesTakenOver"}
NAMESPACE = MODEL.metrics_namespace()
dashboard_metrics = MODEL.dashboard_series
alarm_metrics = MODEL.alarm_metrics


# --------------------------------------------------------------------------
# Metrics: names, namespace and dimensions
# --------------------------------------------------------------------------

def test_functions_get_the_namespace_and_service_the_code_uses() -> None:
    env = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    assert env["POWERTOOLS_SERVICE_NAME"] == obs.SERVICE
    assert NAMESPACE.startswith(obs.DEFAULT_NAMESPACE + "/")


@pytest.mark.parametrize("source", ["dashboard", "alarms"])
def test_every_relay_metric_in_the_template_is_one_the_code_emits(source: str) -> None:
    series = dashboard_metrics() if source == "dashboard" else [m[1:] for m in alarm_metrics()]
    ours = [s for s in series if s[0] == NAMESPACE]
    assert ours, f"the {source} watches none of the relay's metrics"
    for namespace, name, dims in ours:
        assert name in obs.METRIC_UNITS, f"{source}: {name} is not a metric the code emits"
        assert set(dims) == FEEDBACK_DIMENSIONS.get(name, EMF_DIMENSIONS), \
            f"{source}: {name} has dimensions {sorted(dims)}"
        assert dims["service"] == obs.SERVICE
        assert dims.get("channel", "ses") in {c.value for c in Channel}
    # Nothing else claims to be ours under another namespace.
    for namespace, name, _ in series:
        assert namespace == NAMESPACE or namespace.startswith("AWS/"), namespace


def test_dashboard_plots_the_relay_metrics_per_channel_next_to_lambda_errors_and_duration() -> None:
    series = dashboard_metrics()
    for channel, function in RELAY_FUNCTIONS.items():
        plotted = {name for ns, name, dims in series if ns == NAMESPACE and dims.get("channel") == channel}
        expected = DASHBOARD_PER_CHANNEL | HANDOVER_METRICS
        assert expected <= plotted, f"{channel}: missing {expected - plotted}"
        lambda_metrics = {name for ns, name, dims in series
                          if ns == "AWS/Lambda" and dims == {"FunctionName": f"<{function}>"}}
        assert {"Errors", "Duration"} <= lambda_metrics, f"{function}: {lambda_metrics}"
    maintenance = {name for ns, name, _ in series if ns == NAMESPACE}
    assert {obs.PENDING_DEPTH, obs.DEAD_COUNT, obs.PURGED} <= maintenance


def test_alarms_cover_errors_throttles_duration_dead_letters_and_backlog() -> None:
    watched = alarm_metrics()
    functions = [*RELAY_FUNCTIONS.values(), "MaintenanceFunction"]
    for function in functions:
        on_function = {name for _, ns, name, dims in watched
                       if ns == "AWS/Lambda" and dims == {"FunctionName": f"<{function}>"}}
        assert on_function == {"Errors", "Throttles", "Duration"}, function
    for channel in RELAY_FUNCTIONS:
        relay = {name for _, ns, name, dims in watched if ns == NAMESPACE and dims.get("channel") == channel}
        redis_only = set(REDIS_METRICS)
        expected = {obs.DEAD_LETTERED, obs.OLDEST_PENDING_AGE, obs.DELIVERY_LAG, SECONDS_WITHOUT_POLLER}
        assert relay == (expected | redis_only if channel == "redis" else expected), channel
    assert any(ns == "AWS/SQS" and dims == {"QueueName": "<ScheduleDeadLetterQueue.QueueName>"}
               for _, ns, _, dims in watched)


def test_backlog_alarm_threshold_is_the_parameter_and_duration_alarm_is_relative_to_the_timeout() -> None:
    for name, alarm in of_type("AWS::CloudWatch::Alarm").items():
        props = alarm["Properties"]
        if props.get("MetricName") == obs.OLDEST_PENDING_AGE:
            assert props["Threshold"] == {"Ref": "OldestPendingAgeAlarmSeconds"}, name
        if props.get("MetricName") == obs.DELIVERY_LAG:
            assert props["Threshold"] == {"Ref": "DeliveryLagAlarmMilliseconds"}, name
            assert props["ExtendedStatistic"] == "p99" and alarm["Condition"].endswith("LagAlarmed"), name
        durations = any(q.get("MetricStat", {}).get("Metric", {}).get("MetricName") == "Duration"
                        for q in props.get("Metrics", []))
        for query in props.get("Metrics", []) if durations else []:
            if "Expression" in query:
                assert "${FunctionTimeoutSeconds}" in query["Expression"]["Fn::Sub"], name
                # a latency-mode relay runs until its deadline's margin, by design
                expected = {"Fn::If": ["IsLatencyMode", 99, 90]} if name.startswith("Relay") else 90
                assert props["Threshold"] == expected, name


def test_the_partition_margin_alarms_days_before_the_open_days_run_out_and_when_runs_stop() -> None:
    from outbox_relay.config import MaintenanceSettings

    alarm = RESOURCES["PartitionMarginAlarm"]["Properties"]
    margin = MaintenanceSettings.model_fields["partition_margin_days"].default
    assert alarm["MetricName"] == obs.PARTITION_MARGIN and alarm["ComparisonOperator"] == "LessThanThreshold"
    # Fired with days to spare (ids of a day not open go to day 0 from the third day on)
    assert 3 < alarm["Threshold"] < margin
    # Two daily runs without the metric breach too: a schedule that stopped is seen before the margin ends
    assert alarm["TreatMissingData"] == "breaching"
    assert alarm["Period"] * alarm["EvaluationPeriods"] / 86400 < margin - 3


@pytest.mark.parametrize("channel", list(RELAY_FUNCTIONS))
def test_a_window_without_a_poller_alarms_per_channel_in_latency_mode(channel: str) -> None:
    (name,) = [n for n, a in of_type("AWS::CloudWatch::Alarm").items()
               if a["Properties"].get("MetricName") == SECONDS_WITHOUT_POLLER
               and resolve(a["Properties"]["Dimensions"]) == [{"Name": "channel", "Value": channel},
                                                              {"Name": "service", "Value": obs.SERVICE}]]
    alarm = RESOURCES[name]
    props = alarm["Properties"]
    # only where latency mode's pollers run: the channel's lag-alarm condition
    assert alarm["Condition"] == f"{PREFIXES[channel]}LagAlarmed"
    for mode in Mode:
        model = TemplateModel({**SWITCHES_ON, "RelayMode": mode.value})
        assert model.deployed(name) == (mode is Mode.LATENCY), mode
    assert resolve(props["AlarmName"]) == f"outbox-prod-relay-{channel}-seconds-without-poller"
    assert resolve(props["Namespace"]) == NAMESPACE
    # any second without a poller, in one minute
    assert props["Statistic"] == "Maximum" and props["Period"] == 60
    assert props["EvaluationPeriods"] == 1 and props.get("DatapointsToAlarm", 1) == 1
    assert props["Threshold"] == 0 and props["ComparisonOperator"] == "GreaterThanThreshold"
    assert props["TreatMissingData"] == "notBreaching"
    for hint in ("SuccessorNotStarted", "Throttles", "dead-letter queue"):
        assert hint in props["AlarmDescription"], hint


def test_the_mode_the_poll_interval_and_the_reserved_concurrency_are_parameters() -> None:
    env = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    assert env["OUTBOX_MODE"] == {"Ref": "RelayMode"} and PARAMETERS["RelayMode"]["Default"] == "latency"
    assert set(PARAMETERS["RelayMode"]["AllowedValues"]) == {m.value for m in Mode}
    assert env["OUTBOX_POLL_INTERVAL_SECONDS"] == {"Ref": "PollIntervalSeconds"}
    # Reserved concurrency: a channel's own when set, else derived from the pollers at most
    # (RelayPollersMax, else RelayPollers): two per poller (it and its successor) and the next
    # scheduled run; 3 for one poller
    by_max = [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21]
    for channel in ("Redis", "Ses"):
        assert RESOURCES[f"Relay{channel}Function"]["Properties"]["ReservedConcurrentExecutions"] == {"Fn::If": [
            f"{channel}ConcurrencyDerived",
            {"Fn::If": ["HasPollersMax", {"Fn::Select": [{"Ref": "RelayPollersMax"}, by_max]},
                        {"Fn::Select": [{"Ref": "RelayPollers"}, by_max]}]},
            {"Ref": f"{channel}ReservedConcurrency"}]}
        assert PARAMETERS[f"{channel}ReservedConcurrency"]["Default"] == 0
    assert all(by_max[n] == 2 * n + 1 for n in range(1, PARAMETERS["RelayPollersMax"]["MaxValue"] + 1))
    assert PARAMETERS["RelayPollers"]["MaxValue"] == PARAMETERS["RelayPollersMax"]["MaxValue"] == len(by_max) - 1
    assert PARAMETERS["RelayPollers"]["Default"] == 1 and by_max[1] == 3
    assert env["OUTBOX_POLLERS"] == {"Ref": "RelayPollers"}
    assert env["OUTBOX_POLLERS_MAX"] == {"Fn::If": ["HasPollersMax", {"Ref": "RelayPollersMax"}, ""]}
    # one poller outlives two periods of the default one-minute schedule plus a cold start
    assert PARAMETERS["RelayScheduleExpression"]["Default"] == "rate(1 minute)"
    assert PARAMETERS["FunctionTimeoutSeconds"]["Default"] == 150
    assert PARAMETERS["FunctionTimeoutSeconds"]["Default"] > 2 * 60 + Settings.model_fields[
        "deadline_margin_seconds"].default
    assert PARAMETERS["LeaseSeconds"]["Default"] == 180
    assert PARAMETERS["LeaseSeconds"]["Default"] > PARAMETERS["FunctionTimeoutSeconds"]["Default"]
    # the claim, the outcome writes and the heartbeat each use a connection
    env_pool = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]["DATABASE_POOL_SIZE"]
    assert env_pool == "3"


def test_every_alarm_notifies_the_encrypted_topic_that_cloudwatch_may_use() -> None:
    for name, alarm in of_type("AWS::CloudWatch::Alarm").items():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": "AlarmTopic"}], name
        assert alarm["Properties"]["AlarmDescription"], name
    topic = RESOURCES["AlarmTopic"]["Properties"]
    key_ref = topic["KmsMasterKeyId"]
    assert key_ref == {"Fn::GetAtt": ["AlarmTopicKey", "Arn"]}, "the AWS managed SNS key would block CloudWatch"
    key_policy = RESOURCES["AlarmTopicKey"]["Properties"]["KeyPolicy"]["Statement"]
    assert any(s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"} and "kms:Decrypt" in s["Action"]
               for s in key_policy)


# --------------------------------------------------------------------------
# Schedules and events
# --------------------------------------------------------------------------

def _schedule(function: str) -> dict[str, Any]:
    events = RESOURCES[function]["Properties"]["Events"]
    (event,) = events.values()
    assert event["Type"] == "ScheduleV2"
    return event["Properties"]


def _scheduler_input(function: str, sample: dict[str, Any]) -> dict[str, Any]:
    """The schedule's Input with Scheduler's context attributes filled in from `sample`."""
    text = _schedule(function)["Input"]
    context = {"aws.scheduler.scheduled-time": sample.get("scheduledTime", "2026-01-01T00:00:00Z"),
               "aws.scheduler.schedule-arn": sample.get("scheduleArn", "arn:aws:scheduler:::schedule/x"),
               "aws.scheduler.execution-id": sample.get("executionId", "id")}
    return json.loads(re.sub(r"<(aws\.scheduler\.[a-z-]+)>", lambda m: context[m[1]], text))


@pytest.mark.parametrize("function", [*RELAY_FUNCTIONS.values(), "MaintenanceFunction"])
def test_each_schedule_retries_and_dead_letters(function: str) -> None:
    props = _schedule(function)
    assert props["RetryPolicy"]["MaximumRetryAttempts"] >= 1
    assert props["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": ["ScheduleDeadLetterQueue", "Arn"]}}
    assert RESOURCES["ScheduleDeadLetterQueue"]["Properties"]["SqsManagedSseEnabled"] is True


@pytest.mark.parametrize("channel", list(RELAY_FUNCTIONS))
def test_relay_schedule_sends_the_sample_event_of_its_channel(channel: str) -> None:
    function = RELAY_FUNCTIONS[channel]
    sample = json.loads((ROOT / "events" / "relay-redis-scheduler.json").read_text())
    path = ROOT / "events" / f"relay-{channel}-scheduler.json"
    if path.exists():
        sample = json.loads(path.read_text())
    sent = _scheduler_input(function, sample)
    # Same shape as the sample in events/, and routed to this function's channel
    assert set(sent) == set(sample)
    assert sent["source"] == sample["source"] == "outbox.scheduler"
    assert sent["channel"] == channel == RESOURCES[function]["Properties"]["Environment"]["Variables"]["OUTBOX_CHANNEL"]
    parsed = ScheduleEvent.model_validate(sent)
    assert parsed.channel is Channel(channel)
    assert parsed.schedule_arn == sample["scheduleArn"] and parsed.execution_id == sample["executionId"]


def test_maintenance_schedule_sends_the_sample_scheduled_event() -> None:
    from outbox_relay.maintenance import ScheduledRun

    sample = json.loads((ROOT / "events" / "maintenance-scheduled.json").read_text())
    sent = _scheduler_input("MaintenanceFunction", sample)
    assert sent == sample
    assert ScheduledRun.model_validate(sent).action == "maintenance"


# --------------------------------------------------------------------------
# Functions, layer, settings
# --------------------------------------------------------------------------

def test_every_variable_the_template_sets_is_read_by_the_settings() -> None:
    known = set(config.variables())
    powertools = {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_LOG_LEVEL",
                  "POWERTOOLS_LOGGER_LOG_EVENT", "POWERTOOLS_TRACER_CAPTURE_RESPONSE"}
    boto = {"AWS_ENDPOINT_URL"}  # empty in AWS (boto3 ignores it); sam local points it at moto
    functions = of_type("AWS::Serverless::Function")
    blocks = [TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]]
    blocks += [f["Properties"].get("Environment", {}).get("Variables", {}) for f in functions.values()]
    for variables in blocks:
        for name in variables:
            assert name in known | powertools | boto, f"{name} is set but nothing reads it"


def test_the_timeout_the_code_is_told_is_the_function_timeout() -> None:
    globals_ = TEMPLATE["Globals"]["Function"]
    assert globals_["Timeout"] == {"Ref": "FunctionTimeoutSeconds"}
    assert globals_["Environment"]["Variables"]["OUTBOX_FUNCTION_TIMEOUT_SECONDS"] == {"Ref": "FunctionTimeoutSeconds"}
    for name, function in of_type("AWS::Serverless::Function").items():
        if name == "MigrationFunction":
            continue  # its own timeout, below
        assert "Timeout" not in function["Properties"], f"{name} overrides the timeout the code is told"
    # The migration function may run longer, and is told so.
    migration = RESOURCES["MigrationFunction"]["Properties"]
    assert migration["Environment"]["Variables"]["OUTBOX_FUNCTION_TIMEOUT_SECONDS"] == str(migration["Timeout"])
    # The defaults satisfy the rule the settings enforce: the lease outlives the timeout.
    assert int(PARAMETERS["LeaseSeconds"]["Default"]) > int(PARAMETERS["FunctionTimeoutSeconds"]["Default"])


def test_runtime_architecture_tracing_and_layer() -> None:
    globals_ = TEMPLATE["Globals"]["Function"]
    assert globals_["Runtime"] == "python3.12"
    assert globals_["Architectures"] == ["arm64"]
    assert globals_["Tracing"] == "Active"
    assert globals_["Layers"] == [{"Ref": "SharedLayer"}]
    layer = RESOURCES["SharedLayer"]
    assert layer["Properties"]["ContentUri"] == "shared/"
    assert layer["Metadata"]["BuildMethod"] == "python3.12"
    assert layer["Metadata"]["BuildArchitecture"] == "arm64"


@pytest.mark.parametrize("function", [*RELAY_FUNCTIONS.values(), "MaintenanceFunction", "MigrationFunction"])
def test_each_function_has_its_handler_and_a_log_group_with_retention(function: str) -> None:
    props = RESOURCES[function]["Properties"]
    module, _, attr = props["Handler"].rpartition(".")
    source = ROOT / props["CodeUri"] / f"{module}.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    assert any(isinstance(n, ast.FunctionDef) and n.name == attr for n in tree.body), f"{source}: no {attr}()"
    log_group = props["LoggingConfig"]["LogGroup"]["Ref"]
    assert RESOURCES[log_group]["Type"] == "AWS::Logs::LogGroup"
    assert RESOURCES[log_group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    assert RESOURCES[log_group].get("Condition") == RESOURCES[function].get("Condition")


def test_the_migration_function_has_the_runtime_layer_and_the_migrations_layer() -> None:
    # Layers in a function are added to the Globals' (SAM merges lists): the relay's layer, then the migrations'.
    props = RESOURCES["MigrationFunction"]["Properties"]
    assert TEMPLATE["Globals"]["Function"]["Layers"] + props["Layers"] == [{"Ref": "SharedLayer"},
                                                                          {"Ref": "MigrationsLayer"}]
    layer = RESOURCES["MigrationsLayer"]
    assert layer["Properties"]["ContentUri"] == "migrations/"
    assert layer["Properties"]["CompatibleArchitectures"] == TEMPLATE["Globals"]["Function"]["Architectures"]
    assert layer["Metadata"] == {"BuildMethod": "python3.12", "BuildArchitecture": "arm64"}
    assert (ROOT / "migrations" / "requirements.txt").is_file()
    # CloudFormation invokes it asynchronously: Lambda must not run a request again
    assert props["EventInvokeConfig"]["MaximumRetryAttempts"] == 0
    assert "Events" not in props, "run by the custom resource only"


def test_the_schema_is_migrated_by_a_custom_resource_on_every_new_migrations_layer() -> None:
    resource = RESOURCES["SchemaMigration"]
    assert resource["Type"].startswith("Custom::")
    props = resource["Properties"]
    assert props["ServiceToken"] == {"Fn::GetAtt": ["MigrationFunction", "Arn"]}
    # A new layer version (new scripts) or another database changes a property, so CloudFormation sends Update
    assert props["MigrationsLayer"] == {"Ref": "MigrationsLayer"}
    assert resolve(props["Database"]) == "<DatabaseIamUser>@<DatabaseHost>:5432/postgres"
    assert MODEL.resolve(props["Database"]["Fn::If"][2]) == "<DatabaseSecretArn>"
    # CloudFormation waits no longer than the function can run, and a little more
    timeout = RESOURCES["MigrationFunction"]["Properties"]["Timeout"]
    assert timeout < props["ServiceTimeout"] <= 3600
    (alarm,) = [a for a in of_type("AWS::CloudWatch::Alarm").values()
                if a["Properties"].get("Dimensions") == [{"Name": "FunctionName", "Value": {"Ref": "MigrationFunction"}}]]
    assert alarm["Properties"]["MetricName"] == "Errors"
    assert alarm["Properties"]["AlarmActions"] == [{"Ref": "AlarmTopic"}]


def test_relay_functions_share_one_code_and_differ_by_channel() -> None:
    props = [RESOURCES[f]["Properties"] for f in RELAY_FUNCTIONS.values()]
    assert {p["CodeUri"] for p in props} == {"functions/relay/"}
    assert {p["Handler"] for p in props} == {"app.handler"}
    assert [p["Environment"]["Variables"]["OUTBOX_CHANNEL"] for p in props] == list(RELAY_FUNCTIONS)


# --------------------------------------------------------------------------
# IAM: exactly what each function calls
# --------------------------------------------------------------------------

def _statements(function: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for policy in RESOURCES[function]["Properties"]["Policies"]:
        if policy == {"Ref": "DatabaseAccessPolicy"}:
            document = RESOURCES["DatabaseAccessPolicy"]["Properties"]["PolicyDocument"]
        else:
            document = policy
        for statement in document["Statement"]:
            if "Fn::If" in statement:
                statement = statement["Fn::If"][1]
            out.append(statement)
    return out


def _actions(statement: dict[str, Any]) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else list(action)


@pytest.mark.parametrize("function", [*RELAY_FUNCTIONS.values(), "MaintenanceFunction", "MigrationFunction"])
def test_no_wildcard_actions_and_wildcard_resources_only_where_iam_has_no_resources(function: str) -> None:
    for statement in _statements(function):
        assert statement["Effect"] == "Allow"
        for action in _actions(statement):
            assert "*" not in action, action
        if statement["Resource"] == "*":
            assert _actions(statement) == ["ses:GetAccount"], statement


def test_database_access_is_the_one_secret_or_the_one_iam_database_user() -> None:
    statements = {s["Sid"]: s for s in _statements("MaintenanceFunction")}
    assert statements["ReadDatabaseSecret"]["Action"] == "secretsmanager:GetSecretValue"
    assert statements["ReadDatabaseSecret"]["Resource"] == {"Ref": "DatabaseSecretArn"}
    assert statements["ConnectWithIamToken"]["Action"] == "rds-db:connect"
    arn = resolve(statements["ConnectWithIamToken"]["Resource"])
    assert arn == "arn:aws:rds-db:eu-west-1:123456789012:dbuser:<DatabaseIamResourceId>/<DatabaseIamUser>"
    # Each is granted only under its own choice of DatabaseAuth
    document = RESOURCES["DatabaseAccessPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    conditions = {s["Fn::If"][1]["Sid"]: s["Fn::If"][0] for s in document}
    assert conditions["ReadDatabaseSecret"] == "UseSecretAuth"
    assert conditions["ConnectWithIamToken"] == "UseIamAuth"
    assert conditions["DecryptSecretsThroughSecretsManager"] == "HasSecretsKmsKey"
    assert set(statements) == set(conditions), "the maintenance function needs the database only"


def test_the_migration_function_needs_only_the_database() -> None:
    assert RESOURCES["MigrationFunction"]["Properties"]["Policies"] == [{"Ref": "DatabaseAccessPolicy"}]


def test_redis_relay_reads_only_its_redis_secret_beyond_the_database() -> None:
    extra = [s for s in _statements("RelayRedisFunction") if s["Sid"] == "ReadRedisUrlSecret"]
    assert extra == [{"Sid": "ReadRedisUrlSecret", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
                      "Resource": {"Ref": "RedisUrlSecretArn"}}]
    assert not [a for s in _statements("RelayRedisFunction") for a in _actions(s) if a.startswith("ses:")]


def test_ses_relay_may_call_exactly_the_ses_operations_its_code_calls() -> None:
    # Given the SES v2 operations the publisher calls on its client
    code = "".join(f.read_text(encoding="utf-8")
                   for f in (ROOT / "shared" / "outbox_relay" / "publishers" / "ses").glob("*.py"))
    called = {"ses:" + "".join(w.capitalize() for w in op.split("_"))
              for op in re.findall(r"self\.client\.([a-z_]+)\(", code)}
    # Then the function's SES permissions are those operations
    granted = {a for s in _statements("RelaySesFunction") for a in _actions(s) if a.startswith("ses:")}
    assert granted == called == {"ses:SendEmail", "ses:GetAccount"}
    (send,) = [s for s in _statements("RelaySesFunction") if "ses:SendEmail" in _actions(s)]
    assert resolve(send["Resource"]) == [
        "arn:aws:ses:eu-west-1:123456789012:identity/<SesSenderIdentity>",
        "arn:aws:ses:eu-west-1:123456789012:configuration-set/<SesConfigurationSet>",
    ]


#: The IAM action a batch operation is authorized as ("Actions, resources, and condition keys").
BATCH_ACTIONS = {"sqs:SendMessageBatch": "sqs:SendMessage", "sns:PublishBatch": "sns:Publish"}
KEY = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def _channel_statements(model: TemplateModel, function: str) -> list[dict[str, Any]]:
    """The function's own policy (not the database's), evaluated for the model's parameters."""
    (policy,) = [p for p in model.resolve(RESOURCES[function]["Properties"]["Policies"]) if isinstance(p, dict)]
    return policy["Statement"]


@pytest.mark.parametrize(("channel", "service", "destination"), [
    ("sqs", "sqs", "arn:aws:sqs:eu-west-1:123456789012:orders"),
    ("sns", "sns", "arn:aws:sns:eu-west-1:123456789012:orders"),
    ("eventbridge", "events", "arn:aws:events:eu-west-1:123456789012:event-bus/default"),
])
def test_an_aws_batch_relay_may_call_exactly_its_operations_on_its_one_destination(channel, service,
                                                                                    destination) -> None:
    # Given the operations the channel's publisher calls on its client, as IAM actions
    code = (ROOT / "shared" / "outbox_relay" / "publishers" / channel / "publisher.py").read_text(encoding="utf-8")
    called = {BATCH_ACTIONS.get(a, a) for a in (f"{service}:" + "".join(w.capitalize() for w in op.split("_"))
                                                for op in re.findall(r"self\.client\.([a-z_]+)\(", code))}
    # Then, with its switch on and nothing optional, it may call those and only on its one destination
    statements = _channel_statements(TemplateModel(SWITCHES_ON), RELAY_FUNCTIONS[channel])
    granted = [s for s in statements if any(a.startswith(f"{service}:") for a in _actions(s))]
    assert {a for s in granted for a in _actions(s)} == called and len(called) == 2
    assert [s["Resource"] for s in granted] == [destination]
    assert not [s for s in statements if any(a.startswith("kms:") for a in _actions(s))]


def test_the_sqs_relay_gets_the_queue_url_built_from_its_arn() -> None:
    model = TemplateModel({"SqsQueueArn": "arn:aws:sqs:eu-west-1:210987654321:orders.fifo"})
    env = model.function_environment("RelaySqsFunction")
    assert env["OUTBOX_SQS_QUEUE_URL"] == "https://sqs.eu-west-1.amazonaws.com/210987654321/orders.fifo"
    # as the settings take it
    from types import SimpleNamespace

    from outbox_relay.publishers.sqs.settings import check_settings

    check_settings(SimpleNamespace(sqs_queue_url=env["OUTBOX_SQS_QUEUE_URL"]), relayed=True)


@pytest.mark.parametrize(("channel", "key_parameter", "via"), [("sqs", "SqsKmsKeyArn", "sqs"),
                                                                ("sns", "SnsKmsKeyArn", "sns")])
def test_a_queue_or_topic_key_is_usable_only_when_given_and_only_through_its_service(channel, key_parameter,
                                                                                     via) -> None:
    statements = _channel_statements(TemplateModel({**SWITCHES_ON, key_parameter: KEY}), RELAY_FUNCTIONS[channel])
    (kms,) = [s for s in statements if any(a.startswith("kms:") for a in _actions(s))]
    assert sorted(_actions(kms)) == ["kms:Decrypt", "kms:GenerateDataKey"] and kms["Resource"] == KEY
    assert kms["Condition"] == {"StringEquals": {"kms:ViaService": f"{via}.eu-west-1.amazonaws.com"}}


def test_the_eventbridge_relay_may_put_events_on_the_other_buses_listed_only() -> None:
    others = ["arn:aws:events:eu-west-1:123456789012:event-bus/audit",
              "arn:aws:events:eu-west-1:210987654321:event-bus/central"]
    model = TemplateModel({**SWITCHES_ON, "EventBridgeOtherBusArns": ",".join(others)})
    statements = _channel_statements(model, "RelayEventBridgeFunction")
    (other,) = [s for s in statements if s["Sid"] == "PutEventsOnTheBusesMessagesName"]
    assert other["Action"] == "events:PutEvents" and other["Resource"] == others
    assert not [s for s in _channel_statements(TemplateModel(SWITCHES_ON), "RelayEventBridgeFunction")
                if s["Sid"] == "PutEventsOnTheBusesMessagesName"]


@pytest.mark.parametrize("function", list(RELAY_FUNCTIONS.values()))
def test_a_relay_may_invoke_itself_to_start_its_successor(function: str) -> None:
    props = RESOURCES[function]["Properties"]
    name = resolve(props["FunctionName"])
    # the name its log group has
    log_group = RESOURCES[props["LoggingConfig"]["LogGroup"]["Ref"]]
    assert resolve(log_group["Properties"]["LogGroupName"]) == f"/aws/lambda/{name}"
    (statement,) = [s for s in _statements(function) if any(a.startswith("lambda:") for a in _actions(s))]
    assert statement["Sid"] == "StartMySuccessor"
    assert _actions(statement) == ["lambda:InvokeFunction"]
    # the one function, unqualified (the poller invokes AWS_LAMBDA_FUNCTION_NAME): no list, no wildcard
    assert resolve(statement["Resource"]) == f"arn:aws:lambda:eu-west-1:123456789012:function:{name}"
    # only where a poller starts successors
    (policy,) = [p for p in props["Policies"] if p != {"Ref": "DatabaseAccessPolicy"}]
    (conditional,) = [s for s in policy["Statement"] if "Fn::If" in s and s["Fn::If"][1]["Sid"] == "StartMySuccessor"]
    assert conditional["Fn::If"][0] == "IsLatencyMode" and conditional["Fn::If"][2] == {"Ref": "AWS::NoValue"}
    # and Lambda neither retries nor runs late the successor it started, as for a schedule event
    assert props["EventInvokeConfig"] == {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60}


def test_only_the_relays_may_invoke_a_function() -> None:
    for function in set(of_type("AWS::Serverless::Function")) - set(RELAY_FUNCTIONS.values()):
        assert not [a for s in _statements(function) for a in _actions(s) if a.startswith("lambda:")], function


def test_functions_run_in_the_vpc() -> None:
    vpc = TEMPLATE["Globals"]["Function"]["VpcConfig"]
    assert vpc == {"SubnetIds": {"Ref": "SubnetIds"}, "SecurityGroupIds": {"Ref": "SecurityGroupIds"}}
    assert PARAMETERS["SubnetIds"]["Type"] == "List<AWS::EC2::Subnet::Id>"


# --------------------------------------------------------------------------
# Parameters and outputs
# --------------------------------------------------------------------------

def test_parameters_the_issue_lists() -> None:
    assert {"EnvironmentName", "RelayScheduleExpression", "BatchSize", "LeaseSeconds", "SubnetIds",
            "SecurityGroupIds", "DatabaseAuth", "DatabaseSecretArn", "DatabaseIamUser", "DatabaseIamResourceId",
            "RedisUrlSecretArn", "SesSenderIdentity", "SesConfigurationSet", "LogRetentionDays",
            "AlarmEmail", "OldestPendingAgeAlarmSeconds"} <= set(PARAMETERS)
    grouped = {p for g in TEMPLATE["Metadata"]["AWS::CloudFormation::Interface"]["ParameterGroups"]
               for p in g["Parameters"]}
    assert grouped == set(PARAMETERS), "every parameter appears in one console group"


def test_outputs_name_the_functions_dashboard_and_alarm_topic() -> None:
    outputs = TEMPLATE["Outputs"]
    assert outputs["RelayRedisFunctionArn"]["Value"] == {"Fn::GetAtt": ["RelayRedisFunction", "Arn"]}
    assert outputs["RelaySesFunctionArn"]["Value"] == {"Fn::GetAtt": ["RelaySesFunction", "Arn"]}
    assert outputs["MaintenanceFunctionArn"]["Value"] == {"Fn::GetAtt": ["MaintenanceFunction", "Arn"]}
    assert outputs["MigrationFunctionArn"]["Value"] == {"Fn::GetAtt": ["MigrationFunction", "Arn"]}
    assert outputs["SchemaRevision"]["Value"] == {"Fn::GetAtt": ["SchemaMigration", "Revision"]}
    assert outputs["AlarmTopicArn"]["Value"] == {"Ref": "AlarmTopic"}
    assert resolve(outputs["DashboardUrl"]["Value"]).endswith("#dashboards:name=<Dashboard>")


def test_the_deploy_documentation_names_every_parameter_and_alarm() -> None:
    deploying = (ROOT / "docs" / "deploying.md").read_text(encoding="utf-8")
    missing = sorted(name for name in PARAMETERS if f"`{name}`" not in deploying)
    assert missing == []
    operating = (ROOT / "docs" / "operating.md").read_text(encoding="utf-8")
    for name, alarm in of_type("AWS::CloudWatch::Alarm").items():
        suffix = alarm["Properties"]["AlarmName"]["Fn::Sub"].removeprefix("${AWS::StackName}-")
        generic = suffix
        for channel in RELAY_FUNCTIONS:
            generic = generic.replace(f"-{channel}-", "-<channel>-")
        assert f"`{generic}`" in operating, f"{name}: `{generic}` is not explained"
