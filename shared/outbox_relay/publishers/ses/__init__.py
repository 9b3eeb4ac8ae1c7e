"""The Amazon SES (v2) channel: the email as stored and validated (`payload`), its MIME message (`mime`),
the requests, the paced sending pool and the publisher; `SPEC` is what the registry lists."""

from __future__ import annotations

from ..spec import ChannelLimits, ChannelSpec, Option
from .settings import RELATION_VARIABLES, SesSettings, check_settings

#: SES v2 maximum message size, bytes, after base64 encoding ("Service quotas in Amazon SES").
MAX_MESSAGE_BYTES = 40_000_000

SPEC = ChannelSpec(
    name="ses",
    settings=SesSettings,
    check_settings=check_settings,
    relation_variables=RELATION_VARIABLES,
    builder="outbox_relay.publishers.ses.publisher:build_ses_publisher",
    messages="outbox_relay.publishers.ses.message",
    producer="enqueue_email",
    enqueue_command="enqueue-email",
    enqueue_help="Enqueue one email for the SES relay and print its message id.",
    enqueue_noun="email",
    enqueue_options=(
        Option("--to", "to", "Recipient, 'a@example.com' or 'Name <a@example.com>' (repeatable).", "list"),
        Option("--cc", "cc", "Cc recipient (repeatable).", "list"),
        Option("--bcc", "bcc", "Bcc recipient (repeatable).", "list"),
        Option("--reply-to", "reply_to", "Reply-To address (repeatable).", "list"),
        Option("--from", "sender", "From; a verified SES identity [default: OUTBOX_SES_FROM at send]."),
        Option("--subject", "subject", "Subject (UTF-8).", required=True),
        Option("--text", "text", "Plain-text body, or @file.txt.", "file-text"),
        Option("--html", "html", "HTML body, or @file.html.", "file-text"),
        Option("--header", "headers", "Custom header 'Name: value' (repeatable).", "pairs:"),
        Option("--tag", "tags", "SES message tag 'name=value' (repeatable).", "pairs="),
        Option("--configuration-set", "configuration_set",
               "SES configuration set [default: OUTBOX_SES_CONFIGURATION_SET]."),
        Option("--attach", "attachments", "File to attach (repeatable); the email is then sent as raw MIME.",
               "files"),
        Option("--key", "key", "Ordering key: emails with the same key are sent one at a time, in order."),
    ),
    metrics=(),
    # One SendEmail per message (SES v2 has no batch send of distinct emails).
    limits=ChannelLimits(entries_per_call=1, bytes_per_call=MAX_MESSAGE_BYTES, payload_bytes=MAX_MESSAGE_BYTES),
    template_prefix="Ses",
    messaging_system="aws_ses",
    # Each send leaves cycles behind (email headers, botocore's parsers): keep the default threshold.
    gc_young_threshold=None,
)
