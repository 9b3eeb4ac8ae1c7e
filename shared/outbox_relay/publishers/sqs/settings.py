"""The SQS channel's settings (OUTBOX_SQS_*): a mixin of `config.Settings`."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings

from ...urls import EndpointUrl

# A queue URL, a local endpoint's too; a name is at most 80 characters with ".fifo" ("CreateQueue", QueueName).
_NAME = r"(?:[A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo)"
_QUEUE_URL = re.compile(rf"https?://[^/\s]+/[^/\s]+/{_NAME}")


class SqsSettings(BaseSettings):
    aws_endpoint_url_sqs: EndpointUrl = Field(default=None, validation_alias="AWS_ENDPOINT_URL_SQS")
    sqs_queue_url: str | None = None
    """OUTBOX_SQS_QUEUE_URL: the queue's URL; a name ending in `.fifo` is a FIFO queue."""
    sqs_max_concurrency: int = Field(default=4, ge=1, le=32)


RELATION_VARIABLES: tuple[str, ...] = ("OUTBOX_SQS_QUEUE_URL",)


def check_settings(s: Any, relayed: bool) -> None:
    if relayed and not s.sqs_queue_url:
        raise ValueError("OUTBOX_SQS_QUEUE_URL: set the queue's URL for OUTBOX_CHANNEL=sqs")
    if s.sqs_queue_url and not _QUEUE_URL.fullmatch(s.sqs_queue_url):
        raise ValueError("OUTBOX_SQS_QUEUE_URL: must be a queue URL, https://sqs.<region>.amazonaws.com/"
                         "<account>/<name> (a name of at most 80 letters, digits, '_' or '-', ending in '.fifo' for FIFO)")
