"""Every function of template.yaml in a Lambda container, through the SAM
CLI's own emulator, on the machine's PostgreSQL and Redis and on moto for SES:
`sam local invoke` with each matching file in events/, `sam local
start-lambda` invoked twice through boto3's Lambda client, and the layer
under /opt as what the functions import. The assertions are those of the
in-process tests (tests/e2e): rows, stream entries, what moto recorded, the
response CloudFormation would get. Everything runs through the code of
`outbox local` (outbox_tools.sam_local), and `outbox local invoke` itself runs
as a user runs it. How the containers reach the services and why the build is
for this machine's architecture: decisions 0024 and 0039.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from outbox_migrations import current_revision, head_revision, upgrade
from outbox_tools.redis_nodes import free_port
from outbox_tools.sam_local.sam import StartLambda, invoke
from outbox_tools.servers import drop_database, with_database
from support.aws_downstream import AWS_CHANNELS, Downstream
from support.events import (
    EVENTS,
    RELAY_FUNCTION,
    assert_emf_matches_the_template,
    counts,
    emf_documents,
    functions_for,
    load,
    relay_channel,
    seed,
    seed_rows,
    statuses,
)
from support.template import ROOT, TemplateModel

pytestmark = pytest.mark.sam_local

SAMPLES = sorted((function, path.name) for path in EVENTS.glob("*.json") for function in functions_for(load(path)))
NAMESPACE = "OutboxRelay/prod"  # the template's, for EnvironmentName's default
MIGRATION_TABLES = {"outbox_message", "outbox_message_body", "outbox_alembic_version"}


def assert_ran(done) -> None:
    """The invocation returned a result, not an error."""
    assert not done.failed, f"{done.result}\n{done.logs[-3000:]}"


def samples_of(function: str) -> list[str]:
    return [name for f, name in SAMPLES if f == function]


@pytest.fixture
def run(invoke_image, build_dir, python312, host_services):
    """`sam local invoke FUNCTION` with a sample event on the database `database_url`."""
    def run_it(function: str, event: dict[str, Any], database_url: str):
        return invoke(function, event, host_services.environment(database_url), root=ROOT, build_dir=build_dir,
                      image=invoke_image, python312=python312, timeout=300)
    return run_it


# --------------------------------------------------------------------------
# What is built and invoked
# --------------------------------------------------------------------------

def test_every_function_of_the_template_is_invoked_with_its_samples() -> None:
    functions = set(TemplateModel(every_condition=True).of_type("AWS::Serverless::Function"))
    assert {f for f, _ in SAMPLES} == functions


# --------------------------------------------------------------------------
# sam local invoke: every function with every matching sample
# --------------------------------------------------------------------------

@pytest.mark.parametrize("sample", samples_of("RelayRedisFunction"))
def test_redis_relay_in_a_container(sample, run, database_url, app_engine, redis_client, redis_prefix) -> None:
    # Given messages waiting for the Redis relay
    stream = seed("redis", app_engine, redis_prefix)
    # When sam local invoke runs the function on the sample event
    done = run("RelayRedisFunction", load(EVENTS / sample), database_url)
    # Then it returned its summary, the rows are delivered and the entries are in the stream
    assert_ran(done)
    summary = done.result
    assert (summary["channel"], summary["claimed"], summary["delivered"], summary["dead"]) == ("redis", 3, 3, 0)
    assert statuses(app_engine) == [("redis", "delivered", True)] * 3
    entries = redis_client.xrange(stream)
    assert [json.loads(fields["payload"]) for _, fields in entries] == [{"n": i} for i in range(3)]
    assert_emf_matches_the_template(emf_documents(done.logs), "redis", namespace=NAMESPACE)


@pytest.mark.parametrize("sample", samples_of("RelaySesFunction"))
def test_ses_relay_in_a_container(sample, run, database_url, app_engine, redis_prefix, ses) -> None:
    seed("ses", app_engine, redis_prefix)
    done = run("RelaySesFunction", load(EVENTS / sample), database_url)
    assert_ran(done)
    assert (done.result["channel"], done.result["claimed"], done.result["delivered"]) == ("ses", 3, 3)
    assert statuses(app_engine) == [("ses", "delivered", True)] * 3
    sent = ses.sent_messages()
    assert sorted(d for m in sent for d in m.destinations["ToAddresses"]) == [
        f"customer{i}@example.net" for i in range(3)]
    assert {m.source for m in sent} == {"Outbox <outbox@example.com>"}
    assert_emf_matches_the_template(emf_documents(done.logs), "ses", namespace=NAMESPACE)


#: The reference each AWS relay records as delivered: the service's own message or event id.
DELIVERY_REF = {"sqs": "sqs:", "sns": "sns:", "eventbridge": "eventbridge:", "kinesis": "kinesis:"}


@pytest.mark.parametrize(("channel", "sample"), [(c, s) for c in AWS_CHANNELS for s in samples_of(RELAY_FUNCTION[c])])
def test_aws_batch_relay_in_a_container(channel, sample, run, database_url, app_engine, redis_prefix, moto) -> None:
    # Given messages waiting for the relay, and in moto what infra/sam-env.json names
    # (the queue; the topic, a queue subscribed to it; the bus, a rule sending to a queue)
    downstream = Downstream(channel, moto.url)
    seed(channel, app_engine, redis_prefix)
    # When sam local invoke runs the function on the sample event, moto at AWS_ENDPOINT_URL
    done = run(RELAY_FUNCTION[channel], load(EVENTS / sample), database_url)
    # Then it returned its summary, and the rows are delivered with the service's id as their reference
    assert_ran(done)
    summary = done.result
    assert (summary["channel"], summary["claimed"], summary["delivered"], summary["dead"]) == (channel, 3, 3, 0)
    with app_engine.connect() as conn:
        rows = conn.execute(text("SELECT message_id::text, status, delivery_ref FROM outbox_message")).all()
    assert {status for _, status, _ in rows} == {"delivered"}
    assert all(ref.startswith(DELIVERY_REF[channel]) for _, _, ref in rows), rows
    # and the reader got each message once, with its payload, type and message id
    received = downstream.receive(3)
    assert sorted(r.payload["n"] for r in received) == [0, 1, 2]
    assert {r.type for r in received} == {"order.placed"}
    assert sorted(r.message_id for r in received) == sorted(m for m, _, _ in rows)
    assert_emf_matches_the_template(emf_documents(done.logs), channel, namespace=NAMESPACE)


@pytest.mark.parametrize("sample", samples_of("MaintenanceFunction"))
def test_maintenance_in_a_container(sample, run, database_url, app_engine) -> None:
    event = load(EVENTS / sample)
    if event.get("action") == "redrive":
        # Given dead letters of several classes; the sample redrives the Redis relay's transient ones
        seed_rows(app_engine, 2, "dead", ago=600, error_class="transient")
        seed_rows(app_engine, 1, "dead", ago=600, error_class="permanent")
        done = run("MaintenanceFunction", event, database_url)
        assert_ran(done)
        assert done.result["redrive"]["moved"] == 2
        assert counts(app_engine) == {("redis", "pending"): 2, ("redis", "dead"): 1}
    else:
        # Given rows past their retention windows and recent ones
        seed_rows(app_engine, 3, "delivered", ago=10 * 86400)
        seed_rows(app_engine, 1, "delivered", ago=3600)
        seed_rows(app_engine, 2, "dead", ago=40 * 86400, error_class="permanent")
        seed_rows(app_engine, 1, "pending", available_ago=300)
        done = run("MaintenanceFunction", event, database_url)
        assert_ran(done)
        assert (done.result["purged"]["delivered"], done.result["purged"]["dead"]) == (3, 2)
        assert counts(app_engine) == {("redis", "delivered"): 1, ("redis", "pending"): 1}
    emf = emf_documents(done.logs)
    # the backlog of every registered channel, beside the storage's document (partitions, size)
    assert {doc["channel"] for doc in emf if "channel" in doc} == set(RELAY_FUNCTION)
    assert {doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] for doc in emf} == {NAMESPACE}


@pytest.mark.parametrize("sample", samples_of("FeedbackFunction"))
def test_feedback_in_a_container(sample, run, database_url, app_engine) -> None:
    # Given the email the samples are about, sent as the samples' SES message id
    event = load(EVENTS / sample)
    message = json.loads(event["Records"][0]["Sns"]["Message"])
    from outbox_relay.producer import enqueue_email

    with app_engine.begin() as conn:
        enqueue_email(conn, to=["customer@example.net"], subject="s", text="t",
                      message_id=uuid.UUID(message["mail"]["tags"]["outbox-message-id"][0]))
        conn.execute(text("UPDATE outbox_message SET status = 'delivered', delivered_at = now(), "
                          "delivery_ref = :ses"), {"ses": message["mail"]["messageId"]})
    # When sam local invoke runs the feedback function on the sample
    done = run("FeedbackFunction", event, database_url)
    # Then the event is recorded against the message, and nothing was refused
    assert_ran(done)
    assert (done.result["recorded"], done.result["refused"]) == (1, [])
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_email_event")).scalar_one() == 1


def _tables_and_revision(url: str) -> tuple[set[str], str | None]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        return set(inspect(engine).get_table_names()) & MIGRATION_TABLES, current_revision(engine)
    finally:
        engine.dispose()


@pytest.mark.parametrize("sample", samples_of("MigrationFunction"))
def test_migration_in_a_container_answers_cloudformation(sample, run, empty_database_url, cfn) -> None:
    # Given the database each request meets: empty for Create, at an old revision
    # for Update, migrated for Delete
    event = {**load(EVENTS / sample), "ResponseURL": cfn.url(f"/cfn/{sample}")}
    engine = create_engine(empty_database_url, poolclass=NullPool)
    if event["RequestType"] == "Update":
        upgrade(engine, "0001")
    elif event["RequestType"] == "Delete":
        upgrade(engine)
    engine.dispose()
    before = _tables_and_revision(empty_database_url)[1]

    # When sam local invoke runs the migration function on the request
    done = run("MigrationFunction", event, empty_database_url)

    # Then the schema is at head (Delete keeps it) and CloudFormation got SUCCESS
    assert_ran(done)
    assert _tables_and_revision(empty_database_url) == (MIGRATION_TABLES, head_revision())
    (response,) = cfn.wait_for(1)
    assert response.path == f"/cfn/{sample}" and response.body == done.result
    body = response.body
    assert (body["Status"], body["PhysicalResourceId"], body["RequestId"]) == (
        "SUCCESS", "outbox-schema", event["RequestId"])
    if event["RequestType"] != "Delete":
        assert body["Data"] == {"Revision": head_revision(), "PreviousRevision": before or "none"}


# --------------------------------------------------------------------------
# What the functions import: the layers under /opt, not the checkout
# --------------------------------------------------------------------------

def _frames(error: dict[str, Any]) -> list[str]:
    return [line.split('"')[1] for line in error["stackTrace"] if line.strip().startswith("File")]


def test_the_relay_runs_the_layer_under_opt(run, database_url) -> None:
    # A refused event raises from the layer: its stack trace shows where every module came from
    done = run("RelayRedisFunction", {"source": "outbox.scheduler", "channel": "ses"}, database_url)
    error = done.result
    assert error["errorType"] == "ConfigurationError", done.logs[-3000:]
    frames = _frames(error)
    assert "/var/task/app.py" in frames
    assert "/opt/python/outbox_relay/invocation.py" in frames
    assert all(f.startswith(("/opt/python/", "/var/task/")) for f in frames), frames
    assert not any(str(ROOT) in f for f in frames)


def test_a_failed_migration_in_a_container_answers_failed_from_both_layers(run, empty_database_url, cfn) -> None:
    # Given settings the relay's layer refuses (a driver the layer does not ship)
    refused = make_url(empty_database_url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    event = {**load(EVENTS / "migrate-create.json"), "ResponseURL": cfn.url("/cfn/failed")}
    done = run("MigrationFunction", event, refused)
    # Then CloudFormation is told why in one line, and the function failed
    (response,) = cfn.wait_for(1)
    assert response.body["Status"] == "FAILED"
    assert response.body["Reason"].startswith(
        "schema migration failed: ConfigurationError: DATABASE_URL: driver must be postgresql+pg8000")
    assert "\n" not in response.body["Reason"] and done.result["errorType"] == "ConfigurationError"
    assert _tables_and_revision(empty_database_url) == (set(), None)
    frames = _frames(done.result)
    # The migrations layer's package, the relay's layer's engine, each from its place under /opt
    assert "/opt/python/outbox_migrations/custom_resource.py" in frames
    assert any(f.startswith("/opt/python/outbox_relay/") for f in frames)
    assert all(f.startswith(("/opt/python/", "/var/task/")) for f in frames), frames


# --------------------------------------------------------------------------
# sam local start-lambda: a developer's integration test through boto3
# --------------------------------------------------------------------------

def _containers(function: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter", f"label=sam.cli.function.name={function}"],
                         capture_output=True, text=True, timeout=30).stdout
    return out.split()


@pytest.fixture(scope="module")
def warm_database(servers, template_db) -> Iterator[str]:
    """A migrated database of this module's own (start-lambda's environment is fixed at start)."""
    name = f"outbox_test_samlocal_{uuid.uuid4().hex[:8]}"
    admin = create_engine(servers.database_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"'))
    admin.dispose()
    yield with_database(servers.database_url, name)
    drop_database(servers.database_url, name)


@pytest.fixture(scope="module")
def start_lambda(invoke_image, build_dir, python312, host_services, warm_database,
                 tmp_path_factory) -> Iterator[StartLambda]:
    """`sam local start-lambda` as `outbox local start-lambda` runs it; at the end it is
    stopped as Ctrl-C stops it, and the warm containers it left are removed."""
    log = tmp_path_factory.mktemp("start-lambda") / "start-lambda.log"
    with StartLambda(host_services.environment(warm_database), root=ROOT, build_dir=build_dir, image=invoke_image,
                     python312=python312, port=free_port(), output=log) as server:
        yield server
    assert _containers("RelayRedisFunction") == []


def json_logs(output: str) -> list[dict[str, Any]]:
    """The function's JSON log lines (Powertools) in an output."""
    lines = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{") and '"level"' in line:
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
    return lines


def _relay_connections(engine, database: str) -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = :db "
                                     "AND application_name = 'outbox-relay'"), {"db": database}).scalars())


