"""The SQL enqueue functions (migrations 0009 and 0011) against the Python producer API.

One table of rules, two implementations: for the same inputs, hypothesis checks
that both write the same row or both refuse naming the same field
(docs/decisions/0048, 0052). The email parts that follow a parser or a
library (addresses, internationalised domains, header values) have properties
of their own over many more values than whole emails reach; the data both
sides read (content types, IDNA code points) is compared whole.
"""

from __future__ import annotations

import base64
import json
import re
import unicodedata
import uuid
from datetime import datetime, timedelta, timezone
from importlib import import_module
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, currently_in_test_context, event, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from outbox_migrations.idna_table import codepoint_rows
from outbox_relay.email.addresses import CONTROL_RE, parse_address
from outbox_relay.email.content_types import CONTENT_TYPES, guess_content_type
from outbox_relay.email.headers import header_problem
from outbox_relay.email.mime import build_mime, mime_bound
from outbox_relay.email.payload import EmailPayload
from outbox_relay.errors import InvalidMessageError
from outbox_relay.producer import enqueue_email, enqueue_event, enqueue_eventbridge, enqueue_sns, enqueue_sqs
from support.sql_functions import Raw, Refused, call, count, stored

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
#: The migrations that create the email function and its parts.
EMAIL_MIGRATIONS = ("0009_enqueue_functions", "0011_email_functions_as_python")


@pytest.fixture
def conn(app_engine):
    with app_engine.connect() as c:
        yield c


def outcome(conn, write, message_id):
    """What one way of enqueueing did, in a transaction rolled back afterwards:
    ("ok", the stored row) or ("refused", field, message)."""
    trans = conn.begin()
    try:
        write()
        return ("ok", stored(conn, message_id))
    except InvalidMessageError as exc:
        return ("refused", exc.field, exc.problem)
    except Refused as exc:
        assert exc.code in ("OB001", "OB002"), exc.message
        assert exc.message.startswith(f"{exc.field}: ")
        return ("refused", exc.field, exc.message)
    finally:
        trans.rollback()


def same(py, sq) -> None:
    """Both wrote the same row, or both refused the same field."""
    assert py[0] == sq[0], (py, sq)
    if py[0] == "refused":
        assert py[1] == sq[1], (py, sq)
    else:
        assert py[1] == sq[1]


# -- strategies ------------------------------------------------------------------------------------------

# Characters the rules care about: blanks Python strips (ASCII and Unicode), braces, controls, non-ASCII.
# No NUL: a PostgreSQL text argument cannot hold one (the driver refuses it before the function runs).
EDGY = list("ab.-_{} \t") + ["\n", "\x1f", "\x7f", "\u00a0", "\u3000", "\u2028", "é", "🎉", "\ufffe", "\uffff"]
names = st.one_of(st.text(st.sampled_from(EDGY), max_size=6), st.sampled_from(["x" * 512, "x" * 513, "orders"]))
json_strings = st.text(st.sampled_from(EDGY + ["\x00", '"', "\\"]), max_size=6)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False)
    | json_strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_strings, inner, max_size=3),
    max_leaves=8)
header_maps = st.none() | st.dictionaries(
    st.sampled_from(["h", "X-Trace.id", "aws.x", "Amazon.y", "a..b", ".a", "outbox-type", "k" * 257, "é", "a b",
                     "traceparent", "tracestate"]),
    st.text(st.sampled_from(EDGY), max_size=4) | st.integers(0, 3), max_size=9)


def deliver_ats():
    # Whole minutes from now, never within two minutes of the 366-day bounds (the two
    # ways read the clock a few milliseconds apart).
    minutes = st.integers(-400 * 1440, 400 * 1440).filter(lambda m: abs(abs(m) - 366 * 1440) > 2)
    return st.none() | minutes.map(lambda m: datetime.now(timezone.utc) + timedelta(minutes=m))


attempts = st.none() | st.integers(-2, 1003)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# The producer's current trace context (as tracing.current_context gives it), or none.
contexts = st.none() | st.sampled_from([{"traceparent": TRACEPARENT},
                                        {"traceparent": TRACEPARENT, "tracestate": "vendor=1,other=x"}])


def traced(context, write):
    """`write` under the producer's current trace `context` (None: no context)."""
    def run():
        with mock.patch("outbox_relay.producer.current_context", return_value=dict(context or {})):
            return write()
    return run


def trace_args(context) -> dict:
    """The same context as the SQL functions' arguments."""
    return {"traceparent": (context or {}).get("traceparent"), "tracestate": (context or {}).get("tracestate")}


# -- events ----------------------------------------------------------------------------------------------

@pytest.mark.slow  # a property test of many examples: the default run keeps the tables below
@settings(max_examples=100, **SETTINGS)
@given(stream=names, type_=names, payload=json_values, key=st.none() | names, headers=header_maps,
       deliver_at=deliver_ats(), max_attempts=attempts, context=contexts)
@example(stream="a{b}c", type_="t", payload={"x": 1}, key=None, headers=None, deliver_at=None, max_attempts=3,
         context=None)
