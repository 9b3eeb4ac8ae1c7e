"""An SES event settles the send whenever it arrives (decision 0055), on the real
database with moto's SES server: while the relay still waits for the answer
that will be lost (the proxy of tests/support/forward.py runs the feedback
function as it loses the answer: dropped, or later than the read timeout),
after the relay recorded the send ambiguous, and after the relay died with the
send made (its lease expired, before or after the claim dealt with it). Each
ordering ends with the message delivered, its history ending with a `settled`
line, and exactly one email in moto, also once the settle window has passed.
Last, the outcome write and the event's statement waiting on the same row, in
either order."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest
from sqlalchemy import text

from outbox_relay.loop import RelayLoop
from outbox_relay.models import ErrorClass, Outcome, OutcomeKind
from outbox_relay.operations.dead import get_message, history_of
from outbox_relay.publishers.aws_client import create_client
from outbox_relay.publishers.base import Deadline
from support.feedback import event_for
from support.forward import LosingForwarder
from support.ses import make_publisher

SETTLE_SECONDS = 300.0
PLENTY = Deadline(lambda: 60_000, margin_seconds=5)
TO = "customer@example.net"
#: How each way loses the answer: (read timeout, seconds the proxy holds the answer).
#: Both bounds leave the feedback function, run as the answer is lost, ample time
#: to finish before the relay gives up waiting, on a loaded machine too.
LOSSES = {"drop": (30.0, 0.0), "late": (6.0, 8.0)}


@pytest.fixture
def relay(ses_store, policy, monkeypatch) -> Callable[..., Any]:
    """relay(port, read_timeout=30) -> the summary of one batch-mode run sending to SES at `port`."""

    def _relay(port: int, read_timeout: float = 30.0) -> Any:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", f"http://127.0.0.1:{port}")
        client = create_client("sesv2", "SES", max_concurrency=2, read_timeout_seconds=read_timeout)
        publisher = make_publisher(client, settle_seconds=SETTLE_SECONDS)
        return RelayLoop(ses_store, publisher, policy, PLENTY, f"owner-{uuid.uuid4()}").run()

    return _relay


def send_event(feedback_handler, moto_ses, message_id) -> dict:
    """SES's Send event for the last email moto accepted, through the feedback function."""
    ses_id = moto_ses.sent_messages()[-1].id
    return feedback_handler(event_for("send", outbox_id=str(message_id), ses_id=ses_id))


def story(app_engine, message_id) -> list[tuple]:
    """The message's history: (event, attempt, error class, ref, actor) per line."""
    return [(h.event, h.attempt, h.error_class, h.ref, h.actor)
            for h in history_of(app_engine, get_message(app_engine, message_id))]


def window_passes(app_engine) -> None:
    """Every pending row is due now, by the database clock (instead of waiting the window out)."""
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET available_at = now() WHERE status = 'pending'"))


def sent_once_and_never_again(relay, moto_ses, app_engine) -> None:
    window_passes(app_engine)
    assert relay(moto_ses.port).claimed == 0
    assert len(moto_ses.sent_messages()) == 1


