"""The email part of `outbox demo`: a handful of emails through the real relay
handler to a local SES (moto in server mode), one of them rejected.

The handler is configured only by environment variables, as in Lambda or
under ``sam local invoke``: OUTBOX_CHANNEL=ses, OUTBOX_SES_FROM, and
AWS_ENDPOINT_URL_SESV2 pointing at the local moto server. moto has no SES v2
GetAccount, so the server answers it (see `local_ses`); everything else is moto's
own behaviour: sends are recorded, an unverified sender is rejected.
"""

from __future__ import annotations

import email
import importlib.util
import logging
from email import policy
from email.header import decode_header, make_header
from typing import Any, Callable

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from outbox_relay import runtime
from outbox_relay.producer import enqueue_email

from ..lambda_local import LocalContext, environment, load_handler, log_level
from ..local_ses import LocalSesServer

SENDER_IDENTITY = "noreply@shop.example"
DEFAULT_FROM = f"Demo Shop <{SENDER_IDENTITY}>"
UNVERIFIED_FROM = "Promotions <promo@unverified.example>"
#: A tiny but well-formed PDF, as the receipt attachment.
RECEIPT_PDF = (b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[]/Count 0>>"
               b"endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n")


STAGED_EMAIL = ("staged: {sender} is not a verified identity of the local SES, so SES (moto) rejects the send "
                "with MessageRejected, the message's own fault (permanent): dead-lettered at once")


def _enqueue_sample(engine) -> tuple[int, str]:
    """The sample application's emails, each in its own transaction; returns how many,
    and the message id of the one whose failure is staged."""
    mails: list[dict[str, Any]] = [
        dict(to=["박지우 <jiwoo@example.com>"], subject="주문이 확인되었습니다 🎉",
             text="박지우 님, 떡볶이 2인분 주문이 접수되었습니다. 맵게 🌶️",
             html="<p>박지우 님, <b>떡볶이</b> 2인분 주문이 접수되었습니다. 맵게 🌶️</p>",
             tags={"kind": "order-confirmation"}),
        dict(to=["Zoë Müller <zoe@example.com>"], cc=["orders@shop.example"], reply_to=["help@shop.example"],
             subject="Votre crème brûlée est en route — merci !",
             text="Bonjour Zoë,\nvotre commande « crème brûlée » est expédiée.\n",
             headers={"List-Unsubscribe": "<https://shop.example/unsubscribe/zoe>"}),
        dict(to=["Ana Núñez <ana@example.com>"], subject="Recibo de su café ☕",
             text="Hola Ana, adjuntamos el recibo.", attachments=[("recibo-café.pdf", RECEIPT_PDF)]),
        dict(bcc=["warehouse@example.com"], subject="📦 Parcel 3 left Zürich hub 北",
             text="parcel-3 is on its way"),
        dict(to=["jiwoo@example.com"], sender=UNVERIFIED_FROM, subject="Black Friday!",
             text="A sender identity SES (moto) has not verified: rejected, dead-lettered at once."),
    ]
    staged = ""
    for mail in mails:
        with engine.begin() as conn:
            mid = enqueue_email(conn, **mail)
        if mail.get("sender") == UNVERIFIED_FROM:
            staged = str(mid)
    return len(mails), staged


def _decoded(value: str | None) -> str:
    return str(make_header(decode_header(value))) if value else ""


