"""SES feedback in tests: the samples of events/ addressed to a message of the
test (its outbox id, SES id and recipients), and the feedback handler's environment."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: A key for the addresses' hashes (tests only).
ADDRESS_KEY = "k" * 16 + "test-address-key" + "0" * 8
#: events/ sample of each SES event type.
SAMPLES = {"send": "feedback-send.json", "delivery": "feedback-delivery.json", "bounce": "feedback-bounce.json",
           "complaint": "feedback-complaint.json", "reject": "feedback-reject.json",
           "rendering_failure": "feedback-rendering-failure.json",
           "delivery_delay": "feedback-delivery-delay.json"}
_RECIPIENTS = {"bounce": ("bouncedRecipients", "emailAddress"), "complaint": ("complainedRecipients", "emailAddress"),
               "delivery_delay": ("delayedRecipients", "emailAddress"), "delivery": ("recipients", None)}
_MEMBER = {"bounce": "bounce", "complaint": "complaint", "delivery_delay": "deliveryDelay", "delivery": "delivery"}


def sample(event_type: str) -> dict[str, Any]:
    return json.loads((ROOT / "events" / SAMPLES[event_type]).read_text())


def inner(event: dict[str, Any]) -> dict[str, Any]:
    return json.loads(event["Records"][0]["Sns"]["Message"])


def with_inner(event: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(event))
    out["Records"][0]["Sns"]["Message"] = json.dumps(message)
    return out


def event_for(event_type: str, *, outbox_id: str | None, ses_id: str, recipient: str | None = None,
              feedback_id: str | None = None, **changes: Any) -> dict[str, Any]:
    """The events/ sample of `event_type`, about message `outbox_id` (None: no tag) sent
    as `ses_id`, to `recipient` when given; `changes` replace members of the event's details."""
    event = sample(event_type)
    message = inner(event)
    tags = message["mail"]["tags"]
    if outbox_id is None:
        tags.pop("outbox-message-id")
    else:
        tags["outbox-message-id"] = [outbox_id]
    message["mail"]["messageId"] = ses_id
    if recipient is not None:
        message["mail"]["destination"] = [recipient]
        if event_type in _RECIPIENTS:
            member, key = _RECIPIENTS[event_type]
            details = message[_MEMBER[event_type]]
            details[member] = [recipient if key is None else {**details[member][0], key: recipient}]
    member = _MEMBER.get(event_type, {"send": "send", "reject": "reject",
                                      "rendering_failure": "failure"}.get(event_type))
    if feedback_id is not None:
        message[member]["feedbackId"] = feedback_id
    message[member].update(changes)
    return with_inner(event, message)


@pytest.fixture
def feedback_handler(monkeypatch: pytest.MonkeyPatch, database_url: str) -> Iterator[Callable[[dict], dict]]:
    """feedback_handler(event) -> the feedback function's summary, through its handler
    on this test's database."""
    from outbox_relay.feedback import run as feedback_run
    from outbox_tools.lambda_local import LocalContext, load_handler

    for key in list(os.environ):  # only this fixture's settings reach the function
        if key.startswith("OUTBOX_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("OUTBOX_SES_ADDRESS_KEY", ADDRESS_KEY)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "OutboxRelayTest")
    feedback_run.reset()
    handler = load_handler("feedback")
    yield lambda event: handler(event, LocalContext(30))
    feedback_run.reset()
