"""One claimed message as an AWS batch request entry, and a batch reply as per-entry
answers: what SQS's ``SendMessageBatch`` and SNS's ``PublishBatch`` share (message
attributes, FIFO group and deduplication ids, the Successful/Failed reply)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..models import ClaimedMessage, DeliveryResult, ErrorClass

# A MessageGroupId is 1-128 of these ("SendMessageBatchRequestEntry").
_GROUP_ID = re.compile(r"[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}")


@dataclass(slots=True)
class Entry:
    """One claimed message, as one request entry."""

    message: ClaimedMessage
    request: dict[str, Any]
    size: int
    #: The destination this entry's call goes to (a bus); entries of one call share it.
    destination: str = ""
    own_destination: bool = True
    #: Error codes that refuse what this message chose itself (an EventBridge source): its fault.
    chosen: frozenset[str] = frozenset()


def attributed_entry(m: ClaimedMessage, entry_id: str, service: str, body_field: str,
                     fifo: bool) -> Entry | DeliveryResult:
    """The SQS or SNS request entry of `m`: the payload JSON as the body (`body_field`),
    the message id, type, ordering key and headers as String attributes; on a FIFO queue
    or topic the ordering key as ``MessageGroupId`` (the message id for a message without
    one: a group of its own) and the message id as ``MessageDeduplicationId``. A message
    over 256 KiB with its attributes is a permanent failure."""
    from ..aws_messages import (
        ID_ATTRIBUTE,
        KEY_ATTRIBUTE,
        MAX_AWS_MESSAGE_BYTES,
        TYPE_ATTRIBUTE,
        attribute_bytes,
        headers_of,
    )

    values = {ID_ATTRIBUTE: m.message_id, TYPE_ATTRIBUTE: m.type}
    if m.key is not None:
        values[KEY_ATTRIBUTE] = m.key
    values.update(headers_of({"headers": m.headers_json}) or {})
    size = len(m.payload_json.encode("utf-8")) + sum(attribute_bytes(k, v) for k, v in values.items())
    if size > MAX_AWS_MESSAGE_BYTES:
        return DeliveryResult(m.seq, error_class=ErrorClass.PERMANENT,
                              error=f"{service}: message is {size} bytes with its attributes; the limit is "
                                    f"{MAX_AWS_MESSAGE_BYTES}")
    request: dict[str, Any] = {
        "Id": entry_id, body_field: m.payload_json,
        "MessageAttributes": {k: {"DataType": "String", "StringValue": v} for k, v in values.items()}}
    if fifo:
        request["MessageGroupId"] = group_id(m.key) if m.key is not None else m.message_id
        request["MessageDeduplicationId"] = m.message_id
    return Entry(m, request, size)


def group_id(key: str) -> str:
    """The FIFO ``MessageGroupId`` of an ordering key: the key itself when SQS and SNS
    take it (1-128 printable ASCII characters), else a digest of it (the key still
    travels as the `outbox-key` attribute)."""
    if _GROUP_ID.fullmatch(key):
        return key
    return "sha256-" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def batch_answers(reply: Mapping[str, Any], service: str) -> dict[str, tuple[str | None, str | None, bool | None]]:
    """Per entry id, from a ``SendMessageBatch`` or ``PublishBatch`` reply: (delivery ref,
    error code, sender fault). The ref is the service's message id, and its sequence
    number on a FIFO queue or topic."""
    out: dict[str, tuple[str | None, str | None, bool | None]] = {}
    for ok in reply.get("Successful") or ():
        ref = f"{service}:{ok['MessageId']}"
        if ok.get("SequenceNumber"):
            ref += f":{ok['SequenceNumber']}"
        out[ok["Id"]] = (ref, None, None)
    for bad in reply.get("Failed") or ():
        out[bad["Id"]] = (None, bad.get("Code") or "Unknown", bool(bad.get("SenderFault")))
    return out