def test_start_lambda_reuses_a_warm_container(start_lambda, warm_database, redis_prefix, redis_client) -> None:
    engine = create_engine(warm_database, poolclass=NullPool)
    database = warm_database.rsplit("/", 1)[1]
    client = start_lambda.client()
    event = load(EVENTS / "relay-redis-scheduler.json")
    assert relay_channel(event) == "redis"
    try:
        # Given 3 messages, when a developer's test invokes the relay through boto3
        stream = seed("redis", engine, redis_prefix)
        first = client.invoke(FunctionName="RelayRedisFunction", Payload=json.dumps(event).encode())
        summary = json.loads(first["Payload"].read())
        assert first["StatusCode"] == 200 and "FunctionError" not in first, summary
        assert (summary["claimed"], summary["delivered"]) == (3, 3)
        containers, connections = _containers("RelayRedisFunction"), _relay_connections(engine, database)

        # And again, after 2 more
        with engine.begin() as conn:
            from outbox_relay.producer import enqueue_events_bulk
            enqueue_events_bulk(conn, [dict(stream=stream, type="order.placed", payload={"n": 10 + i})
                                       for i in range(2)])
        second = client.invoke(FunctionName="RelayRedisFunction", Payload=json.dumps(event).encode())
        summary = json.loads(second["Payload"].read())
        assert (summary["claimed"], summary["delivered"]) == (2, 2)
        assert redis_client.xlen(stream) == 5
        assert statuses(engine) == [("redis", "delivered", True)] * 5

        # Then both ran in one container, on the dependencies built by the first:
        # its database connections are still those the second used
        assert len(containers) == 1 and _containers("RelayRedisFunction") == containers
        assert connections and connections <= _relay_connections(engine, database)
        # and the logs say so: the first invocation was the container's cold start, the second was not
        batches = [line for line in json_logs(start_lambda.read_output()) if line.get("message") == "relay batch done"]
        assert [(b["cold_start"], b["claimed"]) for b in batches] == [(True, 3), (False, 2)]
    finally:
        engine.dispose()


