"""The sample events in events/ through the real handlers, and the path that
stands in for `sam local invoke` (which needs Docker).

- Every file in events/ is a schedule's event for a function of template.yaml,
  or a custom resource request for the migration function.
- Each relay event runs through functions/relay/app.py on this test's
  PostgreSQL, Redis and (for SES) moto, and delivers what was enqueued.
- The EMF output carries the namespace and exactly the dimensions that the
  template's alarms and dashboard use (tests/unit/test_template.py checks the
  names; here the real output is compared).
- `sam local invoke -e events/<file>.json` with samconfig.toml's local
  settings: SAM CLI's own code computes the function's environment from
  template.yaml and infra/sam-env.json; with the compose hosts pointed at
  this test's servers, `outbox relay --event` runs the handler in that
  environment.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tomllib
import warnings
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest
import yaml

from outbox_tools.lambda_local import LocalContext, load_handler
from outbox_tools.local_ses import LocalSesServer
from support.aws_downstream import AWS_CHANNELS, SAM_ENV, Downstream
from support.events import (
    EVENTS,
    RELAY_FUNCTION,
    SENDER,
    assert_emf_matches_the_template,
    emf_documents,
    functions_for,
    load,
    relay_channel,
    seed,
    statuses,
)
from support.template import ROOT, TemplateModel

RELAY_EVENTS = sorted(p.name for p in EVENTS.glob("*.json") if relay_channel(load(p)))


# --------------------------------------------------------------------------
# Fixtures: moto SES server, seeding
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ses_server() -> Iterator[LocalSesServer]:
    with LocalSesServer(max_send_rate=100) as server:
        yield server


@pytest.fixture
def ses(ses_server: LocalSesServer, monkeypatch: pytest.MonkeyPatch) -> LocalSesServer:
    ses_server.reset()
    ses_server.verify(SENDER)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": ses_server.region, "AWS_REGION": ses_server.region}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return ses_server


# --------------------------------------------------------------------------
# events/ against the template
# --------------------------------------------------------------------------

def test_every_sample_event_is_for_a_function_of_the_template() -> None:
    model = TemplateModel(every_condition=True)
    for path in sorted(EVENTS.glob("*.json")):
        event = load(path)
        channel = relay_channel(event)
        if channel is not None:
            assert channel in RELAY_FUNCTION and RELAY_FUNCTION[channel] in model.resources, path.name
        elif "RequestType" in event:  # a CloudFormation custom resource request, for the migration function
            assert event["ResourceProperties"]["ServiceToken"] == event["ServiceToken"], path.name
            assert model.resources[event["LogicalResourceId"]]["Type"] == event["ResourceType"], path.name
        elif "Records" in event:  # an SES event as its SNS destination delivers it, for the feedback function
            assert event["Records"][0]["EventSource"] == "aws:sns", path.name
        else:
            assert event["action"] in {"maintenance", "redrive"}, path.name
    assert {"relay-redis-scheduler.json", "eventbridge-scheduled-event.json"} <= set(RELAY_EVENTS)
    # and every function of the template has a sample to be invoked with (tests/sam_local invokes each)
    covered = {f for path in EVENTS.glob("*.json") for f in functions_for(load(path))}
    assert covered == set(model.of_type("AWS::Serverless::Function"))


# --------------------------------------------------------------------------
# Each relay event through the real handler
# --------------------------------------------------------------------------

@pytest.mark.parametrize("sample", RELAY_EVENTS)
def test_relay_event_runs_through_the_handler(sample, relay_env, request, app_engine, redis_client, redis_prefix,
                                              capsys, monkeypatch) -> None:
    # Given a relay for the event's channel, and messages waiting for it
    event = load(EVENTS / sample)
    channel = relay_channel(event)
    monkeypatch.setenv("OUTBOX_CHANNEL", channel)
    if channel == "ses":
        server = request.getfixturevalue("ses")
        monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", server.url)
        monkeypatch.setenv("OUTBOX_SES_FROM", SENDER)
    downstream = None
    if channel in AWS_CHANNELS:
        # moto (the SES fixture's server serves every service) holds what infra/sam-env.json names
        server = request.getfixturevalue("ses")
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
        for name, value in SAM_ENV[RELAY_FUNCTION[channel]].items():
            monkeypatch.setenv(name, value.replace("http://moto:5000", server.url))
        downstream = Downstream(channel, server.url)
    target = seed(channel, app_engine, redis_prefix)

    # When the handler gets the sample event
    summary = load_handler("relay")(event, LocalContext(60))

    # Then everything was delivered, and the downstream has it
    assert (summary["channel"], summary["claimed"], summary["delivered"], summary["dead"]) == (channel, 3, 3, 0)
    assert statuses(app_engine) == [(channel, "delivered", True)] * 3
    if channel == "redis":
        assert redis_client.xlen(target) == 3
    elif downstream is not None:
        received = downstream.receive(3)
        assert sorted(r.payload["n"] for r in received) == [0, 1, 2]
        assert {r.type for r in received} == {"order.placed"}
    else:
        sent = request.getfixturevalue("ses").sent_messages()
        assert sorted(d for m in sent for d in m.destinations["ToAddresses"]) == [
            f"customer{i}@example.net" for i in range(3)]
    # and the metrics carry the dimensions the template's alarms watch
    assert_emf_matches_the_template(emf_documents(capsys.readouterr().out), channel, namespace=None)


# --------------------------------------------------------------------------
# `sam local invoke`, without Docker
# --------------------------------------------------------------------------

def local_invoke_settings() -> dict[str, Any]:
    return tomllib.loads((ROOT / "samconfig.toml").read_text())["default"]["local_invoke"]["parameters"]


@functools.cache
def sam_functions() -> Any:
    """SAM CLI's view of the template's functions under samconfig.toml's local parameter overrides."""
    from samcli.lib.providers.sam_function_provider import SamFunctionProvider
    from samcli.lib.providers.sam_stack_provider import SamLocalStackProvider

    overrides = dict(item.split("=", 1) for item in local_invoke_settings()["parameter_overrides"].split())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # inside SAM CLI's template validation
        stacks, _ = SamLocalStackProvider.get_stacks(str(ROOT / "template.yaml"), parameter_overrides=overrides)
        return SamFunctionProvider(stacks)


