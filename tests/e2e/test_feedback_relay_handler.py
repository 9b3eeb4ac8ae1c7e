"""The SES relay's real handler (functions/relay/app.py) configured as the template
configures it with feedback: the settings build the suppression list on the
container's engine and the addresses' key, and a send whose answer is lost
waits for feedback. moto in server mode plays SES."""

from __future__ import annotations

import json
from typing import Iterator

import pytest
from sqlalchemy import text

from outbox_relay.feedback.hashing import AddressHasher
from outbox_relay.feedback.store import SuppressionList
from outbox_relay.producer import enqueue_email
from outbox_tools.lambda_local import LocalContext, load_handler
from outbox_tools.local_ses import LocalSesServer
from support.events import EVENTS, SENDER
from support.feedback import ADDRESS_KEY
from support.forward import LosingForwarder


@pytest.fixture(scope="module")
def server() -> Iterator[LocalSesServer]:
    with LocalSesServer(max_send_rate=100) as s:
        yield s


@pytest.fixture
def ses_relay(server, relay_env, monkeypatch):
    """The SES relay's environment with feedback on, as the template sets it."""
    server.reset()
    server.verify(SENDER)
    server.client().create_configuration_set(ConfigurationSetName="transactional")
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": server.region, "AWS_REGION": server.region,
                       "AWS_ENDPOINT_URL_SESV2": server.url, "OUTBOX_CHANNEL": "ses", "OUTBOX_SES_FROM": SENDER,
                       "OUTBOX_SES_CONFIGURATION_SET": "transactional", "OUTBOX_SES_FEEDBACK": "true",
                       "OUTBOX_SES_ADDRESS_KEY": ADDRESS_KEY}.items():
        monkeypatch.setenv(key, value)
    handler = load_handler("relay")
    event = json.loads((EVENTS / "relay-ses-scheduler.json").read_text())
    return lambda: handler(event, LocalContext(60))


def _statuses(app_engine) -> list[tuple]:
    with app_engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT status, last_error_class, last_error FROM outbox_message ORDER BY seq"))]


def test_with_feedback_the_relay_checks_the_suppression_list(ses_relay, server, app_engine, relay_engine):
    # Given an address on the suppression list, and an email to it among others
    SuppressionList(relay_engine, AddressHasher(ADDRESS_KEY)).add("gone@example.net")
    with app_engine.begin() as conn:
        for to in ("a@example.net", "Gone <GONE@example.net>", "b@example.net"):
            enqueue_email(conn, to=[to], subject="s", text="t")

    # When the relay runs
    summary = ses_relay()

    # Then the others are sent, and that one is dead-lettered as suppressed without a send
    assert (summary["delivered"], summary["dead"]) == (2, 1)
    assert _statuses(app_engine)[1] == ("dead", "suppressed",
                                        "ses: not sent: to[0] is on the suppression list (manual)")
    assert sorted(d for m in server.sent_messages() for d in m.destinations["ToAddresses"]) == [
        "a@example.net", "b@example.net"]


def test_with_feedback_a_lost_answer_is_ambiguous_through_the_handler(ses_relay, server, app_engine, monkeypatch):
    # (the handler's GetAccount goes through the proxy too: its answer passes)
    with LosingForwarder("127.0.0.1", server.port, mode="drop", lose=1, after=1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", f"http://127.0.0.1:{proxy.port}")
        with app_engine.begin() as conn:
            enqueue_email(conn, to=["a@example.net"], subject="s", text="t")
        summary = ses_relay()
    assert summary["error_classes"] == {"ambiguous": 1}
    [(status, error_class, _)] = _statuses(app_engine)
    assert (status, error_class) == ("pending", "ambiguous") and len(server.sent_messages()) == 1
