"""Dedupe keys live in the stream's Redis Cluster hash slot."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from outbox_relay.models import ErrorClass
from outbox_relay.publishers.redis.message import check_stream_name
from outbox_relay.publishers.redis.script import dedupe_prefix
from outbox_relay.publishers.redis.streams import classify_reply_error

names = st.text(min_size=1, max_size=40).filter(lambda s: "{" not in s and "}" not in s)


@given(stream=names)
def test_plain_stream_dedupe_key_shares_its_slot(stream):
    key = dedupe_prefix(stream) + "6f1c1d2e-0000-4000-8000-000000000001"
    assert key_slot(key.encode()) == key_slot(stream.encode())


@given(before=names, tag=names, after=names)
def test_hash_tagged_stream_dedupe_key_shares_its_slot(before, tag, after):
    stream = f"{before}{{{tag}}}{after}"
    check_stream_name(stream)
    key = dedupe_prefix(stream) + "6f1c1d2e-0000-4000-8000-000000000001"
    assert key_slot(key.encode()) == key_slot(stream.encode())


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("WRONGTYPE Operation against a key holding the wrong kind of value", ErrorClass.PERMANENT),
        ("OOM command not allowed when used memory > 'maxmemory'.", ErrorClass.DOWNSTREAM_UNAVAILABLE),
        ("READONLY You can't write against a read only replica.", ErrorClass.DOWNSTREAM_UNAVAILABLE),
        ("LOADING Redis is loading the dataset in memory", ErrorClass.DOWNSTREAM_UNAVAILABLE),
        ("ERR something unexpected", ErrorClass.TRANSIENT),
    ],
)
def test_reply_errors_are_classified(reply, expected):
    assert classify_reply_error(reply) is expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("OOM command not allowed when used memory > 'maxmemory'.", ErrorClass.DOWNSTREAM_UNAVAILABLE),
        ("READONLY You can't write against a read only replica.", ErrorClass.DOWNSTREAM_UNAVAILABLE),
        ("LOADING Redis is loading the dataset in memory", ErrorClass.DOWNSTREAM_UNAVAILABLE),
        ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
         ErrorClass.DOWNSTREAM_UNAVAILABLE),
        ("BUSY Redis is busy running a script.", ErrorClass.DOWNSTREAM_UNAVAILABLE),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", ErrorClass.PERMANENT),
        ("ERR unknown command", ErrorClass.TRANSIENT),
    ],
)
def test_whole_call_error_replies_keep_their_code(raw, expected):
    """A reply error to the whole script call, as redis-py parses it (code stripped into a class)."""
    from redis._parsers.base import BaseParser

    from outbox_relay.publishers.redis.streams import reply_error_text

    exc = BaseParser.parse_error(raw)
    text = reply_error_text(exc)
    assert text == raw
    assert classify_reply_error(text) is expected
