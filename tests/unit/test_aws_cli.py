"""`outbox enqueue-sqs`, `enqueue-sns` and `enqueue-eventbridge` with bad input: one line
naming the option or the message's field, exit status 2, no traceback, nothing written
(decision 0014). The database is a stand-in that records statements: no socket."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from click.testing import CliRunner
from test_enqueue_validation import RecordingConnection

from outbox_tools.cli import common, main


class RecordingEngine:
    def __init__(self):
        self.conn = RecordingConnection()
        self.disposed = False

    @contextlib.contextmanager
    def begin(self):
        yield self.conn

    def dispose(self):
        self.disposed = True


@pytest.fixture
def engine(monkeypatch):
    e = RecordingEngine()
    monkeypatch.setattr(common, "engine", lambda: e)
    return e


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click 8.1
    except TypeError:  # click 8.2 keeps standard error apart and dropped the argument
        return CliRunner()


REQUIRED = ["--type", "order.placed", "--payload", '{"order_id": "1042"}']

ROWS = [
    # (command, extra arguments, what the one line must contain)
    ("enqueue-sqs", ["--payload", "{nope"], "--payload"),
    ("enqueue-sqs", ["--payload", "@/nonexistent/order.json"], "--payload"),
    ("enqueue-sqs", ["--type", " "], "type:"),
    ("enqueue-sqs", ["--key", ""], "key:"),
    ("enqueue-sqs", ["--message-id", "nope"], "message_id:"),
    ("enqueue-sqs", ["--max-attempts", "x"], "--max-attempts"),
    ("enqueue-sqs", ["--max-attempts", "0"], "max_attempts:"),
    ("enqueue-sqs", ["--deliver-at", "tomorrow"], "--deliver-at"),
    ("enqueue-sqs", ["--deliver-at", "2030-01-01T00:00:00"], "deliver_at:"),
    ("enqueue-sqs", ["--header", "no-equals-sign"], "--header"),
    ("enqueue-sqs", ["--header", "=value"], "--header"),
    ("enqueue-sqs", ["--header", "tenant="], "headers.tenant:"),
    ("enqueue-sqs", ["--header", "outbox-type=x"], "headers.outbox-type:"),
    ("enqueue-sqs", ["--payload", '"\\ufffe"'], "payload:"),
    ("enqueue-sqs", ["--payload", '{"x": NaN}'], "payload:"),
    ("enqueue-sns", ["--payload", "{nope"], "--payload"),
    ("enqueue-sns", ["--type", ""], "type:"),
    ("enqueue-sns", ["--key", ""], "key:"),
    ("enqueue-sns", ["--header", "AWS.trace=x"], "headers.AWS.trace:"),
    # eight headers: one more than the attributes leave for them
    ("enqueue-sns", [a for i in range(8) for a in ("--header", f"h{i}=v")], "headers:"),
    ("enqueue-sns", ["--deliver-at", "9999-01-01T00:00:00+00:00"], "deliver_at:"),
    ("enqueue-eventbridge", ["--payload", "[1, 2]"], "payload:"),
    ("enqueue-eventbridge", ["--payload", '{"outbox-message-id": "x"}'], "payload.outbox-message-id:"),
    ("enqueue-eventbridge", ["--source", "aws.ec2"], "source:"),
    ("enqueue-eventbridge", ["--source", ""], "source:"),
    ("enqueue-eventbridge", ["--bus", "my bus"], "bus:"),
    ("enqueue-eventbridge", ["--key", ""], "key:"),
    ("enqueue-eventbridge", ["--message-id", "nope"], "message_id:"),
    ("enqueue-eventbridge", ["--max-attempts", "0"], "max_attempts:"),
    ("enqueue-eventbridge", ["--deliver-at", "2030-01-01T00:00:00"], "deliver_at:"),
]


@pytest.mark.parametrize(("command", "extra", "says"), ROWS,
                         ids=[f"{c} {' '.join(e)[:30]}" for c, e, _ in ROWS])
def test_bad_input_is_one_line_and_exit_status_2_and_nothing_is_written(engine, command, extra, says):
    # When the command runs with one bad value (later options win over the required ones)
    result = _runner().invoke(main, [command, *REQUIRED, *extra])
    # Then it exits with the usage status, one line naming the option or field, no traceback
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("Usage: ", "Try '"))]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    # And nothing was written
    assert engine.conn.calls == []


@pytest.mark.parametrize(("command", "extra", "channel", "destination"), [
    ("enqueue-sqs", ["--key", "customer-77", "--header", "tenant=shop-eu"], "sqs", "(relay)"),
    ("enqueue-sns", ["--header", "tenant=shop-eu"], "sns", "(relay)"),
    ("enqueue-eventbridge", ["--source", "shop.orders", "--bus", "shop"], "eventbridge", "shop"),
])
def test_good_input_writes_one_message_and_prints_its_id(engine, command, extra, channel, destination):
    result = _runner().invoke(main, [command, *REQUIRED, *extra])
    assert result.exit_code == 0, result.stderr
    (_, row), = engine.conn.calls
    assert str(row["message_id"]) == result.stdout.strip() and uuid.UUID(result.stdout.strip())
    assert (row["channel"], row["destination"], row["payload"]) == (channel, destination, '{"order_id":"1042"}')
    assert engine.disposed
