"""The SQL enqueue functions (migrations 0009 and 0012) against the Python producer API.

One table of rules, two implementations: for the same inputs, hypothesis checks
that both write the same row or both refuse naming the same field
(docs/decisions/0048). The email function takes a documented subset
(docs/decisions/0054): whatever it writes, the Python API writes the same, and
what only the Python API takes is refused saying so.
"""

from __future__ import annotations

import base64
import re
import uuid
from datetime import datetime, timedelta, timezone
from importlib import import_module
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from outbox_relay.errors import InvalidMessageError
from outbox_relay.producer import enqueue_email, enqueue_event, enqueue_eventbridge, enqueue_sns, enqueue_sqs
from outbox_relay.publishers.ses.addresses import parse_address
from outbox_relay.publishers.ses.mime import build_mime
from outbox_relay.publishers.ses.payload import EmailPayload
from support.sql_functions import Raw, Refused, call, count, stored

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
#: The migrations that create the email function and its parts.
EMAIL_MIGRATIONS = ("0009_enqueue_functions", "0011_email_functions_as_python", "0012_email_function_subset")


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
        with mock.patch("outbox_relay.tracing.current_context", return_value=dict(context or {})):
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
@example(stream="s", type_="t", payload=None, key="", headers=None, deliver_at=None, max_attempts=None, context=None)
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
# The function takes a documented subset (docs/producers.md, decision 0054): whatever it
# writes, the Python API takes and writes the same row; what it refuses beyond Python's
# rules says to use the Python API.

ATEXT = "abcXYZ019!#$%&'*+/=?^_`{|}~-"
plain_local = st.lists(st.text(st.sampled_from(ATEXT), min_size=1, max_size=5), min_size=1, max_size=3).map(".".join)
plain_label = st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,4}[a-zA-Z0-9])?", fullmatch=True).filter(
    lambda s: s[2:4] != "--")
plain_domain = st.tuples(st.lists(plain_label, min_size=1, max_size=3),
                         st.sampled_from(["com", "example", "ORG", "co", "museum"])).map(lambda t: ".".join(t[0] + [t[1]]))
# Display names of the forms the function takes: plain words, or one quoted string without escapes.
plain_word = st.text(st.sampled_from("AbZ019'!#é박ü-_"), min_size=1, max_size=5)
quoted_word = st.text(st.sampled_from('Ab ,.;:()@é\t'), max_size=8).map(lambda s: f'"{s}"')
plain_display = st.none() | quoted_word | st.lists(plain_word, min_size=1, max_size=3).flatmap(
    lambda words: st.sampled_from([" ", "  ", "\t"]).map(lambda gap: gap.join(words)))


@st.composite
def plain_addresses(draw):
    addr = f"{draw(plain_local)}@{draw(plain_domain)}"
    display = draw(plain_display)
    return addr if display is None else f"{display} <{addr}>"


edgy_local = st.text(st.sampled_from(ATEXT + '."é ()\\'), min_size=0, max_size=6) | \
    st.sampled_from(["=?utf-8?q?a?=", "=?a", "a..b", "\u3000a"])
edgy_domain = st.lists(st.text(st.sampled_from("ab1-_é") | st.characters(blacklist_categories=("Cs",), min_codepoint=1),
                               max_size=5) | st.sampled_from(["bücher", "xn--bcher-kva", "ＥＸＡＭＰＬＥ", "⒈"]),
                       min_size=1, max_size=3).map(".".join) | \
    st.tuples(st.lists(plain_label, min_size=1, max_size=2),
              st.sampled_from(["test", "local", "c1", "123", "xn--bcher-kva", "ab--c", "onion", "x" * 64])).map(
    lambda t: ".".join(t[0] + [t[1]]))
# Pieces of display names: quotes, escapes, specials, comments, whitespace, encoded words whole and in parts.
DISPLAY_PIECES = ['"', "\\", " ", "\t", "\u3000", "\u00a0", "a", "Zoë", ".", ",", "(", ")", "<", ">", "@", ":", ";",
                  "[", "]", "=?utf-8?q?", "?=", "=C3=A9", "_", "?", "=", "=?utf-8?q?J=C3=B6rg?=", '""', '"a b"']
