"""Every wrong setting or input gets a clear answer, and nothing is written.

Two tables: every option of the `outbox` command, and every environment
variable the relay reads (`config.variables()`, and each variable
docs/configuration.md lists), each with bad values. For every row: exit status
2 for a bad option, 1 for a bad setting or a database that cannot serve; one
line on standard error, `Error: …`, naming the option or variable (click's
`Usage:` and `Try` lines aside); no traceback; and the rows in PostgreSQL and the
keys in Redis exactly as they were.

A new setting or option without a row fails `test_every_variable_has_bad_values`
or `test_every_option_has_bad_values`: add its row to `ENV` or `OPTIONS`.
The commands run in this process through click's runner (what `outbox` runs),
with the settings and caches reset around each; the variables Powertools reads
when it is imported are also run as their own process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import click
import pytest
import redis as redis_lib
from click.testing import CliRunner
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from outbox_relay import runtime
from outbox_relay.config import variables
from outbox_relay.producer import enqueue_event
from outbox_tools.cli import main
from outbox_tools.lambda_local import project_root
from outbox_tools.servers import create_database, drop_database, with_database
from support.forward import Forwarder
from support.network import redis_target
from support.refusing_postgres import RefusingPostgres

ROOT = project_root()
REDIS_EVENT = str(ROOT / "events" / "relay-redis-scheduler.json")
SES_EVENT = str(ROOT / "events" / "relay-ses-scheduler.json")
#: What the SES relay needs to get as far as its settings; the endpoint is a closed
#: port, so a bad value that slipped through fails fast instead of calling AWS.
SES = {"OUTBOX_CHANNEL": "ses", "OUTBOX_SES_FROM": "Shop <noreply@shop.example>", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL_SESV2": "http://127.0.0.1:9"}
#: The same for the SQS, SNS and EventBridge relays (their settings are checked before any call).
_AWS = {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
SQS = {**_AWS, "OUTBOX_CHANNEL": "sqs", "OUTBOX_SQS_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/q"}
SNS = {**_AWS, "OUTBOX_CHANNEL": "sns", "OUTBOX_SNS_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:t"}
EVENTBRIDGE = {**_AWS, "OUTBOX_CHANNEL": "eventbridge"}
KINESIS = {**_AWS, "OUTBOX_CHANNEL": "kinesis", "OUTBOX_KINESIS_STREAM": "orders"}
NO_URL = {"DATABASE_URL": None}
#: Latency mode, whose pollers read OUTBOX_POLLER_TTL_SECONDS and OUTBOX_SUCCESSOR_LEAD_SECONDS (decision 0057).
LATENCY = {"OUTBOX_MODE": "latency"}


@dataclass(frozen=True)
class Bad:
    """A bad value of one variable: the line must contain `says`; `env` is what else the
    relay needs to reach the check (its channel, say); `command` what runs."""

    value: str
    says: str
    env: dict[str, str | None] = field(default_factory=dict)
    command: tuple[str, ...] = ("relay", "--event", REDIS_EVENT)
    secrets: bool = False  # run under moto, where no secret exists


SES_RELAY = ("relay", "--event", SES_EVENT)
#: The SES relay with the addresses' key; the feedback function on a sample SES event.
SES_KEYED = {**SES, "OUTBOX_SES_ADDRESS_KEY": "k" * 40}
FEEDBACK = ("relay", "--function", "feedback", "--event", str(ROOT / "events" / "feedback-bounce.json"))

# {variable: [bad values]}. `{unmigrated}`, `{missing}` and `{url}` in a value (and in
# `env`) are filled in with this module's databases, `{q}` with what starts one more
# query parameter of `{url}` (`?`, or `&` after an embedded server's `?unix_sock=`),
# `{tcp_redis}` with a URL of this module's Redis over TCP, `{no_socket}` with the path of
# a Unix socket where nothing listens, `{refusing}` with one where a server refuses every
# database (`support.refusing_postgres`).
ENV: dict[str, list[Bad]] = {
    "OUTBOX_CHANNEL": [Bad("kafka", "'eventbridge' or 'kinesis'")],
    "DATABASE_URL": [
        Bad("postgresqlgarbage", "not a SQLAlchemy URL"),
        Bad("postgresql+pg8000://postgres@127.0.0.1:abc/x", "port"),
        Bad("mysql://u@h/db", "driver must be postgresql+pg8000"),
        Bad("{missing}", "does not exist"),
        Bad("{unmigrated}", "run `outbox migrate`"),
        Bad("{unmigrated}", "run `outbox migrate`", command=("stats",)),
        Bad("{unmigrated}", "run `outbox migrate`", command=("relay", "--function", "maintenance", "--event",
                                                             str(ROOT / "events" / "maintenance-scheduled.json"))),
        Bad("postgresqlgarbage", "not a SQLAlchemy URL", command=("stats",)),
        Bad("{missing}", "does not exist", command=("dead", "list")),
        # pg8000 takes no libpq options: a query parameter would fail at connect
        Bad("{url}{q}sslmode=require", "DATABASE_TLS"),
        Bad("{url}{q}sslmode=require", "DATABASE_TLS", command=("stats",)),
        Bad("{url}{q}foo=bar", "'foo'"),
        # A Unix socket where no server listens (a typo in the path, a server not started)
        Bad("postgresql+pg8000://postgres@/shop?unix_sock={no_socket}", "cannot reach PostgreSQL"),
        Bad("postgresql+pg8000://postgres@/shop?unix_sock={no_socket}", "cannot reach PostgreSQL",
            command=("stats",)),
        Bad("postgresql+pg8000://postgres@/shop?unix_sock={no_socket}", "cannot reach PostgreSQL",
            command=("migrate",)),
        # outbox local reaches the database before Docker and the build, not from the container
        Bad("postgresql+pg8000://postgres@/shop?unix_sock={no_socket}", "cannot reach PostgreSQL",
            command=("local", "invoke", "RelayRedisFunction")),
        Bad("postgresql+pg8000://postgres@127.0.0.1:1/shop", "cannot reach PostgreSQL",
            command=("local", "invoke", "RelayRedisFunction")),
        # The server's refusal over a Unix socket, not the broken pipe of pg8000's goodbye after it
        Bad("postgresql+pg8000://postgres@/shop?unix_sock={refusing}", 'database "shop" does not exist'),
        Bad("postgresql+pg8000://postgres@/shop?unix_sock={refusing}", 'database "shop" does not exist',
            command=("migrate",)),
    ],
    "DATABASE_SECRET_ARN": [Bad("arn:aws:secretsmanager:us-east-1:123456789012:secret:none", "cannot read the secret",
                                env=NO_URL, secrets=True)],
    "DATABASE_IAM_AUTH": [Bad("maybe", "true or false"), Bad("true", "DATABASE_TLS")],
    "DATABASE_TLS": [Bad("maybe", "verify-full"), Bad("require", "does not accept TLS"),
                     # the `outbox` command connects as the relay does
                     Bad("maybe", "verify-full", command=("stats",)),
                     Bad("require", "does not accept TLS", command=("stats",))],
    "DATABASE_CA_BUNDLE": [Bad("/nonexistent/ca.pem", "cannot load CA bundle", env={"DATABASE_TLS": "verify-full"})],
    "DATABASE_POOL_SIZE": [Bad("0", "greater than or equal to 1"), Bad("x", "valid integer")],
    "REDIS_URL": [Bad("http://nope", "redis://"), Bad("redis://127.0.0.1:6379/notadb", "database"),
                  Bad("redis://127.0.0.1:abc/0", "port"), Bad("redis://127.0.0.1:6379/0?foo=bar", "'foo'"),
                  Bad("redis://127.0.0.1:1/0", "cannot reach Redis", command=("local", "invoke", "RelayRedisFunction"))],
    "REDIS_URL_SECRET_ARN": [Bad("arn:aws:secretsmanager:us-east-1:123456789012:secret:none",
                                 "cannot read the secret", env={"REDIS_URL": None}, secrets=True)],
    "OUTBOX_REDIS_SOCKET_TIMEOUT_SECONDS": [Bad("0", "greater than 0"), Bad("nan", "finite")],
    "OUTBOX_REDIS_DEDUPE_TTL_SECONDS": [Bad("60", "OUTBOX_LEASE_SECONDS + OUTBOX_FUNCTION_TIMEOUT_SECONDS"),
                                        Bad("x", "valid integer")],
    "OUTBOX_REDIS_MAXLEN": [Bad("99999999999999999999999", "less than or equal to 9223372036854775807"),
                            Bad("-1", "greater than or equal to 0")],
    # One row per Redis setting of issue 15 (their other bad values: tests/unit/test_config.py)
    "OUTBOX_REDIS_CLUSTER": [Bad("true", "database 0 only", env={"REDIS_URL": "redis://127.0.0.1:6379/3"}),
                             Bad("true", "not in cluster mode", env={"REDIS_URL": "{tcp_redis}"})],
    "OUTBOX_REDIS_IAM_AUTH": [Bad("true", "rediss://")],
    "OUTBOX_REDIS_IAM_CACHE_NAME": [Bad("Not A Name", "pattern")],
    "OUTBOX_REDIS_IAM_SERVERLESS": [Bad("perhaps", "true or false")],
    "OUTBOX_REDIS_TRIM": [Bad("acknowledged", "OUTBOX_REDIS_MAXLEN")],
    "OUTBOX_REDIS_ON_FULL": [Bad("drop", "'hold' or 'trim'")],
    # Issue 26: the entry layout and the CloudEvents source
    "OUTBOX_REDIS_FORMAT": [Bad("json", "'fields' or 'cloudevents'"), Bad("CloudEvents", "'fields' or 'cloudevents'")],
    "OUTBOX_CLOUDEVENTS_SOURCE": [Bad("my shop", "URI reference"),
                                  Bad("https://shop.example/" + "o" * 600, "URI reference")],
    "OUTBOX_REDIS_WAIT_REPLICAS": [Bad("6", "less than or equal to 5")],
    "OUTBOX_REDIS_WAIT_TIMEOUT_MS": [Bad("5000", "OUTBOX_REDIS_SOCKET_TIMEOUT_SECONDS",
                                         env={"OUTBOX_REDIS_WAIT_REPLICAS": "1"})],
    "OUTBOX_REDIS_MEMORY_HIGH": [Bad("nan", "finite")],
    "OUTBOX_REDIS_OOM_BACKOFF_SECONDS": [Bad("-1", "greater than or equal to 0")],
    "OUTBOX_BATCH_SIZE": [Bad("0", "greater than or equal to 1"), Bad("lots", "valid integer"),
                          # Numbers as written (decision 0057): not read as 5
                          Bad("5.0", "valid integer"), Bad(" 5 ", "valid integer")],
    "OUTBOX_BATCH_MAX_BYTES": [Bad("1", "greater than or equal to 65536")],
    "OUTBOX_LEASE_SECONDS": [Bad("30", "must be longer than OUTBOX_FUNCTION_TIMEOUT_SECONDS"), Bad("inf", "finite"),
                             Bad(" 130 ", "without spaces"), Bad("1_30", "underscores")],
    "OUTBOX_FUNCTION_TIMEOUT_SECONDS": [Bad("1000", "less than or equal to 900"), Bad("0", "greater than 0")],
    "OUTBOX_DEADLINE_MARGIN_SECONDS": [Bad("70", "must be shorter"), Bad("-1", "greater than or equal to 0")],
    "OUTBOX_MAX_ATTEMPTS": [Bad("0", "greater than or equal to 1")],
    "OUTBOX_MODE": [Bad("fast", "'batch', 'drain' or 'latency'")],
    "OUTBOX_ORDERING_ON_DEAD": [Bad("wait", "'skip' or 'block'")],
    "OUTBOX_POLL_INTERVAL_SECONDS": [Bad("0", "greater than or equal to 0.01"), Bad("nan", "finite")],
    "OUTBOX_POLL_MAX_INTERVAL_SECONDS": [Bad("0.05", "OUTBOX_POLL_INTERVAL_SECONDS"), Bad("61", "less than or equal")],
    "OUTBOX_POLLER_TTL_SECONDS": [Bad("0", "greater than or equal to 1"), Bad("x", "valid number"),
                                  Bad("nan", "finite"),
                                  Bad("5", "shorter than OUTBOX_LEASE_SECONDS", env={**LATENCY,
                                      "OUTBOX_LEASE_SECONDS": "3", "OUTBOX_FUNCTION_TIMEOUT_SECONDS": "2",
                                      "OUTBOX_DEADLINE_MARGIN_SECONDS": "1"})],
    "OUTBOX_SUCCESSOR_LEAD_SECONDS": [Bad("0", "greater than or equal to 1"),
                                      Bad("400", "at most half", env=LATENCY)],
    "OUTBOX_POLLERS": [Bad("0", "greater than or equal to 1"), Bad("2.0", "digits alone")],
    "OUTBOX_POLLERS_MAX": [Bad("51", "less than or equal to 50"),
                           Bad("1", "must be at least OUTBOX_POLLERS (2)", env={**LATENCY, "OUTBOX_POLLERS": "2"})],
    "OUTBOX_POLLERS_ADD_AGE_SECONDS": [Bad("0", "greater than or equal to 0.1"), Bad("inf", "finite")],
    # A variable no setting reads (decision 0057): a misspelt one names the setting it is near
    "OUTBOX_BATCH_SIZ": [Bad("5", "did you mean OUTBOX_BATCH_SIZE?")],
    "outbox_ordering_on_death": [Bad("block", "did you mean OUTBOX_ORDERING_ON_DEAD?")],
    "OUTBOX_TURBO": [Bad("1", "is not a setting")],
    "OUTBOX_SELF_INVOKE": [Bad("maybe", "true or false")],
    "AWS_LAMBDA_FUNCTION_NAME": [Bad("my function", "should match pattern")],
    "OUTBOX_METRICS_INTERVAL_SECONDS": [Bad("0", "greater than or equal to 1")],
    "OUTBOX_BACKOFF_BASE_SECONDS": [Bad("nan", "finite")],
    "OUTBOX_BACKOFF_CAP_SECONDS": [Bad("0.5", "OUTBOX_BACKOFF_BASE_SECONDS")],
    "OUTBOX_BACKOFF_FLOOR_SECONDS": [Bad("-1", "greater than or equal to 0"), Bad("1000", "OUTBOX_BACKOFF_CAP")],
    "OUTBOX_THROTTLE_DELAY_SECONDS": [Bad("-1", "greater than or equal to 0")],
    "OUTBOX_ERROR_MAX_CHARS": [Bad("10", "greater than or equal to 100")],
    "OUTBOX_SES_FROM": [Bad("not an address", "OUTBOX_SES_FROM", env=SES, command=SES_RELAY)],
    "OUTBOX_SES_CONFIGURATION_SET": [Bad("has space", "1-64", env=SES, command=SES_RELAY)],
    "OUTBOX_SES_MAX_CONCURRENCY": [Bad("0", "greater than or equal to 1", env=SES, command=SES_RELAY)],
    "OUTBOX_SES_RECORD_GROUP_SIZE": [Bad("0", "greater than or equal to 1", env=SES, command=SES_RELAY)],
    "OUTBOX_SES_QUOTA_DEFERRAL_SECONDS": [Bad("1e12", "less than or equal", env=SES, command=SES_RELAY)],
    "OUTBOX_SES_MAX_SEND_RATE": [Bad("0", "greater than 0", env=SES, command=SES_RELAY)],
    # SES feedback (issue 25): the relay's settings, and the feedback function's key
    "OUTBOX_SES_FEEDBACK": [Bad("maybe", "true or false", env=SES, command=SES_RELAY),
                            Bad("true", "OUTBOX_SES_CONFIGURATION_SET", env=SES_KEYED, command=SES_RELAY)],
    "OUTBOX_SES_SETTLE_SECONDS": [Bad("1", "greater than or equal to 5", env=SES, command=SES_RELAY),
                                  Bad("nan", "finite", env=SES, command=SES_RELAY)],
    "OUTBOX_SES_SUPPRESSION": [Bad("sometimes", "true or false", env=SES, command=SES_RELAY),
                               Bad("true", "OUTBOX_SES_ADDRESS_KEY", env=SES, command=SES_RELAY)],
    "OUTBOX_SES_ADDRESS_KEY": [Bad("too short", "at least 32 characters", env=SES, command=SES_RELAY),
                               Bad("too short", "at least 32 characters", command=FEEDBACK),
                               Bad("", "OUTBOX_SES_ADDRESS_KEY_SECRET_ARN", command=FEEDBACK)],
    "OUTBOX_SES_ADDRESS_KEY_SECRET_ARN": [
        Bad("not-an-arn", "pattern", env=SES, command=SES_RELAY),
        Bad("arn:aws:secretsmanager:us-east-1:123456789012:secret:none", "cannot read the secret",
            env={**SES, "OUTBOX_SES_SUPPRESSION": "true"}, command=SES_RELAY, secrets=True),
        Bad("arn:aws:secretsmanager:us-east-1:123456789012:secret:none", "cannot read the secret",
            env={"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing"}, command=FEEDBACK, secrets=True)],
    "OUTBOX_SQS_QUEUE_URL": [Bad("sqs.example/q", "must be a queue URL", env=SQS),
                             Bad("", "set the queue's URL", env=SQS)],  # empty: unset
    "OUTBOX_SQS_MAX_CONCURRENCY": [Bad("0", "greater than or equal to 1", env=SQS)],
    "OUTBOX_SNS_TOPIC_ARN": [Bad("my-topic", "must be a topic ARN", env=SNS), Bad("", "set the topic's ARN", env=SNS)],
    "OUTBOX_SNS_MAX_CONCURRENCY": [Bad("33", "less than or equal to 32", env=SNS)],
    "OUTBOX_EVENTBRIDGE_BUS": [Bad("my bus!", "event bus name", env=EVENTBRIDGE)],
    "OUTBOX_EVENTBRIDGE_SOURCE": [Bad("aws.shop", "'aws.'", env=EVENTBRIDGE)],
    "OUTBOX_EVENTBRIDGE_MAX_CONCURRENCY": [Bad("x", "valid integer", env=EVENTBRIDGE)],
    "AWS_ENDPOINT_URL_SQS": [Bad("garbage", "http:// or https:// URL", env=SQS)],
    "AWS_ENDPOINT_URL_SNS": [Bad("garbage", "http:// or https:// URL", env=SNS)],
    "AWS_ENDPOINT_URL_EVENTBRIDGE": [Bad("garbage", "http:// or https:// URL", env=EVENTBRIDGE)],
    "OUTBOX_KINESIS_STREAM": [Bad("my stream", "stream name", env=KINESIS),
                              Bad("", "set the stream's name or ARN", env=KINESIS)],
    "OUTBOX_KINESIS_MAX_CONCURRENCY": [Bad("0", "greater than or equal to 1", env=KINESIS)],
    "AWS_ENDPOINT_URL_KINESIS": [Bad("garbage", "http:// or https:// URL", env=KINESIS)],
    "OUTBOX_RETAIN_DELIVERED_SECONDS": [Bad("0", "greater than 0")],
    "OUTBOX_RETAIN_DEAD_SECONDS": [Bad("1e16", "less than or equal")],
    "OUTBOX_PARTITION_MARGIN_DAYS": [Bad("3", "greater than or equal to 4")],
    "POWERTOOLS_LOG_LEVEL": [Bad("garbage", "DEBUG, INFO")],
    "POWERTOOLS_TRACE_DISABLED": [Bad("garbage", "true or false")],
    "POWERTOOLS_LOGGER_LOG_EVENT": [Bad("maybe", "true or false")],
    "POWERTOOLS_TRACER_CAPTURE_RESPONSE": [Bad("maybe", "true or false")],
    "POWERTOOLS_TRACER_CAPTURE_ERROR": [Bad("maybe", "true or false")],
    "POWERTOOLS_METRICS_DISABLED": [Bad("maybe", "true or false")],
    "POWERTOOLS_DEV": [Bad("maybe", "true or false")],
    "POWERTOOLS_METRICS_NAMESPACE": [Bad("AWS/Lambda", "CloudWatch namespace"), Bad("a" * 256, "1-255")],
    "POWERTOOLS_SERVICE_NAME": [Bad("shop", "outbox-relay")],
    "AWS_REGION": [Bad("not a region", "region name", env=SES, command=SES_RELAY)],
    "AWS_DEFAULT_REGION": [Bad("not a region", "region name", env=SES, command=SES_RELAY),
                           Bad("", "no AWS region is configured", env=SES, command=SES_RELAY)],  # empty: unset
    "AWS_ENDPOINT_URL": [Bad("garbage", "http:// or https:// URL", env=SES, command=SES_RELAY),
                         Bad("ftp://127.0.0.1:5000", "http:// or https:// URL", env=SES, command=SES_RELAY)],
    "AWS_ENDPOINT_URL_SESV2": [Bad("garbage", "http:// or https:// URL", env=SES, command=SES_RELAY),
                               Bad("ftp://127.0.0.1:5000", "http:// or https:// URL", env=SES, command=SES_RELAY),
                               Bad("127.0.0.1:5000", "http:// or https:// URL", env=SES, command=SES_RELAY)],
    "OUTBOX_SERVERS": [Bad("both", "auto or embedded", command=("demo",))],
}

#: Options that take no value (flags), so no bad value exists; and help.
FLAGS = {"--json", "--dry-run", "--all", "--keep", "--help"}
#: Good values of the options each command requires, so a row changes one thing.
REQUIRED = {
    ("enqueue-event",): ["--stream", "s", "--type", "t", "--payload", "{}"],
    ("enqueue-email",): ["--to", "ana@example.com", "--subject", "s", "--text", "t"],
    ("enqueue-sqs",): ["--type", "t", "--payload", "{}"],
    ("enqueue-sns",): ["--type", "t", "--payload", "{}"],
    ("enqueue-eventbridge",): ["--type", "t", "--payload", "{}"],
    ("enqueue-kinesis",): ["--type", "t", "--payload", "{}"],
    ("relay",): ["--event", REDIS_EVENT],
    ("purge",): ["--delivered-older-than", "7d"],
}


@dataclass(frozen=True)
class BadOption:
    """`command` run with `option` set to `value` (an argument when it has no dashes);
    exit status `status`; the line must contain `says`."""

    command: tuple[str, ...]
    option: str
    value: str
    says: str
    status: int = 2
    extra: tuple[str, ...] = ()


def _aws_bad_options(files: dict[str, str]) -> list[BadOption]:
    """The SQS, SNS, EventBridge and Kinesis enqueue commands (more rows: tests/unit/test_aws_cli.py,
    tests/unit/test_kinesis_channel.py)."""
    sq, sn, eb, ki = ("enqueue-sqs",), ("enqueue-sns",), ("enqueue-eventbridge",), ("enqueue-kinesis",)
    rows = [BadOption(ki, "--header", "no-equals-sign", "--header")]
    for c in (sq, sn, eb, ki):
        rows += [BadOption(c, "--type", " ", "type:"), BadOption(c, "--payload", "{nope", "--payload"),
                 BadOption(c, "--payload", "null", "payload: is required"),
                 BadOption(c, "--payload", "@" + files["missing"], "--payload"),
                 BadOption(c, "--key", "", "key:"), BadOption(c, "--message-id", "nope", "message_id:"),
                 BadOption(c, "--max-attempts", "0", "max_attempts:"),
                 BadOption(c, "--deliver-at", "tomorrow", "--deliver-at"),
                 BadOption(c, "--deliver-at", "2030-01-01T00:00:00", "deliver_at:")]
    for c in (sq, sn):
        rows += [BadOption(c, "--header", "no-equals-sign", "--header"),
                 BadOption(c, "--header", "tenant=", "headers.tenant:"),
                 BadOption(c, "--header", "outbox-key=x", "headers.outbox-key:")]
    rows += [BadOption(sq, "--payload", '"\\ufffe"', "payload:"),
             BadOption(eb, "--payload", "[1]", "payload:"), BadOption(eb, "--source", "aws.ec2", "source:"),
             BadOption(eb, "--bus", "my bus", "bus:")]
    return rows


def _bad_options(files: dict[str, str]) -> list[BadOption]:
    ev, em = ("enqueue-event",), ("enqueue-email",)
    li, ls, fn = ("local", "invoke"), ("local", "start-lambda"), ("RelayRedisFunction",)
    rows = [
        BadOption(ev, "--stream", "", "stream:"), BadOption(ev, "--stream", "a}b", "stream:"),
        BadOption(ev, "--type", " ", "type:"),
        BadOption(ev, "--payload", "{nope", "--payload"), BadOption(ev, "--payload", "@" + files["missing"], "--payload"),
        BadOption(ev, "--payload", "@" + files["binary"], "--payload"),
        BadOption(ev, "--payload", "@" + files["directory"], "--payload"),
        BadOption(ev, "--payload", "@" + files["deep"], "--payload"),
        # A device or a huge file is refused after at most 40 MB, never read whole
        BadOption(ev, "--payload", "@/dev/zero", "--payload: /dev/zero is larger than"),
        BadOption(ev, "--payload", "@", "--payload: no file"),
        BadOption(ev, "--payload", '{"x": NaN}', "payload:"),
        BadOption(ev, "--payload", "null", "payload: is required"),  # decision 0057
        BadOption(ev, "--key", "", "key:"), BadOption(ev, "--message-id", "nope", "message_id:"),
        BadOption(ev, "--max-attempts", "x", "--max-attempts"), BadOption(ev, "--max-attempts", "0", "max_attempts:"),
        BadOption(ev, "--deliver-at", "tomorrow", "--deliver-at"),
        BadOption(ev, "--deliver-at", "2030-01-01T00:00:00", "deliver_at:"),
        BadOption(ev, "--deliver-at", "9999-01-01T00:00:00+00:00", "deliver_at:"),
        BadOption(em, "--to", "not an address", "to[0]"), BadOption(em, "--cc", "x", "cc[0]"),
        BadOption(em, "--bcc", "x@", "bcc[0]"), BadOption(em, "--reply-to", "x", "reply_to[0]"),
        BadOption(em, "--from", "x", "sender:"), BadOption(em, "--subject", " ", "subject:"),
        BadOption(em, "--text", "@" + files["missing"], "--text"), BadOption(em, "--text", "@" + files["binary"], "--text"),
        BadOption(em, "--text", "@" + files["directory"], "--text"), BadOption(em, "--html", "@" + files["missing"], "--html"),
        BadOption(em, "--header", "NoColon", "--header"), BadOption(em, "--header", "Resent-To: not an address", "headers:"),
        BadOption(em, "--tag", "nope", "--tag"), BadOption(em, "--tag", "k=v v", "tags:"),
        BadOption(em, "--configuration-set", "has space", "configuration_set:"),
        BadOption(em, "--attach", files["missing"], "--attach"), BadOption(em, "--attach", files["directory"], "--attach"),
        BadOption(em, "--attach", "/dev/zero", "--attach: /dev/zero is larger than"),
        BadOption(em, "--text", "@/dev/zero", "--text: /dev/zero is larger than"),
        BadOption(em, "--message-id", "nope", "message_id:"),
        BadOption(em, "--deliver-at", "tomorrow", "--deliver-at"),
        BadOption(em, "--deliver-at", "2030-01-01T00:00:00", "deliver_at:"),
        BadOption(em, "--deliver-at", "9999-01-01T00:00:00+00:00", "deliver_at:"),
        BadOption(em, "--max-attempts", "0", "max_attempts:"),
        BadOption(em, "--key", "", "key:"),
        *_aws_bad_options(files),
        BadOption(("relay",), "--event", files["missing"], "--event"),
        BadOption(("relay",), "--event", files["not_json"], "--event"),
        BadOption(("relay",), "--event", files["binary"], "--event"),
        BadOption(("relay",), "--event", files["a_list"], "--event"),
        BadOption(("relay",), "--event", files["bad_channel"], "--event: channel"),
        BadOption(("relay",), "--event", files["unknown_field"], "--event: mode"),
        BadOption(("relay",), "--event", files["redrive_typo"], "--event: chanel", extra=("--function", "maintenance")),
        BadOption(("relay",), "--event", files["redrive_yes"], "--event: all", extra=("--function", "maintenance")),
        BadOption(("relay",), "--event", files["empty"], "--event: RequestType", extra=("--function", "migrate")),
        BadOption(("relay",), "--timeout", "nan", "--timeout"), BadOption(("relay",), "--timeout", "inf", "--timeout"),
        BadOption(("relay",), "--timeout", "0", "--timeout"), BadOption(("relay",), "--timeout", "901", "--timeout"),
        BadOption(("relay",), "--timeout", "abc", "--timeout"),
        BadOption(("relay",), "--function", "nonexistent", "--function"),
        BadOption(("migrate",), "--seconds", "0", "--seconds", extra=("--online",)),
        BadOption(("demo",), "--database-name", "x; DROP", "--database-name"),
        BadOption(("demo",), "--database-name", "postgres", "--database-name: database postgres exists already"),
        BadOption(("demo",), "--prefix", "", "--prefix"), BadOption(("demo",), "--prefix", "{x}", "--prefix"),
        BadOption(("stats",), "--lag-window", "soon", "--lag-window"),
        BadOption(("stats",), "--lag-window", "99999999999999d", "--lag-window"),
        BadOption(("dead", "list"), "--channel", "kafka", "--channel"),
        BadOption(("dead", "list"), "--since", "99999999999d", "--since"),
        BadOption(("dead", "list"), "--since", "soon", "--since"),
        BadOption(("dead", "list"), "--since", "2026-01-01T00:00:00", "--since"),
        BadOption(("dead", "list"), "--since", "0001-01-01T00:00:00+14:00", "--since"),
        BadOption(("dead", "list"), "--error-class", "nope", "--error-class"),
        BadOption(("dead", "list"), "--limit", "0", "--limit"), BadOption(("dead", "list"), "--limit", "x", "--limit"),
        BadOption(("dead", "show"), "MESSAGE_ID", "nope", "MESSAGE_ID"),
        BadOption(("dead", "discard"), "MESSAGE_IDS", "nope", "MESSAGE_IDS"),
        BadOption(("redrive",), "MESSAGE_IDS", "nope", "MESSAGE_IDS"),
        BadOption(("redrive",), "--channel", "kafka", "--channel"),
        BadOption(("redrive",), "--error-class", "nope", "--error-class"),
        BadOption(("redrive",), "--batch-size", "0", "--batch-size", extra=("--all",)),
        BadOption(("redrive",), "--channel", "redis", "--all", extra=("--all",)),
        BadOption(("purge",), "--delivered-older-than", "99999999999999d", "--delivered-older-than"),
        BadOption(("purge",), "--delivered-older-than", "0", "--delivered-older-than"),
        BadOption(("purge",), "--delivered-older-than", "P99999999Y", "--delivered-older-than"),
        BadOption(("purge",), "--dead-older-than", "99999999999999d", "--dead-older-than"),
        BadOption(("purge",), "--batch-size", "0", "--batch-size"),
        # SES feedback's commands (issue 25)
        BadOption(("show",), "MESSAGE_ID", "nope", "MESSAGE_ID"),
        BadOption(("suppression", "add"), "ADDRESS", "not an address", "ADDRESS"),
        BadOption(("suppression", "add"), "--note", "x" * 201, "--note", extra=("a@example.net",)),
        BadOption(("suppression", "add"), "--note", "ask a@example.net", "--note", extra=("a@example.net",)),
        BadOption(("suppression", "remove"), "ADDRESS", "a@@example.net", "ADDRESS"),
        BadOption(("suppression", "list"), "--limit", "0", "--limit"),
        BadOption(("suppression", "list"), "--limit", "x", "--limit"),
        # outbox local: refused before Docker, a build or a server is touched
        BadOption(li, "FUNCTION", "NoSuchFunction", "FUNCTION"),
        BadOption(li, "--event", files["missing"], "--event", extra=fn),
        BadOption(li, "--event", files["not_json"], "--event", extra=fn),
        BadOption(li, "--event", files["a_list"], "--event", extra=fn),
        BadOption(li, "--event", files["directory"], "--event", extra=fn),
        BadOption(li, "--image", "Not An Image", "--image", extra=fn),
        BadOption(li, "--python", files["missing"], "--python", extra=fn),
        BadOption(li, "--python", files["not_json"], "is not a python3.12 interpreter", extra=fn),
        BadOption(ls, "--host", "not-an-address", "--host"), BadOption(ls, "--port", "0", "--port"),
        BadOption(ls, "--port", "70000", "--port"), BadOption(ls, "--image", "UPPER/case", "--image"),
        BadOption(ls, "--python", files["binary"], "is not a python3.12 interpreter"),
    ]
    return rows


# ---------------------------------------------------------------------------
# What the tables must cover
# ---------------------------------------------------------------------------

def relay_variables() -> set[str]:
    """Every variable a function's settings read (`config.variables`), and every variable docs/configuration.md lists in a table."""
    names = set(variables())
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for row in re.findall(r"^\| (.+?) \|", doc, re.M):
        names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", row))
    return names