def sam_local_environment(function: str) -> dict[str, str]:
    """The environment `sam local invoke <function>` gives the function with
    samconfig.toml's local_invoke settings, computed by SAM CLI's own code."""
    from samcli.local.lambdafn.env_vars import EnvironmentVariables

    local = local_invoke_settings()
    fn = sam_functions().get(function)
    assert fn is not None, f"sam local invoke would not find {function}"
    env_file = load(ROOT / local["env_vars"])
    declared = fn.environment["Variables"]
    for scope in ("Parameters", function):
        undeclared = set(env_file.get(scope, {})) - set(declared)
        assert not undeclared, f"sam local invoke ignores {undeclared} ({scope}): template.yaml does not declare them"
    values = {**env_file.get("Parameters", {}), **env_file.get(function, {})}
    return EnvironmentVariables(fn.name, fn.memory, fn.timeout, fn.handler, fn.logging_config,
                                variables=declared, shell_env_values={}, override_values=values,
                                aws_creds={"region": "us-east-1", "key": "testing", "secret": "testing"}).resolve()


def test_start_lambda_has_the_settings_of_invoke() -> None:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())["default"]
    assert config["local_start_lambda"]["parameters"] == local_invoke_settings()


def test_sam_env_points_at_the_compose_services() -> None:
    compose = yaml.safe_load((ROOT / "infra" / "docker-compose.yml").read_text())
    network = compose["networks"]["default"]["name"]
    assert local_invoke_settings()["docker_network"] == network
    env_file = load(ROOT / "infra" / "sam-env.json")
    urls = [env_file["Parameters"]["DATABASE_URL"], env_file["RelayRedisFunction"]["REDIS_URL"],
            env_file["Parameters"]["AWS_ENDPOINT_URL"]]
    for url in urls:
        parts = urlsplit(url)
        service = compose["services"][parts.hostname]
        assert any(str(p).endswith(f":{parts.port}") for p in service["ports"]), url
    assert compose["services"]["postgres"]["environment"]["POSTGRES_DB"] == urlsplit(urls[0]).path.lstrip("/")
    assert f"--verify {SENDER}" in " ".join(compose["services"]["moto"]["command"])


@pytest.mark.parametrize("channel", ["redis", *(pytest.param(c, marks=pytest.mark.slow)  # a process each
                                                 for c in ("ses", *AWS_CHANNELS))])
