"""Fixtures and helpers of the SES integration tests (the fixtures are registered by
tests/integration/conftest.py).

moto's in-process mock (`mock_aws`) plays SES; its v1 backend records v2 sends.
GetAccount, which moto lacks, is answered by a botocore before-call hook
(`outbox_tools.local_ses.answer_get_account`); errors moto cannot produce are
injected the same way (`fail_send_email`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ses.models import ses_backends

from outbox_relay.producer import enqueue_email
from outbox_relay.publishers.aws_client import create_client
from outbox_relay.publishers.registry import Channel
from outbox_relay.publishers.ses.addresses import parse_address
from outbox_relay.publishers.ses.publisher import SesPublisher
from outbox_relay.store import LeaseStore
from outbox_tools.local_ses import LocalSesServer, answer_get_account

SENDER_IDENTITY = "noreply@shop.example"
DEFAULT_FROM = f"Shop <{SENDER_IDENTITY}>"
CONFIGURATION_SET = "transactional"
REGION = "us-east-1"


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials and a region; no endpoint override or profile from the machine."""
    for key in list(os.environ):
        if key.startswith("AWS_ENDPOINT_URL") or key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)


@pytest.fixture
def ses(aws_env) -> Iterator[Any]:
    """A boto3 sesv2 client on moto, with the default sender verified and the configuration set created."""
    with mock_aws():
        client = create_client("sesv2", "SES", max_concurrency=8)
        client.create_email_identity(EmailIdentity=SENDER_IDENTITY)
        client.create_configuration_set(ConfigurationSetName=CONFIGURATION_SET)
        yield client


@pytest.fixture(scope="module")
def ses_server() -> Iterator[LocalSesServer]:
    """moto's SES in server mode, one per test module: for the tests that reach it over TCP."""
    with LocalSesServer(max_send_rate=100) as s:
        yield s


@pytest.fixture
def moto_ses(ses_server: LocalSesServer, monkeypatch: pytest.MonkeyPatch) -> LocalSesServer:
    """`ses_server` emptied, with the default sender verified, the configuration set
    created, and dummy credentials in the environment."""
    ses_server.reset()
    client = ses_server.client()
    client.create_email_identity(EmailIdentity=SENDER_IDENTITY)
    client.create_configuration_set(ConfigurationSetName=CONFIGURATION_SET)
    for key in list(os.environ):
        if key.startswith("AWS_ENDPOINT_URL") or key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(key)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": ses_server.region, "AWS_REGION": ses_server.region}.items():
        monkeypatch.setenv(key, value)
    return ses_server


def sent_messages() -> list[Any]:
    """What moto recorded, in send order (Message or RawMessage objects)."""
    return list(ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages)


@pytest.fixture
def ses_store(relay_engine) -> LeaseStore:
    return LeaseStore(relay_engine, Channel.SES, default_max_attempts=3, error_max_chars=500)


def make_publisher(client: Any, *, max_send_rate: float = 200.0, get_account: dict | None = None,
                   **kw: Any) -> SesPublisher:
    """A publisher on `client` whose GetAccount is answered (MaxSendRate `max_send_rate`,
    plus `get_account` values); `publisher.account_hook.calls` counts the GetAccount calls."""
    hook = answer_get_account(client, **({"max_send_rate": max_send_rate} | (get_account or {})))
    kw.setdefault("default_sender", parse_address(DEFAULT_FROM))
    kw.setdefault("default_configuration_set", CONFIGURATION_SET)
    kw.setdefault("record_group_size", 5)
    kw.setdefault("max_concurrency", 4)
    publisher = SesPublisher(client, **kw)
    publisher.account_hook = hook  # type: ignore[attr-defined]
    return publisher


@pytest.fixture
def enqueue_mail(app_engine) -> Callable[..., list]:
    """enqueue_mail(n, **fields) -> message ids; `to` defaults to user<i>@example.com,
    `subject` to "mail <i>", `text` to "body <i>"; a callable field value gets i."""

    def _enqueue(n: int = 1, **fields: Any) -> list:
        ids = []
        with app_engine.begin() as conn:
            for i in range(n):
                data = {"to": [f"user{i}@example.com"], "subject": f"mail {i}", "text": f"body {i}"}
                data.update({k: (v(i) if callable(v) else v) for k, v in fields.items()})
                ids.append(enqueue_email(conn, **data))
        return ids

    return _enqueue