def options() -> set[tuple[tuple[str, ...], str]]:
    """(command path, option or argument) for every parameter of the `outbox` command that takes a value."""
    found = set()

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, path + (name,))
            return
        for param in command.params:
            if isinstance(param, click.Option) and (param.is_flag or param.opts[-1] in FLAGS):
                continue
            name = param.opts[-1] if isinstance(param, click.Option) else param.name.upper()
            found.add((path, name))

    walk(main, ())
    return found


def test_every_variable_has_bad_values():
    assert sorted(relay_variables() - set(ENV)) == []


def test_every_option_has_bad_values(tmp_path):
    covered = {(row.command, row.option) for row in _bad_options(_files(tmp_path))}
    assert sorted(options() - covered) == []


# ---------------------------------------------------------------------------
# Running a row
# ---------------------------------------------------------------------------

def _files(directory: Path) -> dict[str, str]:
    (directory / "binary.json").write_bytes(b"\x00\xff\xfe{")
    (directory / "a-directory").mkdir(exist_ok=True)
    (directory / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (directory / "not-json.json").write_text("not json")
    (directory / "a-list.json").write_text("[1, 2]")
    # Events that parse but that the functions cannot use
    (directory / "bad-channel.json").write_text('{"channel": "kafka"}')
    (directory / "redrive-typo.json").write_text('{"action": "redrive", "chanel": "redis"}')
    (directory / "redrive-yes.json").write_text('{"action": "redrive", "all": "yes"}')
    (directory / "empty.json").write_text("{}")
    (directory / "unknown-field.json").write_text('{"source": "outbox.scheduler", "mode": "turbo"}')
    return {"missing": str(directory / "missing.json"), "binary": str(directory / "binary.json"),
            "directory": str(directory / "a-directory"), "deep": str(directory / "deep.json"),
            "not_json": str(directory / "not-json.json"), "a_list": str(directory / "a-list.json"),
            **{name.replace("-", "_"): str(directory / f"{name}.json")
               for name in ("bad-channel", "redrive-typo", "redrive-yes", "empty", "unknown-field")}}


@dataclass
class Place:
    """This module's databases and key prefix, and what they hold."""

    url: str
    unmigrated: str
    missing: str
    redis_url: str
    tcp_redis_url: str
    prefix: str
    files: dict[str, str]
    refusing: RefusingPostgres

    def fill(self, value: str | None) -> str | None:
        """`value` with this module's places filled in (see `ENV`)."""
        if value is None:
            return None
        return value.format(url=self.url, q="&" if "?" in self.url else "?", unmigrated=self.unmigrated,
                            missing=self.missing, tcp_redis=self.tcp_redis_url,
                            no_socket=str(Path(self.files["directory"]) / ".s.PGSQL.5432"),
                            refusing=self.refusing.path)

    def snapshot(self) -> tuple[list, list]:
        engine = create_engine(self.url, poolclass=NullPool)
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(text(
                "SELECT seq, status, attempts, lease_owner, available_at FROM outbox_message ORDER BY seq"))]
        engine.dispose()
        client = redis_lib.Redis.from_url(self.redis_url)
        # A large COUNT: SCAN walks the whole keyspace, whatever else a developer's Redis holds.
        keys = sorted(client.scan_iter(match=f"{self.prefix}*", count=10_000)) \
            + sorted(client.scan_iter(match=f"{{{self.prefix}*", count=10_000))
        client.close()
        return rows, keys