def test_sam_local_invoke_environment_runs_the_handler(channel, request, database_url, servers, app_engine,
                                                       redis_client, redis_prefix) -> None:
    # Given the environment sam local invoke would give the function, with the
    # compose services replaced by this test's servers
    env = sam_local_environment(RELAY_FUNCTION[channel])
    assert env["OUTBOX_CHANNEL"] == channel and env["AWS_SAM_LOCAL"] == "true"
    env["DATABASE_URL"] = database_url
    env["REDIS_URL"] = servers.redis_url
    downstream = None
    if channel == "ses":
        server = request.getfixturevalue("ses")
        env["AWS_ENDPOINT_URL"] = server.url
        assert SENDER in env["OUTBOX_SES_FROM"]
    elif channel in AWS_CHANNELS:
        server = request.getfixturevalue("ses")
        env["AWS_ENDPOINT_URL"] = server.url
        env.update({k: v.replace("http://moto:5000", server.url) for k, v in env.items() if k.startswith("OUTBOX_")})
        downstream = Downstream(channel, server.url)
    env["PATH"] = os.environ.get("PATH", "")
    target = seed(channel, app_engine, redis_prefix)

    # When `outbox relay --event` runs the handler on the schedule's sample event
    sample = EVENTS / f"relay-{channel}-scheduler.json"
    proc = subprocess.run([sys.executable, "-m", "outbox_tools.cli", "relay", "--event", str(sample)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout

    # Then it delivered, and its metrics are in the template's namespace with the alarms' dimensions
    summary = json.loads(proc.stdout)  # the summary alone; logs and EMF go to stderr
    assert (summary["claimed"], summary["delivered"]) == (3, 3)
    assert statuses(app_engine) == [(channel, "delivered", True)] * 3
    if channel == "redis":
        assert redis_client.xlen(target) == 3
    elif downstream is not None:
        assert sorted(r.payload["n"] for r in downstream.receive(3)) == [0, 1, 2]
    else:
        assert len(request.getfixturevalue("ses").sent_messages()) == 3
    assert_emf_matches_the_template(emf_documents(proc.stderr), channel, namespace="OutboxRelay/prod")


def test_outbox_local_creates_the_destinations_sam_env_names(ses) -> None:
    # Given moto emptied, when outbox local's bridges prepare it
    from outbox_tools.sam_local.bridges import create_aws_destinations
    from support.aws_downstream import BUS, QUEUE_NAME, STREAM_ARN, TOPIC_ARN, client

    create_aws_destinations(ROOT, ses.url, ses.region)
    create_aws_destinations(ROOT, ses.url, ses.region)  # twice: as start-lambda and invoke may
    # Then each relay's gate call finds its destination
    client("sqs", ses.url).get_queue_url(QueueName=QUEUE_NAME)
    client("sns", ses.url).get_topic_attributes(TopicArn=TOPIC_ARN)
    client("events", ses.url).describe_event_bus(Name=BUS)
    client("kinesis", ses.url).describe_stream_summary(StreamARN=STREAM_ARN)


def test_outbox_local_says_what_moto_recorded_for_each_aws_relay(ses) -> None:
    # Given the destinations outbox local prepares, and one message sent to each as its relay sends
    from outbox_tools.sam_local.bridges import aws_recorded, create_aws_destinations
    from support.aws_downstream import BUS, QUEUE_NAME, STREAM_ARN, TOPIC_ARN, client

    create_aws_destinations(ROOT, ses.url, ses.region)
    assert set(aws_recorded(ROOT, ses.url, ses.region).values()) == {
        f"SQS (moto) holds 0 message(s) in {QUEUE_NAME}",
        f"SNS (moto) delivered 0 message(s) from {TOPIC_ARN.rsplit(':', 1)[1]} to a queue subscribed to it",
        f"EventBridge (moto) recorded 0 event(s) on {BUS}",
        f"Kinesis (moto) holds 0 record(s) in {STREAM_ARN.rsplit('/', 1)[1]}"}
    sqs = client("sqs", ses.url)
    sqs.send_message(QueueUrl=sqs.get_queue_url(QueueName=QUEUE_NAME)["QueueUrl"], MessageBody="{}")
    client("sns", ses.url).publish(TopicArn=TOPIC_ARN, Message="{}")
    client("events", ses.url).put_events(Entries=[{"Source": "shop", "DetailType": "t", "Detail": "{}",
                                                   "EventBusName": BUS}])
    client("kinesis", ses.url).put_record(StreamName=STREAM_ARN.rsplit("/", 1)[1], Data=b"{}", PartitionKey="k")
    # Then each relay's line says what arrived
    notes = aws_recorded(ROOT, ses.url, ses.region)
    assert [notes[f].split(" ")[3] for f in ("RelaySqsFunction", "RelaySnsFunction", "RelayEventBridgeFunction",
                                              "RelayKinesisFunction")] == ["1", "1", "1", "1"], notes


@pytest.mark.slow  # a process
def test_sam_local_invoke_environment_runs_the_feedback_handler(database_url, app_engine) -> None:
    # Given the environment sam local invoke would give the feedback function (a key in place of the secret)
    env = sam_local_environment("FeedbackFunction")
    assert env["OUTBOX_SES_ADDRESS_KEY"] and env["OUTBOX_SES_ADDRESS_KEY_SECRET_ARN"] == ""
    env["DATABASE_URL"] = database_url
    env["PATH"] = os.environ.get("PATH", "")
    # and the message the samples are about
    message = json.loads(load(EVENTS / "feedback-bounce.json")["Records"][0]["Sns"]["Message"])
    from outbox_relay.producer import enqueue_email

    with app_engine.begin() as conn:
        enqueue_email(conn, to=["bounce@simulator.amazonses.com"], subject="s", text="t",
                      message_id=message["mail"]["tags"]["outbox-message-id"][0])

    # When `outbox relay --function feedback` runs the handler on the Bounce sample
    proc = subprocess.run([sys.executable, "-m", "outbox_tools.cli", "relay", "--function", "feedback", "--event",
                           str(EVENTS / "feedback-bounce.json")], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout

    # Then the bounce is recorded and its address suppressed, as a hash
    summary = json.loads(proc.stdout)
    assert (summary["recorded"], summary["suppressed"], summary["refused"]) == (1, 1, [])
