"""Validation at enqueue: one case per rule, each error naming the field (no database needed)."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime, timezone
from unittest import mock

import pytest

from outbox_relay.errors import InvalidMessageError
from outbox_relay.publishers.ses import mime as mime_mod
from outbox_relay.publishers.ses import payload as payload_mod
from outbox_relay.publishers.ses.addresses import parse_address
from outbox_relay.publishers.ses.message import message_row
from outbox_relay.publishers.ses.payload import load_payload

OK = {"to": ["ana@example.com"], "subject": "Hello", "text": "body"}


def refused(**changes) -> InvalidMessageError:
    with pytest.raises(InvalidMessageError) as err:
        message_row(OK | changes)
    return err.value


@pytest.mark.parametrize("changes, field, words", [
    # at least one recipient, at most 50
    ({"to": []}, "to", "at least one recipient"),
    ({"to": [f"u{i}@example.com" for i in range(30)], "cc": [f"c{i}@example.com" for i in range(21)]},
     "to", "at most 50"),
    # addresses well formed (stdlib RFC 5322 parser + email-validator)
    ({"to": ["ana@example.com", "not an address"]}, "to[1]", "well-formed"),
    ({"to": ["ana@"]}, "to[0]", "well-formed"),
    ({"to": ["ana@example"]}, "to[0]", "not a valid address"),
    ({"to": ["ana@example.com, bob@example.com"]}, "to[0]", "exactly one address"),
    ({"to": ["josé@example.com"]}, "to[0]", "non-ASCII local part"),
    ({"cc": ["ana@example.com\r\nBcc: evil@example.com"]}, "cc[0]", "CR, LF"),
    ({"bcc": ["<>"]}, "bcc[0]", ""),
    ({"reply_to": ["help at example.com"]}, "reply_to[0]", ""),
    ({"sender": "Shop noreply@"}, "sender", ""),
    # a body
    ({"text": None, "html": None}, "html/text", "html or a text body"),
    ({"text": "", "html": ""}, "html/text", "html or a text body"),
    ({"text": "nul \x00 inside"}, "text", "NUL"),
    # subject: present, one line
    ({"subject": "   "}, "subject", "blank"),
    ({"subject": "Hi\r\nBcc: evil@example.com"}, "subject", "header injection"),
    ({"subject": "x" * 999}, "subject", "998"),
    # custom headers: legal names, no CR/LF in values, not ours, at most 15
    ({"headers": {"X Bad Name": "v"}}, "headers", "RFC 5322 field-name"),
    ({"headers": {"X-Colon:": "v"}}, "headers", "without a colon"),
    ({"headers": {"X-Ünicode": "v"}}, "headers", "printable ASCII"),
    ({"headers": {"X-Note": "a\r\nBcc: evil@example.com"}}, "headers", "header injection"),
    ({"headers": {"X-Note": "a\nb"}}, "headers", "header injection"),
    ({"headers": {"Subject": "other"}}, "headers", "own fields"),
    ({"headers": {"bcc": "evil@example.com"}}, "headers", "own fields"),
    ({"headers": {"X-SES-CONFIGURATION-SET": "x"}}, "headers", "X-SES-*"),
    ({"headers": {f"X-H{i}": "v" for i in range(16)}}, "headers", "at most 15"),
    ({"headers": {"X-Long": "v" * 996}}, "headers", "995"),
    # every Content-* header and MIME-Version: the MIME structure is ours
    ({"headers": {"Content-Language": "en"}}, "headers", "MIME structure"),
    ({"headers": {"content-id": "<a@b>"}}, "headers", "MIME structure"),
    ({"headers": {"Content-Type": "text/plain"}}, "headers", "MIME structure"),
    ({"headers": {"MIME-Version": "1.0"}}, "headers", "own fields"),
    # a value the email package cannot write as that header (its parser raises IndexError here)
    ({"headers": {"Resent-To": "a@"}}, "headers", "Resent-To: the value address 0 is not a well-formed address"),
    ({"headers": {"Resent-To": "a@", "X-Ok": "v"}, "attachments": [("a.txt", b"x")]}, "headers",
     "Resent-To"),
    # a value its parser does not raise on but records defects for: not that header either
    ({"headers": {"Resent-To": "not an address"}}, "headers", "Resent-To: the value address 0 is not"),
    ({"headers": {"Resent-To": "ops@shop.example, a@localhost"}}, "headers", "address 1 is not a valid address"),
    ({"headers": {"Resent-Sender": "x"}}, "headers", "Resent-Sender: the value address 0 is not"),
    ({"headers": {"Resent-Sender": "a@example.com, b@example.com"}}, "headers", "must be one address"),
    ({"headers": {"Resent-Date": "garbage"}}, "headers", "must be an RFC 5322 date"),
    ({"headers": {"Orig-Date": "1 Dec 2025 10:00 GMT"}}, "headers", "must be an RFC 5322 date"),
    ({"headers": {"Resent-Date": "Sun, 31 Nov 2025 10:00:00 +0000"}}, "headers", "does not parse as a Resent-Date"),
    ({"headers": {"X-A": "=?iso-8859-1?q?caf=E9?="}}, "headers", "charset other than UTF-8 or US-ASCII"),
    ({"headers": {"X-A": "=?utf-8?b?YQ?="}}, "headers", "does not parse as a X-A header (InvalidBase64PaddingDefect)"),
    ({"headers": {"X-A": "a=?utf-8?q?x?="}}, "headers", "does not parse as a X-A header (InvalidHeaderDefect)"),
    # tags: SES's character rules, 256 characters, our reserved name
    ({"tags": {"has space": "v"}}, "tags", "ASCII letters, digits"),
    ({"tags": {"kind": "a.b"}}, "tags", "ASCII letters, digits"),
    ({"tags": {"kind": "é"}}, "tags", "ASCII letters, digits"),
    ({"tags": {"k" * 257: "v"}}, "tags", "1-256"),
    ({"tags": {"kind": ""}}, "tags", "1-256"),
    ({"tags": {"outbox-message-id": "x"}}, "tags", "reserved"),
    # configuration set name
    ({"configuration_set": "has space"}, "configuration_set", "1-64"),
    ({"configuration_set": "c" * 65}, "configuration_set", "1-64"),
    # attachments
    ({"attachments": [("../etc/passwd", b"x")]}, "attachments[0].filename", "not a path"),
    ({"attachments": [("a\r\n.txt", b"x")]}, "attachments[0].filename", "control characters"),
    ({"attachments": [("a.bin", b"x", "not a type")]}, "attachments[0].content_type", "MIME type"),
    ({"attachments": [("a.eml", b"x", "multipart/mixed")]}, "attachments[0].content_type", "multipart"),
    ({"attachments": [{"filename": "a.txt", "content": "text, not bytes"}]}, "attachments[0]", "bytes"),
    # the row's own fields
    ({"message_id": "not-a-uuid"}, "message_id", "UUID"),
    ({"deliver_at": datetime(2030, 1, 1)}, "deliver_at", "timezone-aware"),
    ({"deliver_at": datetime(9999, 1, 1, tzinfo=timezone.utc)}, "deliver_at", "366 days ahead"),
    ({"deliver_at": datetime(1, 1, 1, tzinfo=timezone.utc)}, "deliver_at", "366 days in the past"),
    ({"max_attempts": 0}, "max_attempts", "1 to 1000"),
    ({"max_attempts": "3"}, "max_attempts", "1 to 1000"),
    ({"deliver_at": "2026-12-02T00:00:00+00:00"}, "deliver_at", "datetime"),
    ({"key": ""}, "key", "must not be empty"),
    ({"key": "k" * 513}, "key", "at most 512"),
])
def test_each_rule_is_refused_with_the_field_named(changes, field, words):
    err = refused(**changes)
    assert err.field == field
    assert words in err.problem
    assert str(err).startswith(f"{field}: ")


def test_total_size_is_limited_to_the_ses_v2_maximum(monkeypatch):
    # Given the SES v2 limit of 40 MB, checked on the MIME message with attachments base64-encoded
    assert mime_mod.MAX_MESSAGE_BYTES == 40_000_000
    monkeypatch.setattr(mime_mod, "MAX_MESSAGE_BYTES", 20_000)

    # When the attachment makes the message exceed it, or the body alone does
    with_attachment = refused(attachments=[("big.bin", b"\x00" * 15_000)])  # 20,000 bytes as base64
    long_body = refused(text="x" * 16_000)

    # Then the error names the field that made it too large
    assert with_attachment.field == "attachments" and "bytes as MIME" in with_attachment.problem
    assert long_body.field == "html/text"
    assert message_row(OK | {"attachments": [("small.bin", b"\x00" * 10_000)]})


def test_utf8_subjects_bodies_and_names_are_stored_intact():
    # Given Korean, emoji and accents everywhere text is allowed
    row = message_row(dict(to=["박지우 <jiwoo@example.com>"], cc=["Zoë Müller <zoe@example.com>"],
                           subject="주문 확인 🎉 — crème brûlée", text="안녕하세요 🌶️\nçà et là",
                           html="<p>Ñandú 🐦</p>", headers={"X-Note": "été"},
                           sender="Café Ünïcode <noreply@shop.example>"))

    # Then the stored JSON holds them as given (UTF-8 in jsonb, no escaping to ASCII needed)
    payload = json.loads(row["payload"])
    assert payload["to"] == ["박지우 <jiwoo@example.com>"]
    assert payload["cc"] == ["Zoë Müller <zoe@example.com>"]
    assert payload["from"] == "Café Ünïcode <noreply@shop.example>"
    assert (payload["subject"], payload["text"], payload["html"]) == \
        ("주문 확인 🎉 — crème brûlée", "안녕하세요 🌶️\nçà et là", "<p>Ñandú 🐦</p>")
    assert payload["headers"] == {"X-Note": "été"}
    assert (row["channel"], row["type"], row["destination"]) == ("ses", "email", "ses")


def test_addresses_are_normalised_for_ses():
    # An internationalised domain is stored in ASCII (punycode); the display name is kept, quoted if needed
    assert parse_address("Jiwoo <jiwoo@bücher.example>") == "Jiwoo <jiwoo@xn--bcher-kva.example>"
    assert parse_address('"Park, Jiwoo" <jiwoo@EXAMPLE.com>') == '"Park, Jiwoo" <jiwoo@example.com>'
    assert parse_address("<ana@example.com>") == "ana@example.com"
    # A single address may be given as a string, a configuration set becomes the destination
    row = message_row(dict(to="ana@example.com", subject="s", text="t", configuration_set="transactional"))
    assert json.loads(row["payload"])["to"] == ["ana@example.com"]
    assert row["destination"] == "transactional"


def test_a_stored_payload_is_validated_again_without_echoing_it():
    # Given rows written by hand: a bad address, bad base64, an unknown key, not JSON
    good = json.loads(message_row(OK)["payload"])
    cases = {
        "to[0]": good | {"to": ["ana.secret@"]},
        "attachments[0].content_base64": good | {"attachments": [{"filename": "a.txt", "content_base64": "%%%"}]},
        "unexpected": good | {"unexpected": "field"},
    }
    for field, payload in cases.items():
        with pytest.raises(InvalidMessageError) as err:
            load_payload(json.dumps(payload))
        # Then the error names the field and the kind of problem, never the stored value
        assert err.value.field == field
        assert "ana.secret" not in str(err.value) and "%%%" not in str(err.value)
    with pytest.raises(InvalidMessageError) as err:
        load_payload("{not json")
    assert "json_invalid" in str(err.value)


def test_attachment_given_as_bytes_is_stored_as_standard_base64_with_a_guessed_type():
    data = bytes(range(256))
    row = message_row(OK | {"attachments": [{"filename": "photo.png", "content": data}],
                            "message_id": uuid.UUID(int=7)})
    [stored] = json.loads(row["payload"])["attachments"]
    assert stored == {"filename": "photo.png", "content_type": "image/png",
                      "content_base64": base64.b64encode(data).decode()}
    assert row["message_id"] == uuid.UUID(int=7)


@pytest.mark.parametrize(("filename", "content_type"), [
    ("photo.PNG", "image/png"), ("report.docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
    ("a.tar.gz", "application/gzip"), (".txt", "application/octet-stream"), ("README", "application/octet-stream"),
    ("a.\u212a", "application/octet-stream"),  # the Kelvin sign, which str.lower() makes a "k"
])
def test_a_missing_content_type_is_guessed_by_the_project_s_table_not_the_host_s(filename, content_type):
    with mock.patch("mimetypes.guess_type", side_effect=AssertionError("the host's table")):
        payload = payload_mod.validate_payload(OK | {"attachments": [{"filename": filename, "content": b"x"}]})
    assert payload.attachments[0].content_type == content_type


BAD_HEADER_ROW = ('{"to":["p@example.com"],"subject":"s","text":"t","headers":{"Resent-To":"a@"},'
                  '"attachments":[{"filename":"a.txt","content_type":"text/plain","content_base64":"eA=="}]}')


@pytest.mark.parametrize(("name", "value"), [
    ("Resent-To", "Zoë <zoe@example.com>, ops@shop.example"), ("Resent-To", "undisclosed-recipients:;"),
    ("Resent-Date", "Mon, 1 Dec 2025 10:00:00 +0000"), ("List-Unsubscribe", "<https://shop.example/u/1>"),
    ("X-Campaign", "2025 Q1 ✓"), ("In-Reply-To", "<abc@shop.example>"), ("Orig-Date", "1 Dec 2025 10:00 -0000"),
    ("Resent-Cc", '"Ops, Shop" <ops@shop.example>'), ("X-A", "=?utf-8?q?J=C3=B6rg?= =?UTF-8?B?w6k=?= x"),
])
def test_header_values_that_parse_as_their_header_are_kept(name, value):
    assert message_row(OK | {"headers": {name: value}})


def test_a_stored_header_the_email_package_cannot_parse_is_refused_naming_headers():
    # When the relay reads a row written by hand whose Resent-To makes the stdlib parser raise IndexError
    with pytest.raises(InvalidMessageError) as err:
        load_payload(BAD_HEADER_ROW)

    # Then it is an InvalidMessageError naming the field, not the IndexError, and not echoing the value
    assert err.value.field == "headers"
    assert "a@" not in str(err.value)
    # And so is one whose parser only records defects
    with pytest.raises(InvalidMessageError) as err:
        load_payload(BAD_HEADER_ROW.replace('"Resent-To":"a@"', '"Resent-To":"not an address"'))
    assert err.value.field == "headers" and "not an address" not in str(err.value)


def test_build_mime_turns_any_email_package_exception_into_the_field(monkeypatch):
    # Given a valid payload, and an email package that raises on one attachment
    payload = payload_mod.validate_payload(OK | {"attachments": [("a.txt", b"x"), ("b.txt", b"y")]})
    real = mime_mod.EmailMessage.add_attachment

    def add_attachment(self, content, *args, **kw):
        if kw.get("filename") == "b.txt":
            raise UnicodeError("boom")
        return real(self, content, *args, **kw)

    monkeypatch.setattr(mime_mod.EmailMessage, "add_attachment", add_attachment)

    # When the MIME is built, then the error names the attachment and the exception type only
    with pytest.raises(InvalidMessageError) as err:
        mime_mod.build_mime(payload, sender="noreply@shop.example")
    assert (err.value.field, err.value.problem) == ("attachments[1]", "cannot be written as MIME (UnicodeError)")
