"""The Kinesis channel's settings (OUTBOX_KINESIS_*): a mixin of `config.Settings`."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings

from ...urls import EndpointUrl

# A stream name, or its ARN ("CreateStream", StreamName; "PutRecords", StreamARN).
_NAME = r"[a-zA-Z0-9_.-]{1,128}"
_STREAM = re.compile(rf"{_NAME}|arn:aws[a-z-]*:kinesis:[a-z0-9-]+:\d{{12}}:stream/{_NAME}")


class KinesisSettings(BaseSettings):
    aws_endpoint_url_kinesis: EndpointUrl = Field(default=None, validation_alias="AWS_ENDPOINT_URL_KINESIS")
    kinesis_stream: str | None = None
    """OUTBOX_KINESIS_STREAM: the stream's name or ARN."""
    kinesis_max_concurrency: int = Field(default=4, ge=1, le=32)


RELATION_VARIABLES: tuple[str, ...] = ("OUTBOX_KINESIS_STREAM",)


def check_settings(s: Any, relayed: bool) -> None:
    if relayed and not s.kinesis_stream:
        raise ValueError("OUTBOX_KINESIS_STREAM: set the stream's name or ARN for OUTBOX_CHANNEL=kinesis")
    if s.kinesis_stream and not _STREAM.fullmatch(s.kinesis_stream):
        raise ValueError("OUTBOX_KINESIS_STREAM: must be a stream name (1-128 letters, digits, '_', '.', '-') "
                         "or a stream ARN, arn:aws:kinesis:<region>:<account>:stream/<name>")


def stream_parameter(stream: str) -> dict[str, str]:
    return {"StreamARN": stream} if stream.startswith("arn:") else {"StreamName": stream}
