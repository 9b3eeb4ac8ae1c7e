"""The SNS channel's settings (OUTBOX_SNS_*): a mixin of `config.Settings`."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings

from ...urls import EndpointUrl

# A topic name is at most 256 characters, a FIFO topic's ".fifo" included ("CreateTopic", Name).
_TOPIC_ARN = re.compile(r"arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:(?:[A-Za-z0-9_-]{1,256}|[A-Za-z0-9_-]{1,251}\.fifo)")


class SnsSettings(BaseSettings):
    aws_endpoint_url_sns: EndpointUrl = Field(default=None, validation_alias="AWS_ENDPOINT_URL_SNS")
    sns_topic_arn: str | None = None
    """OUTBOX_SNS_TOPIC_ARN: the topic's ARN; a name ending in `.fifo` is a FIFO topic."""
    sns_max_concurrency: int = Field(default=4, ge=1, le=32)


RELATION_VARIABLES: tuple[str, ...] = ("OUTBOX_SNS_TOPIC_ARN",)


def check_settings(s: Any, relayed: bool) -> None:
    if relayed and not s.sns_topic_arn:
        raise ValueError("OUTBOX_SNS_TOPIC_ARN: set the topic's ARN for OUTBOX_CHANNEL=sns")
    if s.sns_topic_arn and not _TOPIC_ARN.fullmatch(s.sns_topic_arn):
        raise ValueError("OUTBOX_SNS_TOPIC_ARN: must be a topic ARN, arn:aws:sns:<region>:<account>:<name> "
                         "(a name of at most 256 letters, digits, '_' or '-', ending in '.fifo' for FIFO)")
