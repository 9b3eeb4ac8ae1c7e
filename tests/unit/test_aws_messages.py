"""Sizes as SQS, SNS and EventBridge count them, the EventBridge detail, and the FIFO
group id of an ordering key."""

import hashlib
import json
import re
import uuid

import pytest

from outbox_relay.models import ClaimedMessage, Status
from outbox_relay.publishers.aws_entries import attributed_entry, group_id
from outbox_relay.publishers.aws_message import MAX_AWS_MESSAGE_BYTES, attribute_bytes, attributed_size
from outbox_relay.publishers.eventbridge.message import detail_text, entry_size
from outbox_relay.publishers.eventbridge.publisher import EventBridgePublisher
from outbox_relay.publishers.registry import Channel, spec_for

MID = "0b7c4a52-3c1e-4d8e-9a51-2f0e6d9b1c11"


def aws_row(channel, fields):
    return spec_for(channel).message_row(fields)


def message_size(channel, row, message_id, source=None):
    """The size the producer API checks: SQS and SNS count body and attributes, EventBridge its entry."""
    if channel is Channel.EVENTBRIDGE:
        return entry_size(detail_text(row["payload"], message_id), row["type"], source)
    return attributed_size({**row, "message_id": message_id})


def test_an_attribute_counts_its_name_its_data_type_and_its_value_in_utf8():
    assert attribute_bytes("outbox-type", "주문") == len("outbox-type") + len("String") + 6


def test_an_sqs_or_sns_message_counts_its_body_and_every_attribute():
    row = {"payload": '{"n":"é"}', "type": "order.placed", "key": "k1", "headers": '{"tenant":"eu"}'}
    expected = (len('{"n":"é"}'.encode()) + attribute_bytes("outbox-message-id", MID)
                + attribute_bytes("outbox-type", "order.placed") + attribute_bytes("outbox-key", "k1")
                + attribute_bytes("tenant", "eu"))
    assert message_size(Channel.SQS, row, MID) == message_size(Channel.SNS, row, MID) == expected


def test_without_a_key_or_headers_only_the_relays_two_attributes_count():
    row = {"payload": "1", "type": "t", "key": None, "headers": None}
    assert message_size(Channel.SQS, row, MID) == 1 + attribute_bytes("outbox-message-id", MID) + \
        attribute_bytes("outbox-type", "t")


def test_an_eventbridge_entry_counts_detail_detail_type_source_and_time():
    row = {"payload": '{"a":1}', "type": "order.placed"}
    detail = detail_text('{"a":1}', MID)
    assert message_size(Channel.EVENTBRIDGE, row, MID, "shop.orders") == \
        len(detail) + len("order.placed") + len("shop.orders") + 14
    assert message_size(Channel.EVENTBRIDGE, row, MID) == len(detail) + len("order.placed") + 14


@pytest.mark.parametrize(("payload", "detail"), [
    ("{}", f'{{"outbox-message-id":"{MID}"}}'),
    ('{"a":1}', f'{{"outbox-message-id":"{MID}","a":1}}'),
    ('{"nested":{"b":[1,2]},"s":"}"}', f'{{"outbox-message-id":"{MID}","nested":{{"b":[1,2]}},"s":"}}"}}'),
    (' { "a" : 1 } ', f'{{"outbox-message-id":"{MID}","a" : 1}}'),
    ('{"note":"맵게 🌶️"}', f'{{"outbox-message-id":"{MID}","note":"맵게 🌶️"}}'),
])
def test_the_detail_is_the_payload_with_the_message_id_first_and_its_own_text_unchanged(payload, detail):
    text = detail_text(payload, MID)
    assert text == detail
    parsed = json.loads(text)
    assert list(parsed)[0] == "outbox-message-id" and parsed["outbox-message-id"] == MID


def _claimed(row, seq=1):
    return ClaimedMessage(seq, str(row["message_id"]), Status.LEASED, row["destination"], row["type"], row["key"],
                          row["payload"], row["headers"], 1, 10, "2026-12-02T10:00:00Z")


@pytest.mark.parametrize("channel", [Channel.SQS, Channel.SNS])
def test_the_size_checked_at_enqueue_is_the_size_the_relay_sends(channel):
    row = aws_row(channel, {"type": "order.placed", "payload": {"n": "é" * 100}, "key": "k",
                            "headers": {"tenant": "eu", "trace": "abc"}})
    entry = attributed_entry(_claimed(row), "1", channel.value, "MessageBody", fifo=False)
    assert entry.size == message_size(channel, row, str(row["message_id"]))


def test_the_eventbridge_size_checked_at_enqueue_is_the_size_the_relay_sends():
    row = aws_row(Channel.EVENTBRIDGE, {"type": "order.placed", "payload": {"n": "é"}, "source": "shop.orders"})
    entry = EventBridgePublisher(client=None).entry(_claimed(row), "1")
    assert entry.size == message_size(Channel.EVENTBRIDGE, row, str(row["message_id"]), "shop.orders")


def test_an_eventbridge_event_that_fits_at_enqueue_but_not_with_the_relays_source_is_refused_when_sent():
    from outbox_relay.models import ErrorClass

    row = aws_row(Channel.EVENTBRIDGE, {"type": "t", "payload": {"x": "x" * (MAX_AWS_MESSAGE_BYTES - 100)}})
    result = EventBridgePublisher(client=None, source="s" * 60).entry(_claimed(row), "1")
    assert result.error_class is ErrorClass.PERMANENT and "limit" in result.error


# -- the FIFO group id --------------------------------------------------------------------------------

GROUP = re.compile(r"[\x21-\x7e]{1,128}")  # what SQS and SNS take as a MessageGroupId


@pytest.mark.parametrize("key", ["k", "customer-77", "k" * 128, "a/b:c@d", "!~", "{tenant}.orders"])
def test_a_key_sqs_takes_is_its_own_group_id(key):
    assert group_id(key) == key


@pytest.mark.parametrize("key", ["k" * 129, "two words", "주문-1", "tab\tkey", "é", "k" * 512, "line\nbreak"])
def test_a_key_sqs_would_refuse_becomes_a_digest_that_sqs_takes(key):
    gid = group_id(key)
    assert gid == "sha256-" + hashlib.sha256(key.encode("utf-8")).hexdigest()
    assert GROUP.fullmatch(gid) and gid == group_id(key)  # valid, and the same every time


def test_distinct_keys_get_distinct_groups():
    keys = ["k" * 129, "k" * 130, "주문-1", "주문-2", "a b", "a  b"]
    assert len({group_id(k) for k in keys}) == len(keys)


def test_a_message_without_a_key_on_fifo_is_its_own_group_and_the_message_id_deduplicates():
    row = aws_row(Channel.SQS, {"type": "t", "payload": 1, "message_id": uuid.UUID(MID)})
    entry = attributed_entry(_claimed(row), "1", "sqs", "MessageBody", fifo=True)
    assert entry.request["MessageGroupId"] == MID and entry.request["MessageDeduplicationId"] == MID
    assert "MessageGroupId" not in attributed_entry(_claimed(row), "1", "sqs", "MessageBody", fifo=False).request