@example(stream="{}", type_="t", payload=1, key="", headers={}, deliver_at=None, max_attempts=None, context=None)
@example(stream="s", type_="t", payload="x" * (256 * 1024 - 2), key=None, headers=None, deliver_at=None,
         max_attempts=None, context=None)
@example(stream="s", type_="t", payload="x" * (256 * 1024 - 1), key=None, headers=None, deliver_at=None,
         max_attempts=None, context=None)
@example(stream="s", type_="t", payload={}, key=None, headers={"tracestate": "mine", "h": "v"}, deliver_at=None,
         max_attempts=None, context={"traceparent": TRACEPARENT, "tracestate": "theirs"})
@example(stream="s", type_="t", payload={}, key=None, headers={"a..b": 0, "tracestate": 0}, deliver_at=None,
         max_attempts=None, context={"traceparent": TRACEPARENT})  # the context's place comes first
def test_events_same_row_or_same_refusal(conn, stream, type_, payload, key, headers, deliver_at, max_attempts,
                                         context):
    mid = uuid.uuid4()
    args = dict(stream=stream, type=type_, payload=payload, key=key, headers=headers, message_id=mid,
                deliver_at=deliver_at, max_attempts=max_attempts)
    py = outcome(conn, traced(context, lambda: enqueue_event(conn, **args)), mid)
    sq = outcome(conn, lambda: call(conn, "event", **args, **trace_args(context)), mid)
    event(f"python {py[0]}")
    same(py, sq)


# -- SQS, SNS, EventBridge -------------------------------------------------------------------------------

ENQUEUE_AWS = {"sqs": enqueue_sqs, "sns": enqueue_sns, "eventbridge": enqueue_eventbridge}


@pytest.mark.slow  # a property test of many examples: the default run keeps the tables below
@settings(max_examples=120, **SETTINGS)
@given(channel=st.sampled_from(sorted(ENQUEUE_AWS)), type_=names, payload=json_values | st.dictionaries(
           st.sampled_from(["a", "outbox-message-id", "\uffff"]), json_values, max_size=2),
       key=st.none() | names, headers=header_maps, deliver_at=deliver_ats(), max_attempts=attempts,
       source=st.none() | st.sampled_from(["shop", "aws.x", "AWS.y", " shop", "", "s" * 257, "é"]),
       bus=st.none() | st.sampled_from(["b", "a/b.c-d_e", "", "b c", "x" * 257,
                                        "arn:aws:events:eu-west-1:123456789012:event-bus/b",
                                        "arn:aws:events:eu-west-1:1234:event-bus/b"]),
       context=contexts)
@example(channel="sqs", type_="t", payload="x" * (256 * 1024 - 90), key=None, headers=None, deliver_at=None,
         max_attempts=None, source=None, bus=None, context=None)
@example(channel="sqs", type_="t", payload="x" * (256 * 1024 - 160), key=None, headers=None, deliver_at=None,
         max_attempts=None, source=None, bus=None, context={"traceparent": TRACEPARENT})
@example(channel="sns", type_="t", payload={}, key=None, headers={f"h{i}": "v" for i in range(6)}, deliver_at=None,
         max_attempts=None, source=None, bus=None, context={"traceparent": TRACEPARENT, "tracestate": "v=1"})
@example(channel="eventbridge", type_="t", payload={"a": "x" * (256 * 1024 - 70)}, key=None, headers=None,
         deliver_at=None, max_attempts=None, source="shop", bus=None, context=None)
def test_aws_messages_same_row_or_same_refusal(conn, channel, type_, payload, key, headers, deliver_at,
                                               max_attempts, source, bus, context):
    mid = uuid.uuid4()
    args = dict(type=type_, payload=payload, key=key, message_id=mid, deliver_at=deliver_at,
                max_attempts=max_attempts)
    if channel == "eventbridge":
        args.update(source=source, bus=bus)
    else:
        args.update(headers=headers)
    py = outcome(conn, traced(context, lambda: ENQUEUE_AWS[channel](conn, **args)), mid)
    sq = outcome(conn, lambda: call(conn, channel, **args, **trace_args(context)), mid)
    event(f"{channel}: python {py[0]}")
    same(py, sq)


# -- email -----------------------------------------------------------------------------------------------

ATEXT = "abcXYZ019!#$%&'*+/=?^_`{|}~-"
plain_local = st.lists(st.text(st.sampled_from(ATEXT), min_size=1, max_size=5), min_size=1, max_size=3).map(".".join)
plain_label = st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,4}[a-zA-Z0-9])?", fullmatch=True).filter(
    lambda s: s[2:4] != "--")
# Internationalised labels, in Unicode and in Punycode: valid ones, then the code points IDNA has rules for.
good_idn_label = st.sampled_from(["bücher", "xn--bcher-kva", "XN--BCHER-KVA", "пример", "例え", "ＥＸＡＭＰＬＥ", "straße",
                                  "l\u00b7l"])
idn_label = good_idn_label | st.sampled_from(["a\u00adb", "xn--4dbc", "xn---bbk", "xn--a", "a\u200cb", "\u0915\u094d\u200d",
                                              "\u0628\u0661", "\u0628\u06f1\u0661", "\u0301a", "⒈", "\U0001f600"])