edgy_display = st.none() | st.text(st.sampled_from('Ab ,."\'<>=?é\t()\u00a0\u3000\\'), max_size=8) | \
    st.lists(st.sampled_from(DISPLAY_PIECES), max_size=6).map("".join)


@st.composite
def edgy_addresses(draw):
    addr = f"{draw(edgy_local)}@{draw(edgy_domain)}"
    form = draw(st.sampled_from(["{a}", "<{a}>", "{d} <{a}>", "{d}<{a}>", " {a} ", "{a}, {a}", "{d}", " {d}  <{a}> ",
                                 "{a} {d}", "<{a}> ({d})", "< {a}>"]))
    return form.format(a=addr, d=draw(edgy_display) or "")


addresses = plain_addresses() | edgy_addresses()
subjects = st.none() | st.text(st.sampled_from(EDGY + ["é", "\r"]), max_size=8) | st.just("s" * 999)
bodies = st.none() | st.text(st.sampled_from(EDGY), max_size=8)
header_values = st.lists(st.sampled_from(EDGY + ["=?", "?=", "=?utf-8?q?J=C3=B6rg?="]), max_size=6).map("".join) | st.sampled_from(
    ["Tue, 1 Jul 2003 10:52:37 +0200", "a@example.com, Zoë <b@example.com>", "undisclosed-recipients:;", "é" * 330,
     "<https://shop.example/u/1>"])
email_headers = st.none() | st.dictionaries(
    st.sampled_from(["X-A", "x-a", "List-Unsubscribe", "Resent-To", "Content-X", "X-SES-A", "Bad:Name", "",
                     "Date", "Keywords", "X-" + "h" * 125, "Resent-Date", "Orig-Date", "Resent-Sender"]),
    header_values, max_size=4)
tag_maps = st.none() | st.dictionaries(st.sampled_from(["c", "outbox-message-id", "bad name", "t" * 257]),
                                       st.sampled_from(["w", "", "a b", "v" * 256, "v" * 257]), max_size=3)


@st.composite
def attachment_lists(draw):
    out = []
    for _ in range(draw(st.integers(0, 2))):
        content = draw(st.sampled_from(["aGk=", "aGk", "****", "", base64.b64encode(b"x" * 100).decode()]))
        item = {"filename": draw(st.sampled_from(["a.txt", "", " ", "a/b", "r\u00e9sum\u00e9.pdf", "a\tb", "f" * 256,
                                                  "photo.PNG", ".txt", "noext"])),
                "content_type": draw(st.sampled_from(["text/plain", "application/pdf", "Text/Plain",
                                                      "multipart/mixed", "bad", "text/plain; x=1", "", None, 1])),
                "content_base64": content}
        if draw(st.booleans()):  # no content_type: Python guesses it, the function refuses
            del item["content_type"]
        out.append(item)
    return out


def mostly(good, bad):
    """`good` nineteen times in twenty: an email has many fields, and one bad field refuses it."""
    return st.integers(0, 19).flatmap(lambda n: bad if n == 0 else good)


good_subjects = st.text(st.sampled_from("aZ é日 !"), min_size=1, max_size=20).filter(str.strip)
good_headers = st.none() | st.dictionaries(st.sampled_from(["X-A", "List-Unsubscribe", "Keywords", "X-Campaign"]),
                                           st.text(st.sampled_from("ab é<>@:"), max_size=10), max_size=3)
good_attachments = st.lists(st.fixed_dictionaries({
    "filename": st.sampled_from(["a.txt", "résumé.pdf", "data.bin", "Photo.JPG", "archive.tar.gz", "README"]),
    "content_type": st.sampled_from(["text/plain", "application/pdf", "Application/Octet-Stream"]),
    "content_base64": st.binary(max_size=60).map(lambda b: base64.b64encode(b).decode())}), max_size=2)


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
    if currently_in_test_context():  # hypothesis's statistics: how many each wrote
        event(f"python {py[0]}, sql {sq[0]}")
    for o in (py, sq):
        if o[0] == "ok":
            o[1].pop("payload_bytes")  # the same JSON value, written with other spacing
    return py, sq


