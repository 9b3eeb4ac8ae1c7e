"""SES feedback end to end on real PostgreSQL, with moto for SES: the samples of
events/ through the feedback function's handler, matched to the messages the
relay sent; idempotency; unknown and malformed events; the suppression list
from permanent bounces and complaints, and the relay's dead letters for it."""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable

import pytest
from sqlalchemy import text

from outbox_relay.feedback import run as feedback_run
from outbox_relay.feedback.hashing import AddressHasher
from outbox_relay.feedback.store import SuppressionList
from outbox_relay.loop import RelayLoop
from outbox_relay.publishers.base import Deadline
from support.feedback import ADDRESS_KEY, SAMPLES, event_for, inner, sample, with_inner
from support.ses import make_publisher, sent_messages

PLENTY = Deadline(lambda: 60_000, margin_seconds=5)
HASHER = AddressHasher(ADDRESS_KEY)


@pytest.fixture
def feedback(feedback_handler) -> Callable[[dict], dict]:
    """feedback(event) -> the feedback function's summary, through its handler."""
    return feedback_handler


@pytest.fixture
def send(ses, ses_store, relay_engine, policy) -> Callable[..., Any]:
    """send(**publisher options) -> the summary of one relay batch through moto's SES,
    checking the suppression list."""

    def _send(**kw: Any) -> Any:
        kw.setdefault("suppression", SuppressionList(relay_engine, HASHER))
        return RelayLoop(ses_store, make_publisher(ses, **kw), policy, PLENTY, f"owner-{uuid.uuid4()}").run()

    return _send


def table(app_engine, name: str) -> list[dict]:
    with app_engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(f"SELECT * FROM {name} ORDER BY 1"))]


def messages(rows) -> list[dict]:
    """The outbox rows without the columns computed from now()."""
    return [{k: v for k, v in r.items() if k not in ("due_in", "lease_left")} for r in rows()]


def sent_one(enqueue_mail, send, rows, to: str = "customer@example.net") -> tuple[str, str]:
    """Enqueue and send one email through the relay and moto; its outbox id and SES id."""
    [message_id] = enqueue_mail(1, to=[to])
    send()
    [row] = rows()
    assert row["status"] == "delivered"
    return str(message_id), row["delivery_ref"]


@pytest.fixture
def delivered(app_engine) -> Callable[..., tuple[str, str]]:
    """delivered() -> (outbox id, SES id) of an email recorded as the relay records a send
    (for the rules about events alone; the tests of the send path use `sent_one`)."""

    def _delivered(to: str = "customer@example.net") -> tuple[str, str]:
        from outbox_relay.producer import enqueue_email

        ses_id = f"0100{uuid.uuid4().hex}-000000"
        with app_engine.begin() as conn:
            message_id = enqueue_email(conn, to=[to], subject="s", text="t")
            conn.execute(text("UPDATE outbox_message SET status = 'delivered', attempts = 1, delivered_at = now(), "
                              "delivery_ref = :ses WHERE message_id = :m"), {"ses": ses_id, "m": message_id})
        return str(message_id), ses_id

    return _delivered


# --------------------------------------------------------------------------
# Matching and recording
# --------------------------------------------------------------------------

def test_every_event_type_is_recorded_against_its_message_without_an_address_in_clear(
        feedback, enqueue_mail, send, rows, app_engine):
    # Given an email the relay sent through SES
    message_id, ses_id = sent_one(enqueue_mail, send, rows)

    # When SES publishes one event of each type about it (the samples in events/)
    summaries = [feedback(event_for(t, outbox_id=message_id, ses_id=ses_id, recipient="customer@example.net"))
                 for t in SAMPLES]

    # Then each is recorded against the message, with its own time and subtype
    assert [s["recorded"] for s in summaries] == [1] * len(SAMPLES)
    events = table(app_engine, "outbox_email_event")
    assert {e["event_type"] for e in events} == set(SAMPLES)
    assert {str(e["message_id"]) for e in events} == {message_id}
    assert {e["ses_message_id"] for e in events} == {ses_id}
    by_type = {e["event_type"]: e for e in events}
    assert by_type["bounce"]["subtype"] == "Permanent/General"
    assert by_type["complaint"]["subtype"] == "abuse"
    assert by_type["delivery_delay"]["subtype"] == "TransientCommunicationFailure"
    assert by_type["reject"]["subtype"] == "Bad content"
    assert by_type["delivery"]["event_at"].isoformat() == "2026-11-29T19:00:02.531000+00:00"
    assert by_type["send"]["configuration_set"] == "transactional"
    # and the recipients are keyed hashes, as is the suppression list: no address in clear anywhere
    assert by_type["bounce"]["recipients"] == [HASHER.hash("customer@example.net")]
    for name in ("outbox_email_event", "outbox_suppression"):
        assert "@" not in json.dumps(table(app_engine, name), default=str), name


