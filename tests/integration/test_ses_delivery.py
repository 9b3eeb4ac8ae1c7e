"""Emails delivered through SES (moto), checked as moto recorded them and as the rows say."""

from __future__ import annotations

import email
import json
import uuid
from email import policy as email_policy
from email.header import decode_header, make_header

from outbox_relay.loop import RelayLoop
from outbox_tools.local_ses import fail_send_email
from support.rows import insert_rows
from support.ses import CONFIGURATION_SET, DEFAULT_FROM, make_publisher, sent_messages

KOREAN = "주문이 확인되었습니다 🎉 — 떡볶이 2인분, 맵게 🌶️"
FRENCH = "Votre crème brûlée est en route — à bientôt, Zoë !"


def _decoded(value: str) -> str:
    return str(make_header(decode_header(value)))


def _capture(client) -> list[dict]:
    """Record every SendEmail request as sent (the hook lets each one through)."""
    requests: list[dict] = []
    fail_send_email(client, lambda request: requests.append(request))
    return requests


def test_simple_emails_arrive_byte_for_byte_with_tags_and_delivery_refs(ses, ses_store, enqueue_mail, policy,
                                                                        plenty, rows):
    # Given three emails in Korean, French and with emoji, text only, html only, and both
    requests = _capture(ses)
    ids = enqueue_mail(1, to=["박지우 <jiwoo@example.com>"], subject=KOREAN, text="안녕하세요 박지우 님\r\n감사합니다 🙏")
    ids += enqueue_mail(1, to=["Zoë Müller <zoe@example.com>"], cc=["orders@example.com"],
                        bcc=["audit@example.com"], reply_to=["help@example.com"], subject=FRENCH,
                        html="<p>Crème brûlée — <b>expédiée</b> ✓</p>", tags={"kind": "shipping"})
    ids += enqueue_mail(1, to=["ana@example.com"], subject="Recibo ☕", text="Hola Ana,\n  café x3\n",
                        html="<p>Hola <i>Ana</i></p>", headers={"X-Order-Ref": "ORD-42"})
    publisher = make_publisher(ses)

    # When one invocation runs
    summary = RelayLoop(ses_store, publisher, policy, plenty, "owner-1").run()

    # Then all three are delivered, each with the SES MessageId moto returned
    assert (summary.claimed, summary.delivered, summary.dead, summary.retried) == (3, 3, 0, 0)
    recorded = {m.subject: m for m in sent_messages()}
    assert set(recorded) == {KOREAN, FRENCH, "Recibo ☕"}
    by_id = {r["message_id"]: r for r in rows()}
    ko, fr, es = (by_id[i] for i in ids)
    assert {r["status"] for r in by_id.values()} == {"delivered"}
    assert ko["delivery_ref"] == recorded[KOREAN].id
    assert fr["delivery_ref"] == recorded[FRENCH].id
    assert es["delivery_ref"] == recorded["Recibo ☕"].id

    # And moto recorded sender, recipients, subject and body exactly (moto keeps html when both are sent)
    k = recorded[KOREAN]
    assert _decoded(k.source) == DEFAULT_FROM
    assert [_decoded(a) for a in k.destinations["ToAddresses"]] == ["박지우 <jiwoo@example.com>"]
    assert k.body == "안녕하세요 박지우 님\r\n감사합니다 🙏"
    f = recorded[FRENCH]
    assert [_decoded(a) for a in f.destinations["ToAddresses"]] == ["Zoë Müller <zoe@example.com>"]
    assert f.destinations["CcAddresses"] == ["orders@example.com"]
    assert f.destinations["BccAddresses"] == ["audit@example.com"]
    assert f.body == "<p>Crème brûlée — <b>expédiée</b> ✓</p>"
    assert recorded["Recibo ☕"].body == "<p>Hola <i>Ana</i></p>"

    # And the requests carried the text part too, the tags (outbox message id first), the
    # default configuration set, reply-to and the custom header
    by_subject = {r["Content"]["Simple"]["Subject"]["Data"]: r for r in requests}
    es_req = by_subject["Recibo ☕"]
    assert es_req["Content"]["Simple"]["Body"]["Text"]["Data"] == "Hola Ana,\n  café x3\n"
    assert es_req["Content"]["Simple"]["Headers"] == [{"Name": "X-Order-Ref", "Value": "ORD-42"}]
    fr_req = by_subject[FRENCH]
    assert fr_req["EmailTags"] == [{"Name": "outbox-message-id", "Value": str(ids[1])},
                                   {"Name": "kind", "Value": "shipping"}]
    assert fr_req["ReplyToAddresses"] == ["help@example.com"]
    assert {r["ConfigurationSetName"] for r in requests} == {CONFIGURATION_SET}
    assert {r["Content"]["Simple"]["Subject"]["Charset"] for r in requests} == {"UTF-8"}