def python_takes_what_sql_takes(py, sq) -> None:
    """Where the function wrote a row, the Python API wrote the same one."""
    assert sq[0] == "refused" or py == sq, (py, sq)


@pytest.mark.slow  # a property test of many examples: the default run keeps the tables below
@settings(max_examples=200, **SETTINGS)
@given(data=st.data())
def test_what_the_email_function_writes_the_python_api_writes_the_same(conn, data):
    py, sq = email_outcomes(conn, email_args(data.draw, plain_addresses(), 3), data.draw(contexts))
    python_takes_what_sql_takes(py, sq)


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
@settings(max_examples=500, **SETTINGS)
@given(value=addresses)
@example(value='"" B <x@example.com>')
@example(value="=?a@example.com")
def test_an_address_the_function_takes_the_python_api_takes_the_same_way(conn, value):
    # One address at a time, many more forms than the whole-email property reaches.
    py, sq = address_outcomes(conn, value)
    event(f"python {py[0]}, sql {sq[0]}")
    python_takes_what_sql_takes(py, sq)


@pytest.mark.parametrize("value, canonical", [
    ("a@example.com", "a@example.com"), ("  <A.b+c@Example.COM>\t", "A.b+c@example.com"),
    ("Ann  Lee <ann@example.com>", "Ann Lee <ann@example.com>"), ("박지우 <jiwoo@example.com>", "박지우 <jiwoo@example.com>"),
    ('"Doe, Jo" <jo@example.com>', '"Doe, Jo" <jo@example.com>'), ('"Jo"<jo@example.com>', "Jo <jo@example.com>"),
    ("a" * 64 + "@example.com", "a" * 64 + "@example.com"),
])
def test_the_address_forms_the_function_takes(conn, value, canonical):
    assert address_outcomes(conn, value) == (("ok", canonical), ("ok", canonical))


@pytest.mark.parametrize("value, words", [
    ("a" * 65 + "@example.com", "too long before the @-sign"), ("a@localhost", "period"), ("a@b.test", "special-use"),
    ("a@example.123", "top-level domain"), ("a@ab--c.com", "two dashes"), ("a@example.com (Ann)", "takes more forms"),
    ("a@" + "x" * 64 + ".com", "longer than 63"),
])
def test_an_address_python_refuses_the_function_refuses(conn, value, words):
    py, sq = address_outcomes(conn, value)
    assert (py[0], sq[0]) == ("refused", "refused") and words in sq[1], (py, sq)