plain_domain = st.tuples(st.lists(plain_label | good_idn_label, min_size=1, max_size=3),
                         st.sampled_from(["com", "example", "ORG", "co", "museum", "テスト", "рф"])).map(
    lambda t: ".".join(t[0] + [t[1]]))
plain_word = st.text(st.sampled_from("AbZ019'!#é박ü-_\u00a0"), min_size=1, max_size=5).filter(
    lambda w: "=?" not in w) | st.sampled_from(["=?utf-8?q?J=C3=B6rg?=", "=?UTF-8?B?w6k=?=", "=?utf-8?q?a.b_c?=",
                                                "=?us-ascii?Q?x?="])
quoted_word = st.text(st.sampled_from('Ab ,.;:()@é\\"\t'), max_size=8).map(
    lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"')
plain_display = st.none() | st.lists(plain_word | quoted_word, min_size=1, max_size=3).flatmap(
    lambda words: st.sampled_from([" ", "  ", "\t", " \u3000"]).map(lambda gap: gap.join(words)))


@st.composite
def plain_addresses(draw):
    addr = f"{draw(plain_local)}@{draw(plain_domain)}"
    display = draw(plain_display)
    return addr if display is None else f"{display} <{addr}>"


edgy_local = st.text(st.sampled_from(ATEXT + '."é ()\\'), min_size=0, max_size=6) | \
    st.sampled_from(["=?utf-8?q?a?=", "a..b", "\u3000a"])
edgy_domain = st.lists(st.text(st.sampled_from("ab1-_é") | st.characters(blacklist_categories=("Cs",), min_codepoint=1),
                               max_size=5) | idn_label, min_size=1, max_size=3).map(".".join) | \
    st.tuples(st.lists(plain_label, min_size=1, max_size=2),
              st.sampled_from(["test", "local", "c1", "123", "xn--bcher-kva", "ab--c", "onion", "x" * 64])).map(
    lambda t: ".".join(t[0] + [t[1]]))
# Pieces of display names: quotes, escapes, specials, comments, whitespace, encoded words whole and in parts.
DISPLAY_PIECES = ['"', "\\", " ", "\t", "\u3000", "\u00a0", "a", "Zoë", ".", ",", "(", ")", "<", ">", "@", ":", ";",
                  "[", "]", "=?utf-8?q?", "=?UTF-8?B?", "?=", "=C3=A9", "_", "w6k=", "=?latin-1?q?", "?", "=", "x?=ab",
                  "=?utf-8?q?J=C3=B6rg?=", "=?utf-8?q?a.b?=", '""', '"a b"']
edgy_display = st.none() | st.text(st.sampled_from('Ab ,."\'<>=?é\t()\u00a0'), max_size=8) | \
    st.lists(st.sampled_from(DISPLAY_PIECES), max_size=6).map("".join)


@st.composite
def edgy_addresses(draw):
    addr = f"{draw(edgy_local)}@{draw(edgy_domain)}"
    form = draw(st.sampled_from(["{a}", "<{a}>", "{d} <{a}>", "{d}<{a}>", " {a} ", "{a}, {a}", "{d}", " {d}  <{a}> ",
                                 "{a} {d}", "<{a}> ({d})"]))
    return form.format(a=addr, d=draw(edgy_display) or "")


addresses = plain_addresses() | edgy_addresses()
subjects = st.none() | st.text(st.sampled_from(EDGY + ["é", "\r"]), max_size=8) | st.just("s" * 999)
bodies = st.none() | st.text(st.sampled_from(EDGY), max_size=8)
# Pieces of header values: encoded words whole and in parts (charsets, B and Q, bad
# base64, bytes that are not UTF-8, escapes that decode to controls), whitespace.
EW_PIECES = st.sampled_from(["=?utf-8?q?", "=?UTF-8?B?", "=?us-ascii?q?", "=?latin-1?q?", "=?utf-8*en?Q?", "?=", "=?",
                             "?", "=C3=A9", "=FF", "_", "=0A", "w6k=", "YQ", "YQ==", " ", "\t", "a", "é", "\u3000",
                             "=", "=3F", "x?=ab", "=?utf-8?q?J=C3=B6rg?=", "=?utf-8?b?w6k=?="])
encoded_values = st.lists(EW_PIECES, max_size=8).map("".join)
dates = st.tuples(st.sampled_from(["", "Tue, ", "Foo, ", "Tue,"]), st.sampled_from(["1", "01", "0", "31", "29", "30"]),
                  st.sampled_from(["Jan", "Feb", "Nov", "jan"]), st.sampled_from(["2003", "2024", "1899", "2100", "03"]),
                  st.sampled_from(["10:52:37", "23:59", "24:00", "10:60", "10:10:60"]),
                  st.sampled_from(["+0200", "-0000", "+2359", "+2400", "GMT"]), st.sampled_from([" ", "  "])).map(
    lambda t: t[0] + t[6].join(t[1:6]))
address_lists = st.lists(st.sampled_from(["a@example.com", "Zoë <b@example.com>", '"x, y" <c@example.com>', "bad", "",
                                          "undisclosed-recipients:;", "=?utf-8?q?Z=C3=B6?= <d@example.com>"]),
                         min_size=1, max_size=3).map(", ".join)
HEADER_VALUES = {"resent-date": dates, "orig-date": dates, "resent-to": address_lists, "resent-sender": address_lists,
                 "resent-cc": address_lists}


@st.composite
def header_values(draw, name):
    """A value for the header `name`: of its kind mostly, anything sometimes."""
    kind = HEADER_VALUES.get(name.lower(), encoded_values)
    return draw(mostly(kind, st.text(st.sampled_from(EDGY), max_size=6) | encoded_values
                       | st.sampled_from(["<a@b.com>", "é" * 330])))


@st.composite
def header_maps_of(draw, names, max_size):
    chosen = draw(st.lists(names, max_size=max_size, unique=True))
    return {name: draw(header_values(name)) for name in chosen}


email_headers = st.none() | header_maps_of(
    st.sampled_from(["X-A", "x-a", "List-Unsubscribe", "Resent-To", "Content-X", "X-SES-A", "Bad:Name", "",
                     "Date", "Keywords", "X-" + "h" * 125, "Resent-Date", "Orig-Date", "Resent-Sender", "Resent-Cc"]), 4)
tag_maps = st.none() | st.dictionaries(st.sampled_from(["c", "outbox-message-id", "bad name", "t" * 257]),
                                       st.sampled_from(["w", "", "a b", "v" * 256, "v" * 257]), max_size=3)


@st.composite
def attachment_lists(draw):
    out = []
    for _ in range(draw(st.integers(0, 2))):
        content = draw(st.sampled_from(["aGk=", "aGk", "****", "", base64.b64encode(b"x" * 100).decode()]))
        item = {"filename": draw(st.sampled_from(["a.txt", "", " ", "a/b", "r\u00e9sum\u00e9.pdf", "a\tb", "f" * 256,
                                                  "photo.PNG", "a.tar.gz", ".txt", "a.\u212a", "noext"])),
                "content_type": draw(st.sampled_from(["text/plain", "application/pdf", "Text/Plain",
                                                      "multipart/mixed", "bad", "text/plain; x=1", "", None, 1])),
                "content_base64": content}
        if draw(st.booleans()):  # no content_type: guessed from the file name
            del item["content_type"]
        out.append(item)
    return out


def mostly(good, bad):
    """`good` nineteen times in twenty: an email has many fields, and one bad field refuses it."""
    return st.integers(0, 19).flatmap(lambda n: bad if n == 0 else good)


good_subjects = st.text(st.sampled_from("aZ é日 !"), min_size=1, max_size=20).filter(str.strip)
good_headers = st.none() | st.dictionaries(st.sampled_from(["X-A", "List-Unsubscribe", "Keywords", "X-Campaign"]),
                                           st.text(st.sampled_from("ab é<>@:"), max_size=10)
                                           | st.sampled_from(["=?utf-8?q?J=C3=B6rg?= x", "a =?UTF-8?B?w6k=?="]),
                                           max_size=3) \
    | st.dictionaries(st.sampled_from(["Resent-To", "Resent-Date", "Orig-Date", "Resent-Sender"]), st.sampled_from([
        "Tue, 1 Jul 2003 10:52:37 +0200", "1 Jul 2003 10:52 -0000", "Zoë <b@example.com>",
        '"x, y" <c@example.com>, =?utf-8?q?Z=C3=B6?= <d@bücher.de>']), max_size=2)
good_attachments = st.lists(st.fixed_dictionaries({
    "filename": st.sampled_from(["a.txt", "résumé.pdf", "data.bin", "Photo.JPG", "archive.tar.gz", "README"]),
    "content_base64": st.binary(max_size=60).map(lambda b: base64.b64encode(b).decode())}, optional={
    "content_type": st.sampled_from(["text/plain", "application/pdf", "Application/Octet-Stream", ""])}),
    max_size=2)


def email_args(draw, address, n_to, any_address=addresses):
    """An email's arguments: `address` for the good ones, `any_address` for the bad ones."""
    body = draw(st.sampled_from(["html", "text", "both"]))
    return dict(
        to=draw(mostly(st.lists(address, min_size=1, max_size=n_to), st.lists(any_address, max_size=n_to))),
        cc=draw(mostly(st.lists(address, max_size=2), st.lists(any_address, max_size=2))),
        bcc=draw(mostly(st.lists(address, max_size=1), st.lists(any_address, max_size=1))),
        reply_to=draw(mostly(st.lists(address, max_size=1), st.lists(any_address, max_size=1))),
        sender=draw(mostly(st.none() | address, any_address)),
        subject=draw(mostly(good_subjects, subjects)),
        html=draw(mostly(good_subjects if body != "text" else st.none(), bodies)),
        text=draw(mostly(good_subjects if body != "html" else st.none(), bodies)),
        headers=draw(mostly(good_headers, email_headers)),
        tags=draw(mostly(st.none() | st.just({"campaign": "w-1"}), tag_maps)),
        configuration_set=draw(mostly(st.none() | st.just("tx"), st.sampled_from(["bad set", "c" * 65]))),
        attachments=draw(mostly(good_attachments, attachment_lists())),
        key=draw(mostly(st.none() | st.just("k1"), names)),
        deliver_at=draw(deliver_ats()),
        max_attempts=draw(mostly(st.none() | st.integers(1, 1000), attempts)))


def email_outcomes(conn, args, context=None):
    mid = uuid.uuid4()
    args = dict(args, message_id=mid)
    py = outcome(conn, traced(context, lambda: enqueue_email(conn, **args)), mid)
    sq = outcome(conn, lambda: call(conn, "email", **args, **trace_args(context)), mid)
    if currently_in_test_context():  # hypothesis's statistics: how many were written, refused, by the subset
        event(f"python {py[0]}, sql {sq[0]}")
    for o in (py, sq):
        if o[0] == "ok":
            o[1].pop("payload_bytes")  # the same JSON value, written with other spacing
    return py, sq


@pytest.mark.slow  # a property test of many examples: the default run keeps the tables below
@settings(max_examples=150, **SETTINGS)
@given(data=st.data())
def test_emails_same_row_or_same_refusal(conn, data):
    py, sq = email_outcomes(conn, email_args(data.draw, addresses, 3), data.draw(contexts))
    same(py, sq)


@pytest.mark.slow  # a property test of many examples: the default run keeps the tables below
@settings(max_examples=80, **SETTINGS)
@given(data=st.data())
def test_emails_of_good_addresses_agree_exactly(conn, data):
    args = email_args(data.draw, plain_addresses(), 3, plain_addresses())
    py, sq = email_outcomes(conn, args)
    same(py, sq)


@pytest.mark.slow  # a property test of many examples: the default run keeps the tables below
@settings(max_examples=400, **SETTINGS)
@given(data=st.data(), name=st.sampled_from(["X-A", "Resent-Date", "Orig-Date", "Resent-To", "Resent-Sender",
                                             "Resent-From"]))
@example(data=None, name="X-A")
def test_a_header_value_is_taken_by_both_or_by_neither(conn, data, name):
    # One header at a time, many more values than the whole-email properties reach.
    value = (data.draw(header_values(name)) if data else "=?utf-8?q?=FF?=").strip()
    assume(not CONTROL_RE.search(value))  # refused before the header is parsed, by both
    sq = conn.execute(text("SELECT outbox__header_value_problem_v1(:n, :v)"), {"n": name, "v": value}).scalar()
    py = header_problem(name, value)
    assert (py is None) == (sq is None), (py, sq)


def address_outcomes(conn, value):
    """What parse_address and outbox__address_v1 make of one address: ("ok", canonical) or ("refused", why)."""
    try:
        py = ("ok", parse_address(value))
    except ValueError as exc:
        py = ("refused", str(exc))
    try:
        with conn.begin_nested():
            sq = ("ok", conn.execute(text("SELECT outbox__address_v1('to', :v)"), {"v": value}).scalar_one())
    except DBAPIError as exc:
        sq = ("refused", str(exc.orig))
    return py, sq


@pytest.mark.slow  # a property test of many examples: the default run keeps the tables below
@settings(max_examples=400, **SETTINGS)
@given(value=addresses)
@example(value='"" B <x@example.com>')  # an empty quoted word still has a space after it
def test_an_address_is_taken_by_both_the_same_way_or_by_neither(conn, value):
    # One address at a time, many more forms than the whole-email properties reach.
    py, sq = address_outcomes(conn, value)
    assert py == sq if py[0] == "ok" else sq[0] == "refused", (py, sq)


@pytest.mark.parametrize("value, taken", [
    ("a" * 64 + "@example.com", True), ("a" * 65 + "@example.com", False),
    ("Ann <" + "b." * 32 + "c@example.com>", False), ("Ann <" + "b." * 31 + "cc@example.com>", True),
])
def test_the_local_part_is_at_most_64_characters_for_both(conn, value, taken):
    py, sq = address_outcomes(conn, value)
    assert (py[0], sq[0]) == (("ok", "ok") if taken else ("refused", "refused")), (py, sq)
    assert taken or "too long before the @-sign" in py[1] and "too long before the @-sign" in sq[1]
    assert not taken or py == sq


@pytest.mark.slow  # a property test of many examples: the default run keeps the table below
@settings(max_examples=400, **SETTINGS)
@given(labels=st.lists(idn_label | plain_label | st.text(st.characters(blacklist_categories=("Cs",), min_codepoint=1)
                                                         | st.sampled_from("aé.-。．"), min_size=1, max_size=4),
                       min_size=1, max_size=3),
       tld=st.sampled_from(["com", "de", "קום", "xn--4dbc", "テスト", "1", "ＣＯＭ"]))
def test_an_internationalised_domain_is_taken_by_both_the_same_way_or_by_neither(conn, labels, tld):
    py, sq = address_outcomes(conn, "a@" + ".".join(labels + [tld]))
    assert py == sq if py[0] == "ok" else sq[0] == "refused", (py, sq)


@pytest.mark.parametrize("domain", [
    "bücher.de", "xn--bcher-kva.de", "XN--BCHER-KVA.DE", "ＥＸＡＭＰＬＥ.com", "例え。テスト", "straße.de", "пример.рф",
    "xn---bbk.com",          # a non-canonical Punycode spelling
    "xn--a.com",             # not Punycode at all
    "1.xn--4dbc.com",        # the Bidi Rule across labels
    "l\u00b7l.com", "a\u00b7b.com",  # CONTEXTO: the middle dot only between two l
    "a\u200cb.com", "\u0915\u094d\u200c.com",  # CONTEXTJ: a joiner after a virama or between joining letters
    "\u0628\u0661\u06f1.com",  # Arabic-Indic digits of both kinds
    "\u0301a.com", "a\u00adb.com", "⒈.com", "\U0001f600.com", "a\u3000.com", "xn--ls8h.com",
])
def test_internationalised_domains(conn, domain):
    py, sq = address_outcomes(conn, "Zoë <a@" + domain + ">")
    assert py == sq if py[0] == "ok" else sq[0] == "refused", (py, sq)


def test_postgresql_normalizes_as_python_does(conn):
    # The IDNA checks compare a label with its NFC form: both sides need one Unicode version.
    forms = [unicodedata.normalize("NFD", chr(cp)) for cp in range(0x30000)
             if not 0xD800 <= cp <= 0xDFFF and unicodedata.decomposition(chr(cp))[:1] not in ("", "<")]
    got = conn.execute(text("SELECT array_agg(normalize(f, NFC) ORDER BY o) FROM unnest(CAST(:f AS text[])) "
                            "WITH ORDINALITY AS u(f, o)"), {"f": forms}).scalar_one()
    assert got == [unicodedata.normalize("NFC", f) for f in forms]


def test_the_idna_table_in_the_database_is_the_one_the_libraries_give(conn):
    rows = json.loads(codepoint_rows())
    stored_rows = conn.execute(text("SELECT to_jsonb(t) FROM outbox_idna_codepoint t ORDER BY lo")).scalars().all()
    assert stored_rows == rows


def test_fifty_recipients_are_taken_and_fifty_one_refused(conn):
    to = [f"r{i}@example.com" for i in range(51)]
    for n, expected in ((50, "ok"), (51, "refused")):
        py, sq = email_outcomes(conn, dict(to=to[:n], subject="s", text="t"))
        same(py, sq)
        assert py[0] == expected


@pytest.mark.slow  # a property test of many examples: the default run keeps the tables below
@settings(max_examples=60, **SETTINGS)
@given(subject=st.text(st.sampled_from("aé日 "), min_size=1, max_size=400).filter(str.strip),
       names=st.lists(st.text(st.sampled_from("aé日 "), min_size=1, max_size=60).filter(str.strip), max_size=4),
       sizes=st.lists(st.integers(0, 5000), max_size=3), body=st.text(st.sampled_from("a\né日"), min_size=1, max_size=3000),
       header=st.text(st.sampled_from("aé日 "), max_size=300).filter(str.strip))
def test_the_mime_size_bound_is_above_the_real_size_and_close_to_it(conn, subject, names, sizes, body, header):
    # The function refuses by a bound of the MIME size (it cannot build the message): never below it.
    payload = EmailPayload.model_validate({
        "to": [f"{n} <to@example.com>" for n in names] or ["to@example.com"], "subject": subject,
        "text": body or None, "html": body or None, "headers": {"X-Note": header},
        "attachments": [{"filename": f"{n}.bin", "content": b"\x00" * s, "content_type": "application/octet-stream"}
                        for n, s in zip(names or ["f"], sizes)]})
    real = len(build_mime(payload, sender="placeholder-sender-address@example.invalid"))
    bound = conn.execute(text("SELECT outbox__mime_bound_v1(CAST(:p AS jsonb))"), {"p": payload.to_json()}).scalar()
    assert real <= bound <= real * 1.05 + 16 * 1024
    # and the Python API refuses by the same bound
    assert mime_bound(json.loads(payload.to_json())) == bound


@pytest.mark.parametrize("payload", [
    {"to": ['"Doe, Jo" <jo@example.com>', "b@example.com"], "subject": "Grüße 日本", "text": "t\n" * 300},
    {"from": "Zoë <zoe@xn--bcher-kva.de>", "to": ["a@example.com"], "cc": ["c@example.com"],
     "reply_to": ["r@example.com"], "subject": "s", "html": "<p>é</p>", "text": "x",
     "headers": {"X-Note": "é \" \\ q", "Resent-Date": "Tue, 1 Jul 2003 10:52:37 +0200"},
     "attachments": [{"filename": "été.pdf", "content": b"\x00" * 1000}, {"filename": "a.bin", "content": b"12345"}]},
])
def test_python_and_sql_compute_the_same_mime_bound(conn, payload):
    p = EmailPayload.model_validate(payload)
    bound = conn.execute(text("SELECT outbox__mime_bound_v1(CAST(:p AS jsonb))"), {"p": p.to_json()}).scalar()
    assert mime_bound(json.loads(p.to_json())) == bound
    assert bound >= len(build_mime(p, sender="placeholder-sender-address@example.invalid"))


@pytest.mark.slow  # two messages of 40 MB through both APIs
def test_a_message_at_the_size_limit_is_taken_by_both_and_one_byte_more_refused_by_both(conn):
    def args(n: int) -> dict:
        return dict(to=["a@example.com"], subject="s", text="t",
                    attachments=[{"filename": "big.bin", "content_base64": base64.b64encode(b"\x00" * n).decode()}])

    def bound(n: int) -> int:
        b64 = "AAAA" * (n // 3) + base64.b64encode(b"\x00" * (n % 3)).decode()  # base64 of n zero bytes
        return mime_bound({"to": ["a@example.com"], "subject": "s", "text": "t",
                           "attachments": [{"filename": "big.bin", "content_base64": b64,
                                            "content_type": "application/octet-stream"}]})

    lo, hi = 1, 40_000_000  # the largest attachment whose bound is within the limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if bound(mid) <= 40_000_000 else (lo, mid - 1)
    taken, refused = email_outcomes(conn, args(lo)), email_outcomes(conn, args(lo + 1))
    assert [o[0] for o in taken] == ["ok", "ok"], taken
    same(*taken)
    assert [(o[0], o[1]) for o in refused] == [("refused", "attachments")] * 2
    assert "the message is up to" in refused[0][2] and "the message is up to" in refused[1][2]


# -- idempotency, trace context, what a refusal leaves ------------------------------------------------------

def test_the_same_message_definition_is_the_one_of_producer_sql():
    fragment = re.search(r"-- name: same_message_as_m\n(?:--[^\n]*\n)*(.*?)\n\n",
                         (ROOT / "shared/outbox_relay/sql/producer.sql").read_text(), re.S).group(1)
    migration = (ROOT / "migrations/outbox_migrations/versions/0009_enqueue_functions.py").read_text()
    squash = " ".join
    assert squash(fragment.split()) in squash(migration.split())


def test_python_and_sql_under_one_id_are_one_message_and_other_content_is_refused(app_engine):
    mid = uuid.uuid4()
    with app_engine.begin() as c:
        enqueue_event(c, stream="orders", type="order.placed", payload={"id": 7, "total": 1.5}, message_id=mid)
    with app_engine.begin() as c:  # the same JSON value, other spacing and key order
        assert call(c, "event", stream="orders", type="order.placed", payload=Raw('{ "total": 1.50, "id": 7 }'),
                    message_id=mid) == mid
    with pytest.raises(Refused) as refused, app_engine.begin() as c:
        call(c, "event", stream="orders", type="order.placed", payload={"id": 8}, message_id=mid)
    assert (refused.value.code, refused.value.field) == ("OB002", "message_id")
    with app_engine.connect() as c:
        assert count(c) == 2  # one message: its state row and its body


@pytest.mark.parametrize("function, args", [
    ("event", dict(stream="orders", type="t", payload={}, headers={"h": "v"})),
    ("sqs", dict(type="t", payload={})),
    ("sns", dict(type="t", payload={})),
    ("eventbridge", dict(type="t", payload={}, source="shop")),
    ("email", dict(to=["a@example.com"], subject="s", text="t")),
])
def test_trace_context_is_stored_in_the_message_headers(app_engine, function, args):
    with app_engine.begin() as c:
        mid = call(c, function, **args, traceparent=TRACEPARENT, tracestate="vendor=1")
        headers = stored(c, mid)["headers"]
    assert headers["traceparent"] == TRACEPARENT and headers["tracestate"] == "vendor=1"
    assert headers.get("h", "v") == "v" and headers.get("source", "shop") == "shop"  # beside the others


@pytest.mark.parametrize("function, args, field", [
    ("event", dict(stream="s", type="t", payload={}, traceparent="00-xyz"), "traceparent"),
    ("event", dict(stream="s", type="t", payload={}, traceparent="00-" + "0" * 32 + "-00f067aa0ba902b7-01"),
     "traceparent"),
    ("event", dict(stream="s", type="t", payload={}, tracestate="a=1"), "tracestate"),
    ("event", dict(stream="s", type="t", payload={}, traceparent="01" + TRACEPARENT[2:]), "traceparent"),
    ("event", dict(stream=" s", type="t", payload={}), "stream"),
    ("event", dict(stream="s", type="t", payload={}, deliver_at=datetime.now(timezone.utc) + timedelta(days=400)),
     "deliver_at"),
    ("event", dict(stream="s", type="t", payload={}, headers={"h": 1}), "headers.h"),
    ("sqs", dict(type="t", payload={}, headers={f"h{i}": "v" for i in range(8)}), "headers"),
    ("sns", dict(type="t", payload={}, headers={"outbox-key": "v"}), "headers.outbox-key"),
    ("eventbridge", dict(type="t", payload=[1]), "payload"),
    ("eventbridge", dict(type="t", payload={}, bus="no spaces"), "bus"),
    ("email", dict(to=["a@example.com"], subject="s"), "html/text"),
    ("email", dict(to=["a@example.com", "b@example.test"], subject="s", text="t"), "to[1]"),
    ("email", dict(to=["a@example.com"], subject="s\r\nBcc: x@evil.example", text="t"), "subject"),
    ("email", dict(to=["a@example.com"], subject="s", text="t", max_attempts=0), "max_attempts"),
])
def test_a_refusal_names_the_field_and_writes_nothing(app_engine, function, args, field):
    with app_engine.connect() as c:
        with pytest.raises(Refused) as refused:
            with c.begin():
                call(c, function, **args)
        assert (refused.value.code, refused.value.field) == ("OB001", field)
        assert refused.value.message.startswith(field + ": ") and "\n" not in refused.value.message
        assert count(c) == 0


def test_the_downgrades_put_back_what_each_upgrade_found(empty_database_url):
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool
    from test_migrations import downgrade

    from outbox_migrations import upgrade

    v9, v11 = (import_module(f"outbox_migrations.versions.{m}") for m in EMAIL_MIGRATIONS)
    created_by_0009 = re.findall(r"^CREATE FUNCTION (\w+)\(", v9.sql_text(), re.M)
    # 0011 creates its CREATED and replaces some of 0009's: the lists must name them all.
    assert set(re.findall(r"^CREATE OR REPLACE FUNCTION (\w+)\(", v11.sql_text(), re.M)) == \
        {s.split("(")[0] for s in v11.CREATED} | set(v11.REPLACED)
    assert set(v11.REPLACED) <= set(created_by_0009) and not {s.split("(")[0] for s in v11.CREATED} & set(created_by_0009)
    engine = create_engine(empty_database_url, poolclass=NullPool)
    ours = text("SELECT count(*) FROM pg_proc WHERE proname LIKE 'outbox\\_%\\_v1'")
    email = text("SELECT prosrc FROM pg_proc WHERE proname = 'outbox_enqueue_email_v1'")
    try:
        upgrade(engine, "0010")
        with engine.connect() as c:
            assert c.execute(ours).scalar_one() == len(created_by_0009)
            email_of_0009 = c.execute(email).scalar_one()
        upgrade(engine)
        with engine.connect() as c:
            assert c.execute(ours).scalar_one() == len(created_by_0009) + len(v11.CREATED)
            assert c.execute(email).scalar_one() != email_of_0009
        downgrade(engine, "0010")  # 0009's functions as they were
        with engine.connect() as c:
            assert c.execute(ours).scalar_one() == len(created_by_0009)
            assert c.execute(email).scalar_one() == email_of_0009
        downgrade(engine, "0008")  # DROP FUNCTION IF EXISTS with a wrong signature would leave one behind
        with engine.connect() as c:
            assert c.execute(ours).scalar_one() == 0
        upgrade(engine)  # and up again
    finally:
        engine.dispose()


def test_the_content_type_table_in_the_database_is_the_one_python_reads(conn):
    names = ["a", "a.", ".txt", "..txt", "a..pdf", ".a.b.png", "a.txt.gz", "a.\u212a", "résumé.PDF"]
    names += [f"f.{e}" for e in CONTENT_TYPES] + [f"f.{e.upper()}" for e in CONTENT_TYPES]
    guessed = conn.execute(text("SELECT outbox__guess_content_type_v1(n) FROM unnest(CAST(:n AS text[])) AS n"),
                           {"n": names}).scalars().all()
    assert guessed == [guess_content_type(n) for n in names]


# -- two transactions at once ------------------------------------------------------------------------------

@pytest.mark.parametrize("second_payload, refused", [({"v": 1}, False), ({"v": 2}, True)])
def test_the_same_id_from_two_transactions_at_once_is_one_message(database_url, second_payload, refused):
    # The second call waits on the first's uncommitted row; once that commits, the
    # function's second look compares with it (READ COMMITTED, the default).
    from test_enqueue_race import race

    mid = uuid.uuid4()
    out = race(database_url,
               lambda c: call(c, "event", stream="orders", type="t", payload={"v": 1}, message_id=mid),
               lambda c: call(c, "event", stream="orders", type="t", payload=second_payload, message_id=mid))
    if refused:
        assert isinstance(out.get("error"), Refused) and (out["error"].code, out["error"].field) == \
            ("OB002", "message_id")
    else:
        assert "error" not in out and out["ids"] == mid
    assert out["rows"] == [{"v": 1}]  # one message, the first


def test_a_role_with_the_producer_api_s_rights_can_call_the_functions(app_engine, database_url):
    # Security invoker: the caller's rights on the two tables are all the functions use.
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    role = f"outbox_test_role_{uuid.uuid4().hex[:8]}"
    with app_engine.begin() as c:
        c.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        c.execute(text(f'GRANT SELECT, INSERT ON outbox_message, outbox_message_body TO "{role}"'))
    as_role = create_engine(make_url(database_url).set(username=role), poolclass=NullPool)
    try:
        with as_role.begin() as c:
            mid = call(c, "email", to=["a@example.com"], subject="s", text="t")
            assert stored(c, mid)["channel"] == "ses"
    finally:
        as_role.dispose()
        with app_engine.begin() as c:  # privileges first (in this database), then the role (cluster-wide)
            c.execute(text(f'DROP OWNED BY "{role}"'))
            c.execute(text(f'DROP ROLE "{role}"'))
