"""The producer examples of docs/producers.md, run as a user runs them: the Node
script (`pg` from npm, installed by `npm ci` in examples/node) and the psql
script, against this test's database; then the real relay handler delivers what
they wrote, to the Redis stream and to SES on moto."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from outbox_relay import runtime
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from outbox_tools.local_ses import LocalSesServer

EXAMPLES = project_root() / "examples"
EVENTS = project_root() / "events"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def libpq_url(database_url: str) -> str:
    """The test database's URL as libpq and node-postgres read it (a pg8000 socket
    path, from the embedded server, becomes the `host` parameter)."""
    url = make_url(database_url)
    sock = url.query.get("unix_sock")
    url = url.set(drivername="postgresql", query={})
    if sock:
        return url.render_as_string(hide_password=False) + f"?host={Path(sock).parent}"
    return url.render_as_string(hide_password=False)


def run(args: list[str], cwd: Path, database_url: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["DATABASE_URL"] = libpq_url(database_url)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def node_example(args: list[str], database_url: str) -> subprocess.CompletedProcess:
    if shutil.which("node") is None:
        pytest.skip("node is not installed (.ci/run uses the machine's node and npm)")
    if not (EXAMPLES / "node" / "node_modules" / "pg").is_dir():
        pytest.skip("the Node example's packages are not installed: run `npm ci` in examples/node")
    return run(["node", "enqueue.js", *args], EXAMPLES / "node", database_url)


def psql_example(variables: dict[str, str], database_url: str) -> subprocess.CompletedProcess:
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed (.ci/run installs postgresql-client)")
    args = ["psql", "-X", "-q", libpq_url(database_url), "-f", "enqueue.sql"]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    return run(args, EXAMPLES / "psql", database_url)


@pytest.fixture
def local_ses():
    with LocalSesServer(max_send_rate=30) as server:
        server.verify("noreply@shop.example")
        yield server


def relay(monkeypatch, channel: str, **env: str) -> dict:
    """One batch-mode invocation of the real relay handler for `channel`."""
    monkeypatch.setenv("OUTBOX_CHANNEL", channel)
    monkeypatch.setenv("OUTBOX_MODE", "batch")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    runtime.reset()
    event = json.loads((EVENTS / f"relay-{channel}-scheduler.json").read_text())
    return load_handler("relay")(event, LocalContext(60))


def deliver_both(monkeypatch, local_ses, redis_client, stream: str) -> tuple[list, list]:
    """Run the relay for Redis, then for SES on moto; return the stream's entries and the sent emails."""
    assert relay(monkeypatch, "redis")["delivered"] == 1
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    assert relay(monkeypatch, "ses", OUTBOX_SES_FROM="Shop <noreply@shop.example>",
                 AWS_ENDPOINT_URL_SESV2=local_ses.url, AWS_ACCESS_KEY_ID="testing",
                 AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                 AWS_REGION="us-east-1")["delivered"] == 1
    return redis_client.xrange(stream), local_ses.sent_messages()


def test_the_node_example_enqueues_in_its_transaction_and_the_relay_delivers_both(
        relay_env, monkeypatch, database_url, redis_client, redis_prefix, local_ses):
    # Given the Node example run against this database
    stream = redis_prefix + "orders"
    done = node_example(["--stream", stream, "--to", "Buyer <buyer@example.com>", "--order", "7",
                         "--traceparent", TRACEPARENT], database_url)
    assert done.returncode == 0, done.stderr
    ids = json.loads(done.stdout)

    # When the relay runs for each channel
    entries, sent = deliver_both(monkeypatch, local_ses, redis_client, stream)

    # Then the event is on the stream, with its key and the producer's trace context
    [(_, fields)] = entries
    assert (fields["id"], fields["type"], fields["key"]) == (ids["event_id"], "order.placed", "order-7")
    assert json.loads(fields["payload"]) == {"order_id": 7, "total": 42.5}
    assert fields["traceparent"] == TRACEPARENT and json.loads(fields["headers"])["traceparent"] == TRACEPARENT
    # And SES (moto) recorded the email to the buyer
    [mail] = sent
    assert mail.destinations["ToAddresses"] == ["Buyer <buyer@example.com>"]
    assert mail.subject == "Order 7 confirmed"


def test_the_psql_example_enqueues_in_its_transaction_and_the_relay_delivers_both(
        relay_env, monkeypatch, database_url, redis_client, redis_prefix, local_ses):
    stream = redis_prefix + "orders"
    done = psql_example({"stream": stream, "to": "buyer@example.com", "order": "8"}, database_url)
    assert done.returncode == 0, done.stderr
    ids = dict(line.split(" ", 1) for line in done.stdout.splitlines())

    entries, sent = deliver_both(monkeypatch, local_ses, redis_client, stream)

    [(_, fields)] = entries
    assert (fields["id"], fields["key"]) == (ids["event_id"], "order-8")
    assert json.loads(fields["payload"]) == {"order_id": 8, "total": 42.50}
    [mail] = sent
    assert mail.destinations["ToAddresses"] == ["buyer@example.com"] and mail.subject == "Order 8 confirmed"


@pytest.mark.parametrize("example", ["node", "psql"])
def test_a_refused_field_is_one_line_and_the_business_write_is_rolled_back_too(example, database_url, app_engine):
    if example == "node":
        done = node_example(["--to", "not an address"], database_url)
        expected_status = 2
    else:
        done = psql_example({"to": "not an address"}, database_url)
        expected_status = 3  # psql's status for an error under ON_ERROR_STOP
    assert done.returncode == expected_status
    [line] = done.stderr.strip().splitlines()
    assert "to[0]: " in line and "Traceback" not in line
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one() == 0