@pytest.mark.parametrize("loss", ["drop", pytest.param("late", marks=pytest.mark.slow)])
def test_an_event_recorded_while_the_relay_waits_for_the_lost_answer_settles_the_send(
        loss, relay, moto_ses, enqueue_mail, rows, feedback_handler, app_engine):
    # Given an email, and a proxy to SES that loses the answer to its send; while the
    # relay still waits for that answer, SES's Send event reaches the feedback function
    [message_id] = enqueue_mail(1, to=[TO])
    seen: dict[str, Any] = {}

    def event_now() -> None:
        try:
            seen["status"] = rows()[0]["status"]
            seen["summary"] = send_event(feedback_handler, moto_ses, message_id)
        except Exception as exc:  # the proxy's thread: the test reads it below
            seen["error"] = exc

    read_timeout, late = LOSSES[loss]
    with LosingForwarder("127.0.0.1", moto_ses.port, mode=loss, lose=1, late_seconds=late,
                         on_lost=event_now) as proxy:
        # When the answer is lost (the connection drops, or the read times out)
        summary = relay(proxy.port, read_timeout)

    # Then the event was recorded while the row was leased, and left the send to the relay
    assert "error" not in seen and seen["status"] == "leased"
    assert {k: seen["summary"][k] for k in ("recorded", "settled", "in_flight")} == {
        "recorded": 1, "settled": 0, "in_flight": 1}
    # and the relay, whose answer was lost, recorded the message delivered, not ambiguous
    ses_id = moto_ses.sent_messages()[0].id
    assert proxy.lost == 1 and summary.error_classes == {"ambiguous": 1} and summary.delivered == 1
    [row] = rows()
    assert (row["status"], row["delivery_ref"], row["attempts"], row["last_error_class"]) == (
        "delivered", ses_id, 1, "ambiguous")
    [(event, attempt, error_class, ref, actor)] = story(app_engine, message_id)
    assert (event, attempt, error_class, ref) == ("settled", 1, "ambiguous", ses_id)
    assert actor.startswith("owner-")
    # and after the settle window nothing is sent again
    sent_once_and_never_again(relay, moto_ses, app_engine)


def test_an_event_after_the_ambiguous_send_was_recorded_settles_it(
        relay, moto_ses, enqueue_mail, rows, feedback_handler, app_engine):
    # Given an email whose answer was lost, recorded ambiguous
    [message_id] = enqueue_mail(1, to=[TO])
    with LosingForwarder("127.0.0.1", moto_ses.port, mode="drop", lose=1) as proxy:
        relay(proxy.port)
    assert [(r["status"], r["last_error_class"]) for r in rows()] == [("pending", "ambiguous")]

    # When its Send event arrives
    result = send_event(feedback_handler, moto_ses, message_id)

    # Then the feedback function delivers it at once
    assert (result["settled"], result["in_flight"]) == (1, 0)
    ses_id = moto_ses.sent_messages()[0].id
    [row] = rows()
    assert (row["status"], row["delivery_ref"]) == ("delivered", ses_id)
    assert [line[:4] for line in story(app_engine, message_id)] == [
        ("ambiguous", 1, "ambiguous", None), ("settled", 1, None, ses_id)]
    sent_once_and_never_again(relay, moto_ses, app_engine)


def die_after_sending(ses_store, moto_ses, rows) -> None:
    """A relay claims the email, SES accepts its send, and the relay dies before its outcome write."""
    claim = ses_store.claim("dead-relay", 10, 30).messages
    client = create_client("sesv2", "SES", max_concurrency=2, read_timeout_seconds=30.0)
    publisher = make_publisher(client, settle_seconds=SETTLE_SECONDS)
    publisher.begin(PLENTY)
    publisher.deliver(claim, PLENTY, lambda results: None)
    assert len(moto_ses.sent_messages()) == 1 and [r["status"] for r in rows()] == ["leased"]


