"""Raw MIME built with the standard library's `email` package parses back to what was enqueued."""

from __future__ import annotations

import email
from email import policy
from email.header import decode_header, make_header

from hypothesis import given, settings
from hypothesis import strategies as st

from outbox_relay.errors import InvalidMessageError
from outbox_relay.publishers.ses.addresses import encode_address, encode_header_value
from outbox_relay.publishers.ses.mime import build_mime
from outbox_relay.publishers.ses.payload import validate_payload


def parse(raw: bytes):
    return email.message_from_bytes(raw, policy=policy.default)


def payload(**fields):
    return validate_payload({"to": ["ana@example.com"], "subject": "s", "text": "t"} | fields)


def test_full_message_parses_back_field_by_field():
    # Given an email with every part: names and subject in Korean, html and text, cc, bcc, reply-to,
    # a custom header with accents, and two attachments
    p = payload(to=["박지우 <jiwoo@example.com>", "ana@example.com"], cc=["Zoë <zoe@example.com>"],
                bcc=["audit@example.com"], reply_to=["help@example.com"], subject="주문 확인 🎉 — crème",
                text="안녕 🌶️\r\nline two\n", html="<p>안녕 <b>🌶️</b></p>",
                headers={"X-Campaign": "été 2026", "List-Unsubscribe": "<https://shop.example/u/1>"},
                attachments=[("영수증.pdf", b"%PDF\x00\xff" * 100, "application/pdf"), ("notes.txt", b"plain")])

    # When it is built and parsed again
    raw = build_mime(p, sender="Shop 🛍 <noreply@shop.example>", date="Sun, 29 Nov 2026 19:00:00 +0000")
    m = parse(raw)

    # Then the headers come back decoded, with no Bcc header
    assert str(m["From"]) == "Shop 🛍 <noreply@shop.example>"
    assert str(m["To"]) == "박지우 <jiwoo@example.com>, ana@example.com"
    assert str(m["Cc"]) == "Zoë <zoe@example.com>"
    assert str(m["Reply-To"]) == "help@example.com"
    assert m["Bcc"] is None and b"audit@example.com" not in raw
    assert str(m["Subject"]) == "주문 확인 🎉 — crème"
    assert str(m["X-Campaign"]) == "été 2026"
    assert str(m["List-Unsubscribe"]) == "<https://shop.example/u/1>"
    assert str(m["Date"]) == "Sun, 29 Nov 2026 19:00:00 +0000"

    # And the structure is mixed(alternative(text, html), attachments), bodies byte for byte in UTF-8
    assert m.get_content_type() == "multipart/mixed"
    body = m.get_body(preferencelist=("plain",))
    assert body.get_payload(decode=True) == "안녕 🌶️\r\nline two\n".encode("utf-8")
    assert body.get_content_charset() == "utf-8"
    assert m.get_body(preferencelist=("html",)).get_payload(decode=True) == "<p>안녕 <b>🌶️</b></p>".encode()
    files = {a.get_filename(): (a.get_content_type(), a.get_payload(decode=True)) for a in m.iter_attachments()}
    assert files == {"영수증.pdf": ("application/pdf", b"%PDF\x00\xff" * 100), "notes.txt": ("text/plain", b"plain")}

    # And the raw message is 7-bit with CRLF line endings and short lines, as SES requires of raw mail
    assert raw.isascii()
    lines = raw.split(b"\r\n")
    assert b"\n" not in b"".join(lines)
    assert max(len(line) for line in lines) <= 78


def test_single_body_without_attachments_is_a_single_part():
    m = parse(build_mime(payload(text=None, html="<p>only html</p>"), sender="a@shop.example"))
    assert m.get_content_type() == "text/html"
    assert m.get_payload(decode=True) == b"<p>only html</p>"


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                    min_size=1, max_size=300),
       subject=st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1,
                       max_size=120).filter(lambda s: s.strip()))
def test_any_utf8_body_and_subject_round_trip(text, subject):
    # (leading and trailing blanks of a subject are dropped at validation: a header cannot keep them)
    m = parse(build_mime(payload(text=text, subject=subject), sender="a@shop.example"))
    assert m.get_payload(decode=True) == text.encode("utf-8")
    assert str(m["Subject"]) == subject.strip()


@settings(max_examples=300, deadline=None)
@given(subject=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60),
       value=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_no_subject_or_header_value_can_inject_a_header(subject, value):
    # Given any subject and custom header value: either it is refused at validation ...
    try:
        p = payload(subject=subject, headers={"X-Note": value})
    except InvalidMessageError as err:
        assert err.field in ("subject", "headers")
        return
    # ... or the message carries exactly the headers we wrote, with these values
    m = parse(build_mime(p, sender="a@shop.example"))
    assert sorted(k.lower() for k in m.keys()) == sorted(
        ["from", "to", "subject", "date", "x-note", "mime-version", "content-type", "content-transfer-encoding"])
    assert str(m["Subject"]) == subject.strip()
    assert str(m["X-Note"]) == value.strip()


def test_api_fields_are_encoded_for_ses():
    # Non-ASCII display names become RFC 2047 encoded words (SES SendEmail needs ASCII addresses)
    assert encode_address("ana@example.com") == "ana@example.com"
    assert encode_address("박지우 <jiwoo@example.com>") == "=?utf-8?b?67CV7KeA7Jqw?= <jiwoo@example.com>"
    assert encode_address('"Park, Jiwoo" <jiwoo@example.com>') == '"Park, Jiwoo" <jiwoo@example.com>'
    # Header values: ASCII unchanged, anything else one line of encoded words
    assert encode_header_value("<https://x.example/u>") == "<https://x.example/u>"
    encoded = encode_header_value("été " * 100)
    assert encoded.isascii() and "\n" not in encoded
    assert str(make_header(decode_header(encoded))) == "été " * 100