def run_email_demo(db_url: str, echo: Callable[[str], None] = print) -> bool:
    """Send the sample emails through the relay handler to a local SES and report.

    `db_url` is a migrated database (the demo's). Returns True when 4 emails
    were delivered as moto recorded them and the unverified sender's one is
    dead-lettered.
    """
    if importlib.util.find_spec("moto") is None:
        echo("\nemail part skipped: moto, the local SES, is not installed (pip install -e '.[dev]')")
        return True
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto server's request log
    engine = create_engine(db_url, poolclass=NullPool)
    with LocalSesServer(max_send_rate=20) as ses:
        ses.verify(SENDER_IDENTITY)
        echo(f"\nLocal SES: moto server at {ses.url} (identity {SENDER_IDENTITY} verified)")
        written, staged = _enqueue_sample(engine)
        echo(f"enqueued {written} emails in application transactions")

        totals = {"claimed": 0, "delivered": 0, "retried": 0, "dead": 0, "released": 0}
        invocations, skipped = 0, None
        # The handler's warnings are the staged dead letters, which the report explains:
        # only an error is printed between the demo's own lines.
        with environment(DATABASE_URL=db_url, OUTBOX_CHANNEL="ses", OUTBOX_SES_FROM=DEFAULT_FROM,
                         AWS_ENDPOINT_URL_SESV2=ses.url, AWS_ACCESS_KEY_ID="testing",
                         AWS_SECRET_ACCESS_KEY="testing", AWS_SESSION_TOKEN=None, AWS_PROFILE=None,
                         AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1",
                         POWERTOOLS_TRACE_DISABLED="true", POWERTOOLS_METRICS_NAMESPACE="OutboxRelayDemo",
                         POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true"), log_level("ERROR"):
            runtime.reset()
            handler = load_handler("relay")
            while invocations < 10:
                summary = handler({"source": "outbox.demo", "channel": "ses"}, LocalContext(60))
                invocations += 1
                skipped = summary.get("skipped") or skipped
                for k in totals:
                    totals[k] += summary[k]
                if summary["claimed"] == 0:
                    break
            runtime.reset()
        echo(f"ses relay: {invocations} invocations, " + ", ".join(f"{k} {v}" for k, v in totals.items())
             + (f" (gate: {skipped})" if skipped and totals["claimed"] == 0 else ""))

        sent = ses.sent_messages()
        echo("\nWhat SES (moto) recorded:")
        for m in sent:
            if hasattr(m, "raw_data"):
                parsed = email.message_from_string(m.raw_data, policy=policy.default)
                files = [f"{p.get_filename()} ({len(p.get_payload(decode=True))} bytes)"
                         for p in parsed.iter_attachments()]
                echo(f"  {m.id[:16]}… raw MIME  from {_decoded(parsed['From'])} to {_decoded(parsed['To'])}")
                echo(f"      subject: {parsed['Subject']}; attachments: {', '.join(files)}")
            else:
                to = ", ".join(_decoded(a) for k in ("ToAddresses", "CcAddresses", "BccAddresses")
                               for a in m.destinations.get(k, []))
                echo(f"  {m.id[:16]}… simple    from {_decoded(m.source)} to {to}")
                echo(f"      subject: {m.subject}; body: {m.body[:60]!r}")

    with engine.connect() as conn:
        dead = conn.execute(text(
            "SELECT message_id, last_error_class, last_error FROM outbox_message "
            "WHERE channel = 'ses' AND status = 'dead' ORDER BY seq")).fetchall()
        delivered = conn.execute(text(
            "SELECT count(*) FROM outbox_message WHERE channel = 'ses' AND status = 'delivered' "
            "AND delivery_ref IS NOT NULL")).scalar_one()
        left = conn.execute(text(
            "SELECT count(*) FROM outbox_message WHERE channel = 'ses' AND status IN ('pending', 'leased')")
        ).scalar_one()
    engine.dispose()
    echo("\nEmail dead letters (one is staged on purpose, see below):")
    for mid, cls, err in dead:
        echo(f"  {mid}: [{cls}] {err}")
        if str(mid) == staged:
            echo("    " + STAGED_EMAIL.format(sender=UNVERIFIED_FROM.split("<")[1].rstrip(">")))
    ok = (delivered == written - 1 and len(sent) == written - 1 and [str(d[0]) for d in dead] == [staged]
          and left == 0)
    echo(f"emails delivered {delivered} (SES MessageId stored as delivery_ref), dead {len(dead)}, "
         f"still pending {left}")
    return ok
