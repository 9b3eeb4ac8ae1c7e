"""Operations without a database: durations, the redrive selection rules."""

import uuid

import pytest

from outbox_relay.operations.redrive import RedriveSelection
from outbox_relay.publishers.registry import Channel
from outbox_tools.durations import format_seconds, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600),
    ("1h30m", 5400), ("1h 30m", 5400), ("1.5h", 5400), ("7D", 604800),
    ("3600", 3600), ("0.5", 0.5),
    ("P7D", 604800), ("PT12H", 43200), ("P1DT6H", 108000), ("pt90s", 90),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "7x", "d7", "-5m", "P", "7 days", "1h-30m"])
def test_not_durations_say_which_forms_work(text):
    with pytest.raises(ValueError, match=r"7d, 12h, 30m, 90s"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0s", "0", "PT0S"])
def test_zero_is_refused(text):
    with pytest.raises(ValueError, match="longer than zero"):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (59.4, "59s"), (61, "1m 1s"), (3599, "59m 59s"), (3660, "1h 1m"), (90000, "1d 1h"),
])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


def test_a_redrive_must_say_what_it_moves():
    with pytest.raises(ValueError, match="say what to redrive"):
        RedriveSelection()
    with pytest.raises(ValueError, match="takes no ids"):
        RedriveSelection(channel=Channel.SES, everything=True)
    with pytest.raises(ValueError, match="takes no ids"):
        RedriveSelection(message_ids=(uuid.uuid4(),), everything=True)


def test_redrive_filters_become_statement_parameters():
    mid = uuid.uuid4()
    assert RedriveSelection((mid,), Channel.REDIS, "transient").params() == {
        "channel": "redis", "error_class": "transient", "message_ids": [str(mid)]}
    assert RedriveSelection(everything=True).params() == {"channel": None, "error_class": None, "message_ids": None}