def test_a_redelivered_event_changes_nothing(feedback, delivered, rows, app_engine):
    # Given every event of a message recorded once
    message_id, ses_id = delivered()
    events = [event_for(t, outbox_id=message_id, ses_id=ses_id, recipient="customer@example.net") for t in SAMPLES]
    for e in events:
        feedback(e)
    before = (messages(rows), table(app_engine, "outbox_email_event"), table(app_engine, "outbox_suppression"))

    # When SNS delivers each of them again
    again = [feedback(e) for e in events]

    # Then nothing changed, and each was counted as a duplicate
    assert [(s["recorded"], s["duplicates"], s["suppressed"]) for s in again] == [(0, 1, 0)] * len(SAMPLES)
    assert (messages(rows), table(app_engine, "outbox_email_event"),
            table(app_engine, "outbox_suppression")) == before


def test_an_event_without_the_tag_is_matched_by_the_ses_message_id(feedback, delivered, app_engine):
    message_id, ses_id = delivered()
    summary = feedback(event_for("delivery", outbox_id=None, ses_id=ses_id))
    assert summary["recorded"] == 1
    assert [str(e["message_id"]) for e in table(app_engine, "outbox_email_event")] == [message_id]


def test_an_event_for_an_unknown_message_is_counted_not_an_error(feedback, app_engine):
    summary = feedback(event_for("bounce", outbox_id=str(uuid.uuid4()), ses_id="0100-unknown-000000",
                                 recipient="someone@example.net"))
    assert (summary["unknown"], summary["recorded"], summary["refused"]) == (1, 0, [])
    assert table(app_engine, "outbox_email_event") == [] and table(app_engine, "outbox_suppression") == []


def _drop(path: str) -> Callable[[dict], None]:
    def edit(message: dict) -> None:
        *parents, last = path.split(".")
        node = message
        for p in parents:
            node = node[p]
        del node[last]
    return edit


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def edit(message: dict) -> None:
        *parents, last = path.split(".")
        node = message
        for p in parents:
            node = node[p]
        node[last] = value
    return edit


@pytest.mark.parametrize(("base", "edit", "field"), [
    ("bounce", _drop("mail.messageId"), "Records[0].Sns.Message.mail.messageId: missing"),
    ("bounce", _drop("bounce.feedbackId"), "Records[0].Sns.Message.bounce.feedbackId: missing"),
    ("bounce", _set("bounce.bouncedRecipients", [{"emailAddress": 7}]),
     "Records[0].Sns.Message.bounce.bouncedRecipients[0].emailAddress: must be an email address"),
    ("delivery", _set("delivery.timestamp", "yesterday"),
     "Records[0].Sns.Message.delivery.timestamp: is not an ISO 8601 time"),
    ("send", _set("mail.tags.outbox-message-id", ["not-a-uuid"]),
     "Records[0].Sns.Message.mail.tags.outbox-message-id: is not a UUID"),
    ("send", _set("eventType", "Bounced"), "Records[0].Sns.Message.eventType: must be one of"),
    ("complaint", _drop("complaint"), "Records[0].Sns.Message.complaint: missing"),
])
def test_a_malformed_event_is_refused_in_one_line_naming_the_field(feedback, delivered, app_engine,
                                                                   base, edit, field, caplog):
    message_id, ses_id = delivered()
    event = event_for(base, outbox_id=message_id, ses_id=ses_id)
    message = inner(event)
    edit(message)
    caplog.clear()
    summary = feedback(with_inner(event, message))
    [refusal] = summary["refused"]
    assert refusal.startswith(field) and "\n" not in refusal
    assert table(app_engine, "outbox_email_event") == [] and table(app_engine, "outbox_suppression") == []
    logged = [r for r in caplog.records if r.getMessage() == "feedback event refused"]
    assert [r.field for r in logged] == [field.split(":")[0]]


