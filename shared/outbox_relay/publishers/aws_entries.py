"""A claimed message as an AWS batch request entry, and a batch reply as per-entry answers."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..models import ClaimedMessage, DeliveryResult, ErrorClass
from .aws_message import MAX_AWS_MESSAGE_BYTES, attribute_values, body_size

_GROUP_ID = re.compile(r"[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}")
#: Per entry id: (delivery ref, error code, sender fault).
Answers = dict[str, tuple[str | None, str | None, bool | None]]


@dataclass(slots=True)
class Entry:
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
    """SQS's or SNS's entry; on FIFO the key (or the id) as group and the id as deduplication id."""
    values = attribute_values(m.message_id, m.type, m.key, m.headers_json)
    size = body_size(m.payload_json, values)
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
    """The FIFO group id of a key: the key when SQS and SNS take it, else its digest."""
    if _GROUP_ID.fullmatch(key):
        return key
    return "sha256-" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def batch_answers(reply: Mapping[str, Any], service: str) -> Answers:
    out: Answers = {}
    for ok in reply.get("Successful") or ():
        ref = f"{service}:{ok['MessageId']}"
        if ok.get("SequenceNumber"):
            ref += f":{ok['SequenceNumber']}"
        out[ok["Id"]] = (ref, None, None)
    for bad in reply.get("Failed") or ():
        out[bad["Id"]] = (None, bad.get("Code") or "Unknown", bool(bad.get("SenderFault")))
    return out


def positional_answers(entries: Sequence[Entry], answers: Sequence[Mapping[str, Any]],
                       ref: Callable[[Mapping[str, Any]], str | None]) -> Answers:
    """A reply whose answers are in the request's order ("PutEvents", "PutRecords")."""
    out: Answers = {}
    for e, answer in zip(entries, answers):
        delivered = None if answer.get("ErrorCode") else ref(answer)
        out[str(e.message.seq)] = (delivered, None, None) if delivered else \
            (None, answer.get("ErrorCode") or "Unknown", None)
    return out
