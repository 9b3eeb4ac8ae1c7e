"""SES feedback's rules without sockets: which lost answers are ambiguous, what
an ambiguous or suppressed result records, the addresses' keyed hash, and the
events/ samples parsed (any other input refused naming a field, never a crash)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from outbox_relay.backoff import Backoff
from outbox_relay.feedback.events import IGNORED, FeedbackEvent, MalformedEvent, parse_message, parse_records
from outbox_relay.feedback.hashing import AddressHasher, normalise
from outbox_relay.loop import RelayPolicy
from outbox_relay.models import ClaimedMessage, DeliveryResult, ErrorClass, OutcomeKind, Status
from outbox_relay.publishers.ses.errors import answer_was_lost
from outbox_relay.recording import to_outcome

EVENTS = Path(__file__).resolve().parents[2] / "events"
KEY = "a" * 32


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "SendEmail")


@pytest.mark.parametrize(("exc", "ambiguous"), [
    (ReadTimeoutError(endpoint_url="http://ses"), True),  # the reply came after the read timeout
    (ConnectionClosedError(endpoint_url="http://ses"), True),  # the connection dropped after the request
    (_client_error("InternalFailure", 500), True),  # a 5xx after the body was sent
    (_client_error("ServiceUnavailable", 503), True),
    (_client_error("Throttling", 503), False),  # a throttle is SES's word: not sent
    (_client_error("MessageRejected", 400), False),
    (EndpointConnectionError(endpoint_url="http://ses"), False),  # never connected: nothing sent
    (ConnectTimeoutError(endpoint_url="http://ses"), False),
    (ValueError("a bug of ours"), False),
])
def test_which_failures_leave_the_send_unknown(exc, ambiguous):
    assert answer_was_lost(exc) is ambiguous


MESSAGE = ClaimedMessage(1, "0b6e4a52-9c1d-4f3e-8a7b-2d5c6e7f8091", Status.LEASED, "ses", "email", None, "{}",
                         None, 5, 5, "2026-12-02T00:00:00Z")
POLICY = RelayPolicy(batch_size=10, lease_seconds=120, backoff=Backoff(base=1, cap=60, floor=0.5))


def test_an_ambiguous_result_waits_the_window_with_its_attempt_kept_even_on_its_last_attempt():
    outcome = to_outcome(DeliveryResult(1, error_class=ErrorClass.AMBIGUOUS, error="lost",
                                        retry_after_seconds=600.0), MESSAGE, POLICY.backoff, POLICY.throttle_delay_seconds)
    assert (outcome.kind, outcome.error_class, outcome.delay_seconds) == (OutcomeKind.SETTLE, ErrorClass.AMBIGUOUS,
                                                                          600.0)


def test_a_suppressed_result_is_a_dead_letter_now():
    outcome = to_outcome(DeliveryResult(1, error_class=ErrorClass.SUPPRESSED, error="to[0]"), MESSAGE, POLICY.backoff, POLICY.throttle_delay_seconds)
    assert (outcome.kind, outcome.error_class) == (OutcomeKind.DEAD, ErrorClass.SUPPRESSED)


@pytest.mark.parametrize(("a", "b"), [("Jiwoo <Jiwoo@Example.com>", "jiwoo@example.com"),
                                      (" JIWOO@EXAMPLE.COM ", "jiwoo@example.com")])
def test_an_address_hashes_the_same_whatever_its_form(a, b):
    hasher = AddressHasher(KEY)
    assert normalise(a) == b and hasher.hash(a) == hasher.hash(b)
    assert len(hasher.hash(a)) == 64 and "jiwoo" not in hasher.hash(a)
    assert AddressHasher("b" * 32).hash(a) != hasher.hash(a)  # keyed: another key, another hash
    assert KEY not in repr(hasher)


def test_a_short_key_is_refused():
    with pytest.raises(ValueError, match="at least 32 characters"):
        AddressHasher("short")


@pytest.mark.parametrize("path", sorted(EVENTS.glob("feedback-*.json")), ids=lambda p: p.name)
def test_every_sample_parses_as_the_event_it_is(path):
    [event] = list(parse_records(json.loads(path.read_text())))
    assert isinstance(event, FeedbackEvent)
    assert event.outbox_message_id == "0b6e4a52-9c1d-4f3e-8a7b-2d5c6e7f8091"
    assert event.configuration_set == "transactional" and event.recipients
    assert path.stem.removeprefix("feedback-").replace("-", "_") == event.event_type
    assert event.suppress_reason == {"bounce": "bounce", "complaint": "complaint"}.get(event.event_type)
    assert "@" not in repr(event)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner,
                                                                                 max_size=4), max_leaves=20)


def _sample_message() -> dict:
    event = json.loads((EVENTS / "feedback-bounce.json").read_text())
    return json.loads(event["Records"][0]["Sns"]["Message"])


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from([("mail",), ("mail", "messageId"), ("mail", "timestamp"), ("mail", "tags"),
                             ("mail", "tags", "outbox-message-id"), ("bounce",), ("bounce", "bounceType"),
                             ("bounce", "feedbackId"), ("bounce", "timestamp"), ("bounce", "bouncedRecipients"),
                             ("eventType",)]),
       value=_json)
def test_any_value_in_any_place_is_parsed_or_refused_naming_a_field(path, value):
    message = _sample_message()
    node = message
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    try:
        result = parse_message(message, "Message")
    except MalformedEvent as exc:
        assert exc.field.startswith("Message") and "\n" not in str(exc)
        return
    assert result is IGNORED or isinstance(result, FeedbackEvent)