def test_a_message_that_is_not_json_and_an_event_without_records_are_refused(feedback):
    event = sample("send")
    event["Records"][0]["Sns"]["Message"] = "{not json"
    assert feedback(event)["refused"] == ["Records[0].Sns.Message: is not JSON"]
    from outbox_relay.errors import InvalidEventError
    with pytest.raises(InvalidEventError, match="^Records: must be a non-empty list"):
        feedback({"Records": []})


def test_open_and_click_events_are_ignored(feedback, app_engine):
    event = sample("send")
    message = inner(event)
    message["eventType"] = "Open"
    assert feedback(with_inner(event, message))["ignored"] == 1
    assert table(app_engine, "outbox_email_event") == []


# --------------------------------------------------------------------------
# Suppression
# --------------------------------------------------------------------------

@pytest.mark.parametrize("event_type", ["bounce", "complaint"])
def test_a_permanent_bounce_or_a_complaint_suppresses_the_address_and_the_next_email_is_not_sent(
        feedback, enqueue_mail, send, rows, app_engine, event_type):
    # Given an email sent, then a permanent bounce (or a complaint) about its recipient
    message_id, ses_id = sent_one(enqueue_mail, send, rows, to="Jiwoo <Jiwoo@Example.net>")
    summary = feedback(event_for(event_type, outbox_id=message_id, ses_id=ses_id, recipient="jiwoo@example.net"))
    assert summary["suppressed"] == 1
    [entry] = table(app_engine, "outbox_suppression")
    assert (entry["address_hash"], entry["reason"], str(entry["message_id"])) == (
        HASHER.hash("jiwoo@example.net"), event_type, message_id)

    # When the application sends that address another email (as a cc, with another recipient)
    [second] = enqueue_mail(1, to=["other@example.net"], cc=["jiwoo@example.net"])
    send()

    # Then it is dead-lettered as suppressed without a send, its error naming the field, not the address
    row = next(r for r in rows() if r["message_id"] == second)
    assert (row["status"], row["last_error_class"]) == ("dead", "suppressed")
    assert row["last_error"] == f"ses: not sent: cc[0] is on the suppression list ({event_type})"
    assert len(sent_messages()) == 1


def test_a_transient_bounce_and_a_delay_suppress_nothing(feedback, delivered, app_engine):
    message_id, ses_id = delivered()
    event = event_for("bounce", outbox_id=message_id, ses_id=ses_id, recipient="customer@example.net",
                      bounceType="Transient", bounceSubType="MailboxFull")
    assert feedback(event)["suppressed"] == 0
    feedback(event_for("delivery_delay", outbox_id=message_id, ses_id=ses_id, recipient="customer@example.net"))
    assert table(app_engine, "outbox_suppression") == []
    assert [e["subtype"] for e in table(app_engine, "outbox_email_event")] == [
        "Transient/MailboxFull", "TransientCommunicationFailure"]


def test_with_suppression_off_the_feedback_records_and_suppresses_nothing(
        feedback, monkeypatch, delivered, app_engine):
    monkeypatch.setenv("OUTBOX_SES_SUPPRESSION", "false")
    feedback_run.reset()
    message_id, ses_id = delivered()
    summary = feedback(event_for("complaint", outbox_id=message_id, ses_id=ses_id, recipient="customer@example.net"))
    assert (summary["recorded"], summary["suppressed"]) == (1, 0)
    assert table(app_engine, "outbox_suppression") == []


