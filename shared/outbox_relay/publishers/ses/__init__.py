"""The Amazon SES (v2) channel: settings (`settings`), error classification
(`errors`), rate limiting (`rate`), the sending pool (`pool`), request building
(`requests`), the client (`client`) and the publisher the relay drives
(`publisher`). `SPEC` is what the registry lists."""

from __future__ import annotations

from ...models import Channel
from ..spec import ChannelLimits, ChannelSpec
from .settings import RELATION_VARIABLES, SesSettings, check_settings


def _limits() -> ChannelLimits:
    from ...email.mime import MAX_MESSAGE_BYTES

    # One SendEmail per message (SES v2 has no batch send of distinct emails).
    return ChannelLimits(entries_per_call=1, bytes_per_call=MAX_MESSAGE_BYTES, payload_bytes=MAX_MESSAGE_BYTES)


SPEC = ChannelSpec(
    channel=Channel.SES,
    settings=SesSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.ses.publisher:build_ses_publisher",
    validator="outbox_relay.producer:email_row",
    producer="enqueue_email",
    enqueue_command="enqueue-email",
    metrics=(),
    limits=_limits(),
    template_prefix="Ses",
    # Each send leaves cycles behind (email header classes, botocore's parsers) that a
    # higher threshold would keep in memory longer; SES is paced by its send rate anyway.
    gc_young_threshold=None,
)