@pytest.mark.parametrize("args, field", [
    (dict(to=["Zoë <zoe@bücher.de>"]), "to[0]"),                       # an internationalised domain
    (dict(to=["zoe@xn--bcher-kva.de"]), "to[0]"),                      # a Punycode label
    (dict(cc=["=?utf-8?q?J=C3=B6rg?= <j@example.com>"]), "cc[0]"),     # an encoded word in a display name
    (dict(to=['"Doe \\"Jo\\"" <jo@example.com>']), "to[0]"),           # a quoted string with escapes
    (dict(to=['"Doe, J." Smith <jo@example.com>']), "to[0]"),          # quoted and plain words mixed
    (dict(headers={"Resent-Date": "Tue, 1 Jul 2003 10:52:37 +0200"}), "headers"),  # Resent-*, Orig-Date
    (dict(headers={"X-Name": "=?utf-8?q?J=C3=B6rg?="}), "headers"),    # an encoded word in a header value
    (dict(attachments=[{"filename": "a.pdf", "content_base64": "eA=="}]), "attachments[0].content_type"),
])
def test_what_only_the_python_api_takes_is_refused_saying_so(conn, args, field):
    # The list of docs/producers.md: each is taken by the Python API, refused here naming the field.
    py, sq = email_outcomes(conn, {"to": ["a@example.com"], "subject": "s", "text": "t"} | args)
    assert py[0] == "ok", py
    assert sq[:2] == ("refused", field) and "Python API" in sq[2], sq


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
@example(subject="s", names=["été"], sizes=[1000], body="t\n" * 300, header="é \" \\ q")
def test_the_function_s_size_bound_is_never_below_the_real_size(conn, subject, names, sizes, body, header):
    # The function refuses by a bound of the MIME size (it cannot build the message), the
    # Python API by the real size: a message the function takes is within SES's limit.
    payload = EmailPayload.model_validate({
        "to": [f"{n} <to@example.com>" for n in names] or ["to@example.com"], "subject": subject,
        "text": body or None, "html": body or None, "headers": {"X-Note": header},
        "attachments": [{"filename": f"{n}.bin", "content": b"\x00" * s, "content_type": "application/octet-stream"}
                        for n, s in zip(names or ["f"], sizes)]})
    real = len(build_mime(payload, sender="placeholder-sender-address@example.invalid"))
    bound = conn.execute(text("SELECT outbox__mime_bound_v1(CAST(:p AS jsonb))"), {"p": payload.to_json()}).scalar()
    assert real <= bound <= real * 1.05 + 16 * 1024


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
    # Decision 0057: a null payload is refused, as the Python API refuses None
    ("event", dict(stream="s", type="t", payload=None), "payload"),
    ("sqs", dict(type="t", payload=None), "payload"),
    ("eventbridge", dict(type="t", payload=None), "payload"),
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

    v9, v11, _ = (import_module(f"outbox_migrations.versions.{m}") for m in EMAIL_MIGRATIONS)
    created_by_0009 = re.findall(r"^CREATE FUNCTION (\w+)\(", v9.sql_text(), re.M)
    engine = create_engine(empty_database_url, poolclass=NullPool)
    ours = text("SELECT count(*) FROM pg_proc WHERE proname LIKE 'outbox\\_%\\_v1'")
    email = text("SELECT string_agg(prosrc, ';' ORDER BY proname) FROM pg_proc "
                 "WHERE proname IN ('outbox_enqueue_email_v1', 'outbox__address_v1')")
    codepoints = text("SELECT count(*) FROM outbox_idna_codepoint")

    def state():
        with engine.connect() as c:
            table = c.execute(text("SELECT to_regclass('outbox_idna_codepoint') IS NOT NULL")).scalar_one()
            return (c.execute(ours).scalar_one(), c.execute(email).scalar_one(),
                    c.execute(codepoints).scalar_one() if table else None)

    try:
        upgrade(engine, "0010")
        at_0010 = state()
        assert at_0010[0] == len(created_by_0009) and at_0010[2] is None
        upgrade(engine, "0011")  # the frozen migration fills its table from the file beside it
        at_0011 = state()
        assert at_0011[0] == len(created_by_0009) + len(v11.CREATED)
        assert at_0011[2] == len(v11.tables()["idna_codepoints"]) > 4000
        upgrade(engine)  # 0012: 0009's email function, an ASCII address grammar, 0011's parts dropped
        at_head = state()
        assert at_head[0] == len(created_by_0009) and at_head[2] is None
        assert at_head[1] != at_0010[1] and at_head[1] != at_0011[1]
        downgrade(engine, "0011")
        assert state() == at_0011
        downgrade(engine, "0010")  # 0009's functions as they were
        assert state() == at_0010
        downgrade(engine, "0008")  # DROP FUNCTION IF EXISTS with a wrong signature would leave one behind
        assert state()[0] == 0
        upgrade(engine)  # and up again
        assert state() == at_head
    finally:
        engine.dispose()


def test_0014_s_downgrade_puts_back_0009_s_payload_check(empty_database_url):
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool
    from test_migrations import downgrade

    from outbox_migrations import upgrade

    engine = create_engine(empty_database_url, poolclass=NullPool)
    check = text("SELECT prosrc FROM pg_proc WHERE proname = 'outbox__check_json_v1'")
    try:
        upgrade(engine, "0013")
        with engine.connect() as c:
            before = c.execute(check).scalar_one()
        upgrade(engine, "0014")
        with engine.connect() as c:
            for payload in (None, Raw("null")):  # SQL NULL and JSON null
                with pytest.raises(Refused) as refused, c.begin():
                    call(c, "event", stream="s", type="t", payload=payload)
                assert (refused.value.field, refused.value.message) == (
                    "payload", "payload: is required (a null payload is refused); send a JSON value such as {}")
        downgrade(engine, "0013")
        with engine.connect() as c:
            assert c.execute(check).scalar_one() == before
    finally:
        engine.dispose()


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
