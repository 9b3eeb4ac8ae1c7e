"""SES events as a configuration set's SNS destination publishes them, inside the Lambda
SNS event; a malformed record is refused naming the field, and nothing of it is written."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterator, Mapping

from ..errors import InvalidEventError
from ..publishers.ses.payload import OUTBOX_TAG

#: SES's event type: (ours, the member holding its details).
EVENT_TYPES: Mapping[str, tuple[str, str]] = {
    "Send": ("send", "send"), "Delivery": ("delivery", "delivery"), "Bounce": ("bounce", "bounce"),
    "Complaint": ("complaint", "complaint"), "Reject": ("reject", "reject"),
    "Rendering Failure": ("rendering_failure", "failure"), "DeliveryDelay": ("delivery_delay", "deliveryDelay")}
#: Event types a destination may publish that the feedback does not record.
IGNORED_TYPES = frozenset({"Open", "Click", "Subscription"})
MAX_SUBTYPE_CHARS = 100
_SES_ID_RE = re.compile(r"[0-9A-Za-z._@+=-]{1,200}")


class MalformedEvent(InvalidEventError):
    """A record that is not an SES event; the problem never quotes the value (it may be an address)."""


@dataclass(frozen=True, slots=True)
class FeedbackEvent:
    """One SES event; `recipients` are in clear, hashed before anything is written, never logged."""

    event_type: str  # send, delivery, bounce, complaint, reject, rendering_failure, delivery_delay
    ses_message_id: str
    outbox_message_id: str | None  # the outbox-message-id tag, canonical UUID text
    configuration_set: str | None
    event_at: datetime
    event_key: str  # with the SES id and type, what identifies the event (feedbackId or its time)
    subtype: str | None
    recipients: tuple[str, ...]
    #: Why this event suppresses its recipients (a permanent bounce, a complaint).
    suppress_reason: str | None = None

    def __repr__(self) -> str:  # no addresses in reprs (tracebacks, logs)
        return (f"FeedbackEvent({self.event_type}, ses={self.ses_message_id}, outbox={self.outbox_message_id}, "
                f"recipients={len(self.recipients)})")


#: A record that carries an event type the feedback does not record.
IGNORED = object()


def parse_records(event: Any) -> Iterator[FeedbackEvent | MalformedEvent | object]:
    """Each record: a `FeedbackEvent`, `IGNORED`, or its `MalformedEvent` (returned: the others go on)."""
    records = event.get("Records") if isinstance(event, dict) else None
    if not isinstance(records, list) or not records:
        raise MalformedEvent("Records", "must be a non-empty list (an SNS event)")
    for i, record in enumerate(records):
        try:
            yield parse_record(record, f"Records[{i}]")
        except MalformedEvent as exc:
            yield exc


def parse_record(record: Any, where: str = "Records[0]") -> FeedbackEvent | object:
    sns = _member(record, "Sns", where, dict)
    text = _member(sns, "Message", f"{where}.Sns", str)
    at = f"{where}.Sns.Message"
    try:
        message = json.loads(text)
    except ValueError:
        raise MalformedEvent(at, "is not JSON") from None
    if not isinstance(message, dict):
        raise MalformedEvent(at, "must be a JSON object (an SES event)")
    return parse_message(message, at)


def parse_message(message: Mapping[str, Any], at: str = "Message") -> FeedbackEvent | object:
    kind = message.get("eventType")
    kind = kind if isinstance(kind, str) else None
    if kind in IGNORED_TYPES:
        return IGNORED
    if kind not in EVENT_TYPES:
        if "notificationType" in message:
            raise MalformedEvent(f"{at}.eventType", "missing: an identity notification, not a configuration "
                                                    "set's event destination")
        raise MalformedEvent(f"{at}.eventType", f"must be one of {', '.join(sorted(EVENT_TYPES))}")
    event_type, member = EVENT_TYPES[kind]
    mail = _member(message, "mail", at, dict)
    ses_id = _member(mail, "messageId", f"{at}.mail", str)
    if not _SES_ID_RE.fullmatch(ses_id):
        raise MalformedEvent(f"{at}.mail.messageId", "is not an SES message id")
    mail_at = _time(mail, "timestamp", f"{at}.mail")
    tags = mail.get("tags", {})
    if not isinstance(tags, dict):
        raise MalformedEvent(f"{at}.mail.tags", "must be an object")
    outbox_id = _tag(tags, OUTBOX_TAG, f"{at}.mail.tags")
    if outbox_id is not None:
        try:
            outbox_id = str(uuid.UUID(outbox_id))
        except ValueError:
            raise MalformedEvent(f"{at}.mail.tags.{OUTBOX_TAG}", "is not a UUID") from None
    config_set = _tag(tags, "ses:configuration-set", f"{at}.mail.tags")
    details = _member(message, member, at, dict)
    dat = f"{at}.{member}"
    destination = _addresses(mail.get("destination", []), f"{at}.mail.destination", None)
    subtype, suppress, recipients, event_at = None, None, destination, mail_at
    if event_type in ("delivery", "bounce", "complaint", "delivery_delay"):
        event_at = _time(details, "timestamp", dat)
    key = event_at.isoformat()
    if event_type == "delivery":
        recipients = _addresses(details.get("recipients", []), f"{dat}.recipients", None)
    elif event_type == "bounce":
        key = _member(details, "feedbackId", dat, str)
        bounce_type = _member(details, "bounceType", dat, str)
        subtype = f"{bounce_type}/{details.get('bounceSubType') or ''}".rstrip("/")
        recipients = _addresses(_member(details, "bouncedRecipients", dat, list), f"{dat}.bouncedRecipients",
                                "emailAddress")
        suppress = "bounce" if bounce_type == "Permanent" else None
    elif event_type == "complaint":
        key = _member(details, "feedbackId", dat, str)
        subtype = details.get("complaintFeedbackType") or details.get("complaintSubType")
        recipients = _addresses(_member(details, "complainedRecipients", dat, list),
                                f"{dat}.complainedRecipients", "emailAddress")
        suppress = "complaint"
    elif event_type == "delivery_delay":
        subtype = details.get("delayType")
        recipients = _addresses(details.get("delayedRecipients", []), f"{dat}.delayedRecipients", "emailAddress")
    elif event_type == "reject":
        subtype = details.get("reason")
    if subtype is not None and not isinstance(subtype, str):
        raise MalformedEvent(f"{dat}", "its type or reason must be text")
    if not key:
        raise MalformedEvent(f"{dat}.feedbackId", "must not be empty")
    return FeedbackEvent(event_type, ses_id, outbox_id, config_set, event_at, key[:200],
                         subtype[:MAX_SUBTYPE_CHARS] if subtype else None, recipients, suppress)


def _member(obj: Any, name: str, where: str, kind: type) -> Any:
    value = obj.get(name) if isinstance(obj, dict) else None
    if value is None:
        raise MalformedEvent(f"{where}.{name}", "missing")
    if not isinstance(value, kind):
        raise MalformedEvent(f"{where}.{name}", f"must be {_KIND_NAMES[kind]}")
    return value


_KIND_NAMES = {dict: "an object", str: "text", list: "a list"}


def _time(obj: Mapping[str, Any], name: str, where: str) -> datetime:
    text = _member(obj, name, where, str)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise MalformedEvent(f"{where}.{name}", "is not an ISO 8601 time") from None
    if value.tzinfo is None:
        raise MalformedEvent(f"{where}.{name}", "has no time zone")
    return value


def _tag(tags: Mapping[str, Any], name: str, where: str) -> str | None:
    value = tags.get(name)
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    raise MalformedEvent(f"{where}.{name}", "must be a list of one text")


def _addresses(items: Any, where: str, member: str | None) -> tuple[str, ...]:
    if not isinstance(items, list):
        raise MalformedEvent(where, "must be a list")
    out = []
    for i, item in enumerate(items):
        value = item.get(member) if member is not None and isinstance(item, dict) else item
        if not isinstance(value, str) or "@" not in value:
            raise MalformedEvent(f"{where}[{i}]" + (f".{member}" if member else ""), "must be an email address")
        out.append(value)
    return tuple(out)
