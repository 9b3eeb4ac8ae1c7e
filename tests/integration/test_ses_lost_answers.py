"""Sends whose answer was lost, made real: moto's server behind a TCP proxy
that lets SES have the request and then loses the answer, by dropping the
connection when the answer comes, by holding it past the client's read
timeout, or by answering 500 in its place. With feedback on, such a send is
AMBIGUOUS: it waits for its SES event (settled as delivered, never sent again)
or, when none comes within the settle window, is sent exactly once more.
Without feedback it stays transient."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
from sqlalchemy import text

from outbox_relay.loop import RelayLoop
from outbox_relay.operations.dead import get_message, history_of
from outbox_relay.publishers.aws_client import create_client
from outbox_relay.publishers.base import Deadline
from support.feedback import event_for
from support.forward import LosingForwarder
from support.ses import make_publisher

#: The smallest deadline margin the SES relay accepts: a 1 s read timeout.
MARGIN = 4.0
SETTLE_SECONDS = 300.0


# `late` waits out a read timeout: under `slow`, so the default run stays quick.
@pytest.fixture(params=["drop", pytest.param("late", marks=pytest.mark.slow)])
def losing(request, moto_ses) -> Iterator[LosingForwarder]:
    """A proxy to moto that loses the first answer: `drop` (the connection ends once
    SES has the request) or `late` (the answer comes after the read timeout)."""
    with LosingForwarder("127.0.0.1", moto_ses.port, mode=request.param, lose=1, late_seconds=1.5) as proxy:
        yield proxy


@pytest.fixture
def dropping(moto_ses) -> Iterator[LosingForwarder]:
    """The `drop` proxy alone, for the rules that do not depend on how the answer was lost."""
    with LosingForwarder("127.0.0.1", moto_ses.port, mode="drop", lose=1) as proxy:
        yield proxy


@pytest.fixture
def relay(ses_store, policy, monkeypatch):
    """relay(proxy, **publisher options) -> the summary of one batch sent through `proxy`."""

    def _relay(proxy: LosingForwarder, **kw: Any) -> Any:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", f"http://127.0.0.1:{proxy.port}")
        client = create_client("sesv2", "SES", max_concurrency=2, deadline_margin_seconds=MARGIN)
        publisher = make_publisher(client, **kw)
        deadline = Deadline(lambda: 60_000, margin_seconds=MARGIN)
        return RelayLoop(ses_store, publisher, policy, deadline, f"owner-{uuid.uuid4()}").run()
    return _relay


def window_passes(app_engine) -> None:
    """The settle window ends now, by the database clock (instead of waiting it out)."""
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET available_at = now() WHERE status = 'pending'"))


def test_a_lost_answer_waits_and_a_delivery_event_settles_it_with_no_second_send(
        losing, relay, moto_ses, enqueue_mail, rows, feedback_handler, app_engine):
    # Given an email whose send SES accepted and whose answer was lost
    [message_id] = enqueue_mail(1, to=["customer@example.net"])
    summary = relay(losing, settle_seconds=SETTLE_SECONDS)
    assert losing.lost == 1 and len(moto_ses.sent_messages()) == 1
    [row] = rows()
    assert (row["status"], row["last_error_class"], row["attempts"], row["dead_at"]) == (
        "pending", "ambiguous", 1, None)
    assert SETTLE_SECONDS - 30 < row["due_in"] <= SETTLE_SECONDS
    assert summary.error_classes == {"ambiguous": 1}

    # When SES's Delivery event for it arrives (its SES id from what SES recorded)
    ses_id = moto_ses.sent_messages()[0].id
    result = feedback_handler(event_for("delivery", outbox_id=str(message_id), ses_id=ses_id,
                                recipient="customer@example.net"))

    # Then the message is delivered, with that SES id
    assert result["settled"] == 1
    [row] = rows()
    assert (row["status"], row["delivery_ref"]) == ("delivered", ses_id)
    # and its history tells both: the attempt whose answer was lost, then the event that settled it
    lost, settled = history_of(app_engine, get_message(app_engine, message_id))
    assert (lost.event, lost.attempt, lost.error_class, lost.ref) == ("ambiguous", 1, "ambiguous", None)
    assert lost.actor.startswith("owner-") and lost.next_at is not None
    assert (settled.event, settled.attempt, settled.ref, settled.actor) == ("settled", 1, ses_id, "feedback")

    # and after the window the relay finds nothing to send again
    window_passes(app_engine)
    assert relay(losing, settle_seconds=SETTLE_SECONDS).claimed == 0
    assert len(moto_ses.sent_messages()) == 1


def test_a_lost_answer_with_no_event_is_sent_exactly_once_more_after_the_window(
        losing, relay, moto_ses, enqueue_mail, rows, app_engine):
    # Given a send whose answer was lost, and no event about it
    enqueue_mail(1, to=["customer@example.net"])
    relay(losing, settle_seconds=SETTLE_SECONDS)
    assert [r["last_error_class"] for r in rows()] == ["ambiguous"]

    # When the relay runs before the window ends, it sends nothing
    assert relay(losing, settle_seconds=SETTLE_SECONDS).claimed == 0
    assert len(moto_ses.sent_messages()) == 1

    # When the window ends, the relay sends it once more (and this answer arrives)
    window_passes(app_engine)
    summary = relay(losing, settle_seconds=SETTLE_SECONDS)
    assert summary.delivered == 1
    [row] = rows()
    assert (row["status"], row["attempts"]) == ("delivered", 2)
    assert len(moto_ses.sent_messages()) == 2

    # and never again
    window_passes(app_engine)
    assert relay(losing, settle_seconds=SETTLE_SECONDS).claimed == 0
    assert len(moto_ses.sent_messages()) == 2


def test_on_its_last_attempt_a_lost_answer_still_waits_and_is_not_dead(
        dropping, relay, moto_ses, enqueue_mail, rows, app_engine):
    enqueue_mail(1, to=["customer@example.net"], max_attempts=1)
    relay(dropping, settle_seconds=SETTLE_SECONDS)
    [row] = rows()
    assert (row["status"], row["last_error_class"], row["attempts"]) == ("pending", "ambiguous", 1)
    window_passes(app_engine)
    assert relay(dropping, settle_seconds=SETTLE_SECONDS).delivered == 1
    assert len(moto_ses.sent_messages()) == 2


def test_without_feedback_a_lost_answer_is_transient_as_before(dropping, relay, moto_ses, enqueue_mail, rows):
    enqueue_mail(1, to=["customer@example.net"])
    relay(dropping)
    [row] = rows()
    assert (row["status"], row["last_error_class"]) == ("pending", "transient")
    assert len(moto_ses.sent_messages()) == 1  # SES had it: the backoff's resend will be a duplicate


def test_a_message_with_its_own_configuration_set_is_transient(dropping, relay, moto_ses, enqueue_mail, rows):
    # Its events do not reach the feedback function: nothing could settle it.
    moto_ses.client().create_configuration_set(ConfigurationSetName="marketing")
    enqueue_mail(1, to=["customer@example.net"], configuration_set="marketing")
    relay(dropping, settle_seconds=SETTLE_SECONDS)
    assert [r["last_error_class"] for r in rows()] == ["transient"]


def test_a_5xx_after_the_body_was_sent_is_ambiguous_too(relay, moto_ses, enqueue_mail, rows):
    with LosingForwarder("127.0.0.1", moto_ses.port, mode="5xx", lose=1) as proxy:
        enqueue_mail(1, to=["customer@example.net"])
        relay(proxy, settle_seconds=SETTLE_SECONDS)
    [row] = rows()
    assert (row["status"], row["last_error_class"]) == ("pending", "ambiguous")
    assert "InternalFailure" in row["last_error"] and len(moto_ses.sent_messages()) == 1


def test_a_refused_connection_sent_nothing_and_is_transient(relay, moto_ses, enqueue_mail, rows):
    # Given a proxy that is gone: SES never had the request
    proxy = LosingForwarder("127.0.0.1", moto_ses.port)
    proxy.cut()
    enqueue_mail(1, to=["customer@example.net"])
    relay(proxy, settle_seconds=SETTLE_SECONDS)
    [row] = rows()
    assert row["last_error_class"] in ("transient", "downstream_unavailable")
    assert row["last_error_class"] != "ambiguous" and len(moto_ses.sent_messages()) == 0


def test_a_settled_send_frees_the_later_emails_of_its_key_at_once(
        dropping, relay, moto_ses, enqueue_mail, rows, feedback_handler, app_engine):
    # Given two emails of one ordering key, the first's answer lost: the second waits behind it
    first, second = enqueue_mail(2, to=["customer@example.net"], key="order-1")
    relay(dropping, settle_seconds=SETTLE_SECONDS)
    relay(dropping, settle_seconds=SETTLE_SECONDS)  # a claim moves the second to the end of the window
    assert [(r["status"], r["due"]) for r in rows()] == [("pending", False), ("pending", False)]

    # When the first one's Send event arrives
    ses_id = moto_ses.sent_messages()[0].id
    assert feedback_handler(event_for("send", outbox_id=str(first), ses_id=ses_id))["settled"] == 1

    # Then the second is due at once, and the next run sends it: each email once
    assert [(r["status"], r["due"]) for r in rows()] == [("delivered", False), ("pending", True)]
    assert relay(dropping, settle_seconds=SETTLE_SECONDS).delivered == 1
    assert len(moto_ses.sent_messages()) == 2
