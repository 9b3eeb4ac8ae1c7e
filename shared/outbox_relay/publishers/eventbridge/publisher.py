"""Amazon EventBridge publisher: ``PutEvents`` (docs/channels.md, "EventBridge"); a bus or
source the message chose and EventBridge refuses fails that message only."""

from __future__ import annotations

import json
from typing import Any, Sequence

from ...models import ClaimedMessage, DeliveryResult, ErrorClass
from ...tracing import TRACEPARENT, traceparent_to_xray
from ..aws_batch import AwsBatchPublisher
from ..aws_client import client_for
from ..aws_entries import Answers, Entry, positional_answers
from ..aws_errors import ErrorCodes
from ..aws_message import DEFAULT_DESTINATION, MAX_AWS_MESSAGE_BYTES
from ..registry import Channel
from .message import detail_text, entry_size

#: Refusals of an event's source: the relay's fault for its own source, the message's for one it chose.
CHOSEN_SOURCE_CODES = frozenset({"NotAuthorizedForSourceException"})

CODES = ErrorCodes(
    throttled=frozenset({"ThrottlingException", "Throttling", "LimitExceededException"}),
    configuration=frozenset({"ResourceNotFoundException", "NotAuthorizedForSourceException",
                             "NotAuthorizedForDetailTypeException", "KMSAccessDeniedException",
                             "KMSDisabledException", "KMSNotFoundException", "KMSInvalidStateException"}),
    permanent=frozenset({"MalformedDetail", "InvalidArgument", "ValidationException",
                         "InvalidEventPatternException", "SizeLimitExceeded"}),
    transient=frozenset({"InternalFailure", "InternalException", "ServiceUnavailable"}),
)


class EventBridgePublisher(AwsBatchPublisher):
    """Puts events on buses; `bus` and `source` (OUTBOX_EVENTBRIDGE_*) for events that name none."""

    channel = Channel.EVENTBRIDGE
    service = "eventbridge"
    codes = CODES

    def __init__(self, client: Any, *, bus: str = "default", source: str = "outbox.relay",
                 max_concurrency: int = 4) -> None:
        super().__init__(client, max_concurrency=max_concurrency)
        self.bus = bus
        self.source = source

    def probe(self) -> None:
        self.client.describe_event_bus(Name=self.bus)

    def entry(self, m: ClaimedMessage, entry_id: str) -> Entry | DeliveryResult:
        # Naming the relay's own bus is not a choice of the message's: a refusal stops the batch.
        own = m.destination in (DEFAULT_DESTINATION, self.bus)
        bus = self.bus if own else m.destination
        stored = json.loads(m.headers_json) if m.headers_json else {}
        chosen_source = stored.get("source")
        source = chosen_source or self.source
        detail = detail_text(m.payload_json, m.message_id)
        size = entry_size(detail, m.type, source)
        if size > MAX_AWS_MESSAGE_BYTES:
            return DeliveryResult(m.seq, error_class=ErrorClass.PERMANENT,
                                  error=f"eventbridge: event entry is {size} bytes; the limit is "
                                        f"{MAX_AWS_MESSAGE_BYTES}")
        request = {"Source": source, "DetailType": m.type, "Detail": detail, "EventBusName": bus}
        trace_header = traceparent_to_xray(stored.get(TRACEPARENT, ""))
        if trace_header:
            request["TraceHeader"] = trace_header  # EventBridge takes the X-Ray form only
        return Entry(m, request, size, destination=bus, own_destination=own,
                     chosen=CHOSEN_SOURCE_CODES if chosen_source else frozenset())

    def call(self, entries: Sequence[Entry]) -> Answers:
        reply = self.client.put_events(Entries=[e.request for e in entries])
        return positional_answers(entries, reply.get("Entries") or (),
                                  lambda a: a.get("EventId") and f"eventbridge:{a['EventId']}")


def build_eventbridge_publisher(settings: Any, client: Any | None = None) -> EventBridgePublisher:
    return EventBridgePublisher(
        client_for(settings, client, "events", "EventBridge", settings.eventbridge_max_concurrency),
        bus=settings.eventbridge_bus, source=settings.eventbridge_source,
        max_concurrency=settings.eventbridge_max_concurrency)