@pytest.fixture(scope="module")
def place(servers, template_db, tmp_path_factory) -> Iterator[Place]:
    """One migrated database with a pending, a dead and an old delivered message; one
    database without the schema; the name of one that does not exist."""
    run = uuid.uuid4().hex[:8]
    name, unmigrated = f"outbox_test_bad_{run}", f"outbox_test_bad_{run}_bare"
    admin = create_engine(servers.database_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"'))
    admin.dispose()
    create_database(servers.database_url, unmigrated)
    url = with_database(servers.database_url, name)
    prefix = f"tbad{run}."
    engine = create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        for n in range(3):
            enqueue_event(conn, stream=prefix + "orders", type="order.placed", payload={"n": n})
        conn.execute(text("UPDATE outbox_message SET status = 'dead', dead_at = now(), last_error_class = 'permanent' "
                          "WHERE seq = (SELECT min(seq) + 1 FROM outbox_message)"))
        conn.execute(text("UPDATE outbox_message SET status = 'delivered', delivered_at = now() - interval '30 days' "
                          "WHERE seq = (SELECT max(seq) FROM outbox_message)"))
    engine.dispose()
    # An embedded Redis listens on a Unix socket; the rows that need TCP reach it through a forwarder.
    host, port = redis_target(servers.redis_url)
    forwarder = Forwarder("127.0.0.1", host, port).__enter__() if port is None else None
    tcp_redis_url = servers.redis_url if forwarder is None else f"redis://127.0.0.1:{forwarder.port}/0"
    files = _files(tmp_path_factory.mktemp("bad-input"))
    refusing = RefusingPostgres(str(Path(files["directory"]).parent / ".s.PGSQL.5432")).__enter__()
    yield Place(url, with_database(servers.database_url, unmigrated), with_database(servers.database_url, name + "_none"),
                servers.redis_url, tcp_redis_url, prefix, files, refusing)
    refusing.close()
    if forwarder is not None:
        forwarder.cut()
    drop_database(servers.database_url, name)
    drop_database(servers.database_url, unmigrated)
    # A row that let the relay run would have published; leave no key behind either way
    client = redis_lib.Redis.from_url(servers.redis_url)
    for pattern in (f"{prefix}*", f"{{{prefix}*"):
        for key in list(client.scan_iter(match=pattern)):
            client.delete(key)
    client.close()


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click 8.1
    except TypeError:  # click 8.2 keeps standard error apart and dropped the argument
        return CliRunner()


def _base_env(place: Place) -> dict[str, str | None]:
    """Nothing from this machine's OUTBOX_*, POWERTOOLS_* or AWS_* settings; this module's servers."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("OUTBOX_", "POWERTOOLS_", "AWS_"))}
    env.update({"DATABASE_SECRET_ARN": None, "REDIS_URL_SECRET_ARN": None, "DATABASE_URL": place.url,
                "REDIS_URL": place.redis_url, "POWERTOOLS_TRACE_DISABLED": "true"})
    return env


def _invoke(args: list[str], env: dict[str, str | None], *, secrets: bool = False):
    runtime.reset()
    try:
        if secrets:
            from moto import mock_aws

            with mock_aws():
                return _runner().invoke(main, args, env=env)
        return _runner().invoke(main, args, env=env)
    finally:
        runtime.reset()


def _error_lines(stderr: str) -> list[str]:
    """Standard error without click's usage preamble (`Usage: …`, `Try '… -h' for help.`)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(("Usage: ", "Try '"))]


def _check(result, place: Place, before, status: int, *names: str) -> None:
    # No traceback: the command ended by exiting, not by an exception escaping it
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    # One line on standard error, naming what is wrong; nothing on standard output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    # Nothing written: the same rows in the same states, the same keys
    assert place.snapshot() == before


ENV_ROWS = [(variable, bad) for variable, bads in ENV.items() for bad in bads]


@pytest.mark.parametrize(("variable", "bad"), ENV_ROWS,
                         ids=[f"{v}={b.value[:30]}:{'-'.join(b.command[:1])}" for v, b in ENV_ROWS])
def test_a_bad_environment_variable_is_named_and_nothing_is_written(place, variable, bad):
    # Given the queue as it is, and one variable with a bad value
    before = place.snapshot()
    value = place.fill(bad.value)
    env = {**_base_env(place), **{k: place.fill(v) for k, v in bad.env.items()}, variable: value}
    # When the command runs
    result = _invoke(list(bad.command), env, secrets=bad.secrets)
    # Then it exits with status 1 and one line naming the variable and the problem
    _check(result, place, before, 1, variable if variable != "OUTBOX_SERVERS" else "OUTBOX_SERVERS", bad.says)


def _option_rows():
    return _bad_options({k: f"<{k}>" for k in ("missing", "binary", "directory", "deep", "not_json", "a_list",
                                                "bad_channel", "redrive_typo", "redrive_yes", "empty",
                                                "unknown_field")})


@pytest.mark.parametrize("index", range(len(_option_rows())),
                         ids=[f"{' '.join(r.command)} {r.option}={r.value[:24]}" for r in _option_rows()])
def test_a_bad_option_is_named_and_nothing_is_written(place, index):
    row = _bad_options(place.files)[index]
    # Given the queue as it is
    before = place.snapshot()
    args = list(row.command)
    required = list(REQUIRED.get(row.command, []))
    if row.option in required:
        required.pop(required.index(row.option) + 1)
        required.remove(row.option)
    args += required + list(row.extra)
    args += [row.value] if not row.option.startswith("--") else [row.option, row.value]
    # When the command runs with the bad value
    result = _invoke(args, _base_env(place))
    # Then it exits with the usage status and one line naming the option (or the message's field)
    _check(result, place, before, row.status, row.says)


@pytest.mark.slow  # a process each
@pytest.mark.parametrize("variable", ["POWERTOOLS_LOG_LEVEL", "POWERTOOLS_TRACE_DISABLED", "POWERTOOLS_DEV"])
def test_variables_powertools_reads_at_import_are_named_in_a_process_of_their_own(place, variable):
    # Powertools reads these when `outbox_relay.observability` is imported, before any settings
    env = {k: v for k, v in _base_env(place).items() if v is not None}
    env.update({k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "POWERTOOLS_", "AWS_"))
                and k not in ("DATABASE_URL", "REDIS_URL")})
    env[variable] = "garbage"
    before = place.snapshot()
    proc = subprocess.run([sys.executable, "-m", "outbox_tools.cli", "relay", "--event", REDIS_EVENT], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("Error: "), proc.stderr
    assert variable in proc.stderr and "Traceback" not in proc.stderr
    assert place.snapshot() == before
