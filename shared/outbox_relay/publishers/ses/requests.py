"""A claimed email as a ``SendEmail`` request, tagged ``outbox-message-id`` for the feedback, and
error texts with the message's addresses taken out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidMessageError
from ...models import ClaimedMessage, DeliveryResult, ErrorClass
from ...tracing import TRACEPARENT, TRACESTATE, context_of
from .addresses import address_of, encode_address, encode_header_value
from .mime import MAX_MESSAGE_BYTES, build_mime, field_errors, size_field
from .payload import MAX_CUSTOM_HEADERS, OUTBOX_TAG, EmailPayload, load_payload

#: Longest SES error text kept (after redaction), characters.
MAX_ERROR_TEXT = 300
_ANY_ADDRESS = re.compile(r"[^\s<>\"',;:()]+@[^\s<>\"',;:()]+")


@dataclass(frozen=True, slots=True)
class Prepared:
    seq: int
    request: dict[str, Any]
    cost: int  # recipients: MaxSendRate counts recipients, not messages
    own_sender: str | None  # the From the message chose itself (None: the configured one)
    own_configuration_set: str | None
    mailboxes: tuple[tuple[str, str], ...]  # (role, canonical mailbox), to redact error texts


def prepare(m: ClaimedMessage, *, default_sender: str | None, default_configuration_set: str | None,
            simple_headers: bool, payload: EmailPayload | None = None) -> Prepared | DeliveryResult | None:
    """The request; a PERMANENT result naming the field of an invalid payload; None without any sender."""
    try:
        loaded = payload if payload is not None else load_payload(m.payload_json)
        return _prepare(m, _traced(loaded, m.headers_json), default_sender, default_configuration_set, simple_headers)
    except InvalidMessageError as exc:
        return DeliveryResult(m.seq, error_class=ErrorClass.PERMANENT, error=f"ses: {exc}")


def _prepare(m: ClaimedMessage, payload: EmailPayload, default_sender: str | None,
             default_configuration_set: str | None, simple_headers: bool) -> Prepared | DeliveryResult | None:
    sender = payload.sender or default_sender
    if sender is None:
        return None
    config_set = payload.configuration_set or default_configuration_set
    with _content_field("from"):
        from_address = encode_address(sender)
    with _content_field("to"):
        destination = {k: [encode_address(a) for a in v] for k, v in
                       (("ToAddresses", payload.to), ("CcAddresses", payload.cc),
                        ("BccAddresses", payload.bcc)) if v}
    request: dict[str, Any] = {
        "FromEmailAddress": from_address,
        "Destination": destination,
        "EmailTags": [{"Name": OUTBOX_TAG, "Value": m.message_id}]
                     + [{"Name": k, "Value": v} for k, v in payload.tags.items()],
    }
    if payload.reply_to:
        with _content_field("reply_to"):
            request["ReplyToAddresses"] = [encode_address(a) for a in payload.reply_to]
    if config_set:
        request["ConfigurationSetName"] = config_set
    if payload.attachments or (payload.headers and not simple_headers):
        raw = build_mime(payload, sender=sender)
        if len(raw) > MAX_MESSAGE_BYTES:
            raise InvalidMessageError(size_field(payload), f"the message is {len(raw)} bytes as MIME; SES v2 "
                                                           f"accepts at most {MAX_MESSAGE_BYTES}")
        request["Content"] = {"Raw": {"Data": raw}}
    else:
        with _content_field("headers"):
            request["Content"] = {"Simple": _simple_content(payload)}
    with _content_field("from"):
        own_sender = address_of(payload.sender) if payload.sender else None
        boxes = mailboxes(payload, sender)
        redactions(boxes)  # parses every address again; fails here, not in a worker
    return Prepared(seq=m.seq, request=request, cost=len(payload.recipients), own_sender=own_sender,
                    own_configuration_set=payload.configuration_set, mailboxes=boxes)


def _traced(payload: EmailPayload, headers_json: str | None) -> EmailPayload:
    """The email with the stored trace context as headers, unless it sets its own or has no room."""
    traceparent, state = context_of(headers_json)
    if traceparent is None or any(k.lower() == TRACEPARENT for k in payload.headers):
        return payload
    extra = {TRACEPARENT: traceparent, TRACESTATE: state} if state else {TRACEPARENT: traceparent}
    if len(payload.headers) + len(extra) > MAX_CUSTOM_HEADERS:
        extra.pop(TRACESTATE, None)
    if len(payload.headers) + len(extra) > MAX_CUSTOM_HEADERS:
        return payload
    return payload.model_copy(update={"headers": {**payload.headers, **extra}})


def _content_field(field: str) -> Any:
    return field_errors(field, "cannot be encoded for SES")


def _simple_content(payload: EmailPayload) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if payload.text is not None:
        body["Text"] = {"Data": payload.text, "Charset": "UTF-8"}
    if payload.html is not None:
        body["Html"] = {"Data": payload.html, "Charset": "UTF-8"}
    simple: dict[str, Any] = {"Subject": {"Data": payload.subject, "Charset": "UTF-8"}, "Body": body}
    if payload.headers:
        simple["Headers"] = [{"Name": k, "Value": encode_header_value(v)} for k, v in payload.headers.items()]
    return simple


def mailboxes(payload: EmailPayload, sender: str) -> tuple[tuple[str, str], ...]:
    return tuple((role, a) for role, items in (("from", (sender,)), ("to", payload.to), ("cc", payload.cc),
                                               ("bcc", payload.bcc), ("reply_to", payload.reply_to))
                 for a in items)


def redactions(boxes: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """(text form, label) for every way an address may appear in an error, longest first."""
    pairs = {(form, f"<{role}>") for role, a in boxes for form in (a, address_of(a), encode_address(a))}
    return tuple(sorted(pairs, key=lambda p: -len(p[0])))


def redact(text: str, pairs: tuple[tuple[str, str], ...]) -> str:
    """The error text without the message's addresses; any other address becomes ``<address>``."""
    for form, label in pairs:
        if form:
            text = re.sub(re.escape(form), label, text, flags=re.IGNORECASE)
    text = _ANY_ADDRESS.sub("<address>", text)
    return text[:MAX_ERROR_TEXT]


def exception_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Message") or "")
    return str(exc)
