"""`outbox enqueue-email` as a user runs it."""

from __future__ import annotations

import base64
import uuid

from click.testing import CliRunner
from sqlalchemy import text

from outbox_tools.cli import main


def _run(database_url: str, *args: str):
    return CliRunner().invoke(main, ["enqueue-email", *args], env={"DATABASE_URL": database_url},
                              catch_exceptions=False)


def test_enqueue_email_writes_one_ses_row(database_url, app_engine, tmp_path):
    # Given an HTML file with UTF-8 text and a binary attachment
    (tmp_path / "body.html").write_text("<p>주문 확인 — merci, Zoë 🎉</p>", encoding="utf-8")
    (tmp_path / "receipt.pdf").write_bytes(b"%PDF-1.4 \x00\xff")
    mid = uuid.uuid4()

    # When the command enqueues an email with every kind of option
    result = _run(database_url, "--to", "박지우 <jiwoo@example.com>", "--to", "zoe@example.com",
                  "--cc", "cc@example.com", "--bcc", "audit@example.com", "--reply-to", "help@example.com",
                  "--from", "Shop <noreply@shop.example>", "--subject", "주문 확인 🎉",
                  "--text", "plain body", "--html", f"@{tmp_path / 'body.html'}",
                  "--header", "X-Order-Ref: ORD-1", "--tag", "kind=receipt",
                  "--configuration-set", "transactional", "--attach", str(tmp_path / "receipt.pdf"),
                  "--message-id", str(mid), "--max-attempts", "4")

    # Then it prints the message id and the row holds the email as the relay will read it
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(mid)
    with app_engine.connect() as conn:
        row = conn.execute(text("SELECT o.channel, o.destination, o.type, o.status, o.max_attempts, b.payload "
                                "FROM outbox_message o JOIN outbox_message_body b ON b.seq = o.seq "
                                "WHERE b.message_id = :m"), {"m": mid}).one()
    assert (row.channel, row.destination, row.type, row.status, row.max_attempts) == \
        ("ses", "transactional", "email", "pending", 4)
    p = row.payload
    assert p["to"] == ["박지우 <jiwoo@example.com>", "zoe@example.com"]
    assert (p["from"], p["cc"], p["bcc"], p["reply_to"]) == \
        ("Shop <noreply@shop.example>", ["cc@example.com"], ["audit@example.com"], ["help@example.com"])
    assert (p["subject"], p["text"], p["html"]) == ("주문 확인 🎉", "plain body", "<p>주문 확인 — merci, Zoë 🎉</p>")
    assert (p["headers"], p["tags"]) == ({"X-Order-Ref": "ORD-1"}, {"kind": "receipt"})
    [attachment] = p["attachments"]
    assert (attachment["filename"], attachment["content_type"]) == ("receipt.pdf", "application/pdf")
    assert base64.b64decode(attachment["content_base64"]) == b"%PDF-1.4 \x00\xff"


def test_enqueue_email_refuses_an_invalid_email_naming_the_field(database_url, app_engine):
    # When the second recipient is not an address, or a header tries to inject another one
    bad_to = _run(database_url, "--to", "ok@example.com", "--to", "not-an-address", "--subject", "s", "--text", "t")
    injected = _run(database_url, "--to", "ok@example.com", "--subject", "s", "--text", "t",
                    "--header", "X-A: x\r\nBcc: evil@example.com")

    # Then the command fails with a usage error naming the field, and writes nothing
    assert bad_to.exit_code == 2 and "to[1]" in bad_to.output
    assert injected.exit_code == 2 and "headers" in injected.output
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one() == 0