@pytest.fixture
def at_moto(moto_ses, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", moto_ses.url)
    return moto_ses


@pytest.mark.parametrize("max_attempts", [None, 1], ids=["attempts-left", "last-attempt"])
@pytest.mark.parametrize("event_first", [True, False], ids=["event-then-expiry", "expiry-then-event"])
def test_an_event_for_a_send_whose_relay_died_settles_it_at_the_claim(
        event_first, max_attempts, at_moto, relay, ses_store, enqueue_mail, rows, feedback_handler,
        expire_leases, app_engine):
    # Given an email whose relay died after SES accepted its send (no outcome recorded)
    [message_id] = enqueue_mail(1, to=[TO], max_attempts=max_attempts)
    die_after_sending(ses_store, at_moto, rows)

    # When its Send event arrives while the row is still leased, before or after the lease expired
    if not event_first:
        expire_leases()
    result = send_event(feedback_handler, at_moto, message_id)
    if event_first:
        expire_leases()
    assert (result["settled"], result["in_flight"]) == (0, 1)

    # Then the next claim records it delivered instead of sending it again (or dead-lettering it)
    assert relay(at_moto.port).claimed == 0
    ses_id = at_moto.sent_messages()[0].id
    [row] = rows()
    assert (row["status"], row["delivery_ref"], row["attempts"], row["dead_at"]) == (
        "delivered", ses_id, 1, None)
    assert story(app_engine, message_id) == [("settled", 1, "lease_expired", ses_id, "dead-relay")]
    sent_once_and_never_again(relay, at_moto, app_engine)


@pytest.mark.parametrize("max_attempts, after_claim", [(None, "pending"), (1, "dead")],
                         ids=["requeued", "dead-lettered"])
def test_an_event_after_the_claim_dealt_with_the_expired_lease_settles_it(
        max_attempts, after_claim, at_moto, relay, ses_store, enqueue_mail, rows, feedback_handler,
        expire_leases, app_engine):
    # Given an email whose relay died after SES accepted its send, and a claim that then
    # requeued it (or dead-lettered it: no attempts left) before any event came
    [message_id] = enqueue_mail(1, to=[TO], max_attempts=max_attempts)
    die_after_sending(ses_store, at_moto, rows)
    expire_leases()
    assert not [m for m in ses_store.claim("next-relay", 10, 30).messages if m.status.value == "leased"]
    assert [r["status"] for r in rows()] == [after_claim]

    # When its Send event arrives
    result = send_event(feedback_handler, at_moto, message_id)

    # Then the feedback function delivers it at once
    assert (result["settled"], result["in_flight"]) == (1, 0)
    ses_id = at_moto.sent_messages()[0].id
    [row] = rows()
    assert (row["status"], row["delivery_ref"], row["dead_at"]) == ("delivered", ses_id, None)
    assert [line[0] for line in story(app_engine, message_id)] == [
        "lease_expired" if after_claim == "pending" else "dead", "settled"]
    sent_once_and_never_again(relay, at_moto, app_engine)


def waiting_for_a_lock(app_engine) -> int:
    with app_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                 "AND wait_event_type = 'Lock'")).scalar_one()


@pytest.mark.parametrize("first", ["outcome", "event"])
def test_an_event_and_the_lost_answers_outcome_written_at_the_same_moment_settle_the_send(
        first, ses_store, enqueue_mail, rows, feedback_handler, app_engine):
    # Given a leased email, and a transaction holding its row, so that the relay's outcome
    # write (the answer was lost) and the event's statement both wait for it, in a known order
    [message_id] = enqueue_mail(1, to=[TO])
    [claimed] = ses_store.claim("relay", 10, 30).messages
    ses_id = f"0100{uuid.uuid4().hex}-000000"
    outcome = Outcome(claimed.seq, OutcomeKind.SETTLE, ErrorClass.AMBIGUOUS, "read timeout", None, SETTLE_SECONDS)
    writers = {"outcome": lambda: ses_store.record("relay", [outcome]),
               "event": lambda: feedback_handler(event_for("send", outbox_id=str(message_id), ses_id=ses_id))}
    done: dict[str, Any] = {}
    with app_engine.connect() as holder, ThreadPoolExecutor(2) as pool:
        holder.execute(text("SELECT 1 FROM outbox_message WHERE seq = :s FOR UPDATE"), {"s": claimed.seq})
        for n, name in enumerate([first, *(w for w in writers if w != first)], start=1):
            done[name] = pool.submit(writers[name])
            give_up = time.monotonic() + 60
            while waiting_for_a_lock(app_engine) < n:
                assert time.monotonic() < give_up, f"{name} did not wait for the row"
                time.sleep(0.02)
        # When the row is released: the first writes, the second waits for it and then writes
        holder.rollback()
        recorded, summary = done["outcome"].result(60), done["event"].result(60)

    # Then the send is delivered either way, never pending for a second send: by the event
    # when the outcome was written first, else by the outcome write
    assert (recorded.delivered, summary["settled"], summary["in_flight"]) == (
        (0, 1, 0) if first == "outcome" else (1, 0, 1))
    [row] = rows()
    assert (row["status"], row["delivery_ref"]) == ("delivered", ses_id)
    assert [(h[0], h[3]) for h in story(app_engine, message_id)] == (
        [("ambiguous", None), ("settled", ses_id)] if first == "outcome" else [("settled", ses_id)])