def test_attachment_goes_as_raw_mime_that_parses_back(ses, ses_store, enqueue_mail, policy, plenty, rows):
    # Given an email with a binary attachment with a non-ASCII name, and a bcc recipient
    requests = _capture(ses)
    pdf = bytes(range(256)) * 40
    body_text = "Hola Ana Núñez,\nadjuntamos el recibo. 🧾\n"
    body_html = "<p>Hola <b>Ana Núñez</b> — recibo adjunto 🧾</p>"
    [mid] = enqueue_mail(1, to=["Ana Núñez <ana@example.com>"], cc=["books@example.com"],
                         bcc=["archive@example.com"], subject="Recibo de su café ☕ nº 7",
                         text=body_text, html=body_html, headers={"X-Order-Ref": "ORD-7 été"},
                         attachments=[("recibo-café.pdf", pdf, "application/pdf")])

    # When it is relayed
    summary = RelayLoop(ses_store, make_publisher(ses), policy, plenty, "owner-1").run()

    # Then moto recorded one raw message whose MIME parses back to what was enqueued
    assert summary.delivered == 1
    [raw] = sent_messages()
    assert rows()[0]["delivery_ref"] == raw.id
    parsed = email.message_from_string(raw.raw_data, policy=email_policy.default)
    assert str(parsed["From"]) == DEFAULT_FROM
    assert str(parsed["To"]) == "Ana Núñez <ana@example.com>"
    assert str(parsed["Cc"]) == "books@example.com"
    assert parsed["Bcc"] is None
    assert str(parsed["Subject"]) == "Recibo de su café ☕ nº 7"
    assert str(parsed["X-Order-Ref"]) == "ORD-7 été"
    parts = {p.get_content_type(): p for p in parsed.walk() if not p.is_multipart()}
    assert parts["text/plain"].get_payload(decode=True) == body_text.encode("utf-8")
    assert parts["text/html"].get_payload(decode=True) == body_html.encode("utf-8")
    [attachment] = list(parsed.iter_attachments())
    assert attachment.get_filename() == "recibo-café.pdf"
    assert attachment.get_content_type() == "application/pdf"
    assert attachment.get_payload(decode=True) == pdf
    assert max(len(line) for line in raw.raw_data.splitlines()) <= 998

    # And the request named every recipient in the Destination (bcc only there) and tagged the message id
    [req] = requests
    assert req["Destination"]["BccAddresses"] == ["archive@example.com"]
    assert req["EmailTags"][0] == {"Name": "outbox-message-id", "Value": str(mid)}
    assert "Raw" in req["Content"]


def test_invalid_payload_written_by_hand_is_dead_lettered_and_the_batch_goes_on(ses, ses_store, enqueue_mail,
                                                                                app_engine, policy, plenty, rows):
    # Given a valid email and two rows written by hand with payloads that break the rules
    enqueue_mail(1, subject="good one")
    with app_engine.begin() as conn:
        for payload in ({"to": ["not an address"], "subject": "x", "text": "y"},
                        {"to": ["a@example.com"], "subject": "no body"}):
            conn.execute(insert_rows(
                "SELECT CAST(:id AS uuid) AS message_id, 'ses' AS channel, 'ses' AS destination, "
                "'email' AS type, CAST(:p AS text) AS payload", ["channel", "destination", "type"]),
                {"id": uuid.uuid4(), "p": json.dumps(payload)})

    # When the relay runs
    summary = RelayLoop(ses_store, make_publisher(ses), policy, plenty, "owner-1").run()

    # Then the valid one is sent and the two are dead at once, with an error naming the field
    # and not echoing the stored values
    assert (summary.delivered, summary.dead) == (1, 1 + 1)
    assert [m.subject for m in sent_messages()] == ["good one"]
    dead = [r for r in rows() if r["status"] == "dead"]
    assert [(r["attempts"], r["last_error_class"]) for r in dead] == [(1, "permanent"), (1, "permanent")]
    assert "to[0]" in dead[0]["last_error"] and "not an address" not in dead[0]["last_error"]
    assert "html/text" in dead[1]["last_error"]


def test_message_with_its_own_unverified_sender_is_rejected_alone(ses, ses_store, enqueue_mail, policy, plenty,
                                                                  rows):
    # Given three emails, the second from a sender identity moto has not verified
    enqueue_mail(3, sender=lambda i: "Promo <promo@unverified.example>" if i == 1 else None)

    # When the relay runs
    summary = RelayLoop(ses_store, make_publisher(ses), policy, plenty, "owner-1").run()

    # Then moto's own MessageRejected dead-letters that one, and the others are delivered
    assert (summary.delivered, summary.dead, summary.stopped) == (2, 1, None)
    states = [(r["status"], r["attempts"], r["last_error_class"]) for r in rows()]
    assert states == [("delivered", 1, None), ("dead", 1, "permanent"), ("delivered", 1, None)]
    error = rows()[1]["last_error"]
    assert error.startswith("ses MessageRejected") and "promo@unverified.example" not in error
    assert len(sent_messages()) == 2


def test_unverified_configured_sender_stops_the_batch_and_refunds(ses, ses_store, enqueue_mail, policy, plenty,
                                                                 rows):
    # Given emails that use the configured sender, which moto has not verified
    enqueue_mail(6)
    publisher = make_publisher(ses, default_sender="Other <other@unverified.example>", max_concurrency=1)

    # When the relay runs
    summary = RelayLoop(ses_store, publisher, policy, plenty, "owner-1").run()

    # Then nothing is sent, the batch stops, and every message is pending again with its attempt refunded
    assert summary.stopped == "stop_batch"
    assert (summary.claimed, summary.delivered, summary.dead, summary.released) == (6, 0, 0, 6)
    assert {(r["status"], r["attempts"], r["last_error_class"]) for r in rows()} == {("pending", 0, "configuration")}
    assert "other@unverified.example" not in rows()[0]["last_error"]
    assert sent_messages() == []