def test_the_relay_without_a_suppression_list_sends_to_a_suppressed_address(enqueue_mail, send, rows, relay_engine):
    SuppressionList(relay_engine, HASHER).add("customer@example.net")
    enqueue_mail(1, to=["customer@example.net"])
    send(suppression=None)
    assert [r["status"] for r in rows()] == ["delivered"] and len(sent_messages()) == 1


def test_operators_add_list_and_remove_addresses(relay_engine, enqueue_mail, send, rows):
    suppression = SuppressionList(relay_engine, HASHER)
    assert suppression.add("Someone@Example.net", "asked by support") is True
    assert suppression.add("someone@example.net") is False  # the same address, kept with its first reason
    [entry] = suppression.entries()
    assert (entry.address_hash, entry.reason, entry.detail) == (HASHER.hash("someone@example.net"), "manual",
                                                                 "asked by support")
    enqueue_mail(1, to=["someone@example.net"])
    send()
    assert [(r["status"], r["last_error_class"]) for r in rows()] == [("dead", "suppressed")]
    assert suppression.remove("someone@example.net") == "manual"
    assert suppression.remove("someone@example.net") is None
    enqueue_mail(1, to=["someone@example.net"])
    send()
    assert [r["status"] for r in rows()] == ["dead", "delivered"]


# --------------------------------------------------------------------------
# The samples of events/ as they are, through the handler
# --------------------------------------------------------------------------

def test_each_sample_as_it_is_records_its_event_and_emits_what_the_template_watches(feedback, app_engine, capsys):
    # Given the message the samples are about, sent as the samples' SES message id
    sample_id = inner(sample("send"))["mail"]["tags"]["outbox-message-id"][0]
    ses_id = inner(sample("send"))["mail"]["messageId"]
    from outbox_relay.producer import enqueue_email

    with app_engine.begin() as conn:
        enqueue_email(conn, to=["success@simulator.amazonses.com"], subject="s", text="t",
                      message_id=uuid.UUID(sample_id))
        conn.execute(text("UPDATE outbox_message SET status = 'delivered', delivered_at = now(), "
                          "delivery_ref = :ses"), {"ses": ses_id})
    capsys.readouterr()

    # When each file of events/ goes through the handler unchanged
    summaries = {t: feedback(sample(t)) for t in SAMPLES}

    # Then each is recorded once
    assert {t: s["recorded"] for t, s in summaries.items()} == {t: 1 for t in SAMPLES}
    assert sorted(e["event_type"] for e in table(app_engine, "outbox_email_event")) == sorted(SAMPLES)
    # and every metric it emits is in the namespace, with the dimensions, that the template's alarms use
    from support.template import TemplateModel

    model = TemplateModel(every_condition=True)
    watched = {(name, tuple(sorted(dims))) for _, ns, name, dims in model.alarm_metrics()} | {
        (name, tuple(sorted(dims))) for ns, name, dims in model.dashboard_series()}
    emitted = set()
    for line in capsys.readouterr().out.splitlines():
        if '"_aws"' in line:
            doc = json.loads(line)
            for directive in doc["_aws"]["CloudWatchMetrics"]:
                for metric in directive["Metrics"]:
                    emitted.add((metric["Name"], tuple(sorted(directive["Dimensions"][0]))))
    for name, dims in emitted:
        if any(w[0] == name for w in watched):
            assert (name, dims) in watched, (name, dims)
    assert {("EmailBounced", ("configuration_set", "service")), ("FeedbackRecorded", ("service",))} <= emitted


def test_old_events_are_purged_in_batches_and_recent_ones_kept(feedback, delivered, app_engine,
                                                               relay_engine):
    from outbox_relay.feedback.store import purge_email_events

    message_id, ses_id = delivered()
    for t in ("send", "delivery", "delivery_delay"):
        feedback(event_for(t, outbox_id=message_id, ses_id=ses_id))
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_email_event SET received_at = now() - interval '40 days' "
                          "WHERE event_type <> 'delivery_delay'"))
    assert purge_email_events(relay_engine, older_than_seconds=30 * 86400, batch=1) == 2
    assert [e["event_type"] for e in table(app_engine, "outbox_email_event")] == ["delivery_delay"]