def test_the_warm_container_holds_the_built_layer_under_opt(start_lambda, build_dir) -> None:
    # The container left by the previous test (or a new one) holds the layer sam build made, file for file
    if not _containers("RelayRedisFunction"):
        client = start_lambda.client()
        client.invoke(FunctionName="RelayRedisFunction",
                      Payload=json.dumps(load(EVENTS / "relay-redis-scheduler.json")).encode())
    (container,) = _containers("RelayRedisFunction")
    listing = subprocess.run(
        ["docker", "exec", container, "sh", "-c", "cd /opt/python && find outbox_relay -type f "
         "\\( -name '*.py' -o -name '*.sql' \\) -exec sha256sum {} +"],
        capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    in_container = {path: digest for digest, path in (line.split() for line in listing.stdout.splitlines())}
    layer = build_dir / "SharedLayer" / "python"
    built = {str(p.relative_to(layer)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in (layer / "outbox_relay").rglob("*") if p.suffix in (".py", ".sql")}
    source = {str(p.relative_to(ROOT / "shared")): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in (ROOT / "shared" / "outbox_relay").rglob("*") if p.suffix in (".py", ".sql")}
    assert in_container == built == source
    # and the function's own code is the handler alone: nothing of the layer is copied beside it
    task = subprocess.run(["docker", "exec", container, "ls", "/var/task"], capture_output=True, text=True, timeout=60)
    assert task.stdout.split() == ["app.py"]
    # The checkout is not mounted anywhere in the container
    mounts = subprocess.run(["docker", "inspect", "--format", "{{json .Mounts}}", container],
                            capture_output=True, text=True, timeout=60)
    mounted = {m["Destination"]: Path(m["Source"]) for m in json.loads(mounts.stdout)}
    assert mounted == {"/var/task": build_dir / "RelayRedisFunction"}


# --------------------------------------------------------------------------
# outbox local invoke: the command a user runs, as a process
# --------------------------------------------------------------------------

def _outbox_local(args: list[str], database_url: str, redis_url: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_", "OUTBOX_", "AWS_"))}
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url)
    return subprocess.run([sys.executable, "-m", "outbox_tools.cli", "local", "invoke", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def test_outbox_local_invoke_prints_the_relays_summary(docker, invoke_image, build_dir, servers, database_url,
                                                       app_engine, redis_client, redis_prefix) -> None:
    # Given messages waiting for the Redis relay
    stream = seed("redis", app_engine, redis_prefix)
    # When a user runs `outbox local invoke RelayRedisFunction` (its sample event by default)
    proc = _outbox_local(["RelayRedisFunction"], database_url, servers.redis_url)
    # Then standard output is the function's summary alone, and the messages are in the stream
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert (summary["channel"], summary["claimed"], summary["delivered"]) == ("redis", 3, 3)
    assert redis_client.xlen(stream) == 3
    assert statuses(app_engine) == [("redis", "delivered", True)] * 3
    # and standard error says what it used and how long the function took, with no traceback
    assert "outbox local: RelayRedisFunction returned in" in proc.stderr and "Traceback" not in proc.stderr
    # Docker was running before it, so it is running after it
    assert subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def test_outbox_local_invoke_puts_the_kinesis_relays_records_on_its_stream(docker, invoke_image, build_dir, servers,
                                                                          database_url, app_engine, redis_prefix) -> None:
    # Given records waiting for the Kinesis relay
    seed("kinesis", app_engine, redis_prefix)
    # When a user runs `outbox local invoke RelayKinesisFunction`, whose moto gets the stream sam-env.json names
    proc = _outbox_local(["RelayKinesisFunction"], database_url, servers.redis_url)
    # Then the relay delivered them, and the stream holds them (read back with GetRecords)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert (summary["channel"], summary["claimed"], summary["delivered"]) == ("kinesis", 3, 3)
    assert statuses(app_engine) == [("kinesis", "delivered", True)] * 3
    assert "Kinesis (moto) holds 3 record(s) in outbox-local" in proc.stderr, proc.stderr[-3000:]


def test_outbox_local_invoke_answers_cloudformation_for_the_migration(docker, invoke_image, build_dir, servers,
                                                                      empty_database_url) -> None:
    # Given an empty database, when a user invokes the migration function on its Create sample
    proc = _outbox_local(["MigrationFunction", "--event", "events/migrate-create.json"], empty_database_url,
                         servers.redis_url)
    # Then the sample's ResponseURL was pointed at the command's own server, which got SUCCESS,
    # and the result printed is that answer
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout)
    assert (answer["Status"], answer["Data"]["Revision"]) == ("SUCCESS", head_revision())
    assert "CloudFormation's response URL got SUCCESS" in proc.stderr
    assert _tables_and_revision(empty_database_url) == (MIGRATION_TABLES, head_revision())
