"""The SES v2 client: an `aws_client` client (one per container, timeouts inside
the deadline margin, SDK retries off), and what this botocore's SES model knows."""

from __future__ import annotations

from typing import Any

from ..aws_client import (
    CONNECT_TIMEOUT_SECONDS,
    MAX_READ_TIMEOUT_SECONDS,
    MIN_DEADLINE_MARGIN_SECONDS,
    MIN_READ_TIMEOUT_SECONDS,
    RECORD_RESERVE_SECONDS,
    call_timeouts,
    create_client,
)

__all__ = ["CONNECT_TIMEOUT_SECONDS", "MAX_READ_TIMEOUT_SECONDS", "MIN_DEADLINE_MARGIN_SECONDS",
           "MIN_READ_TIMEOUT_SECONDS", "RECORD_RESERVE_SECONDS", "create_ses_client", "ses_timeouts",
           "supports_simple_headers"]


def ses_timeouts(deadline_margin_seconds: float) -> tuple[float, float]:
    """The SES client's (connect, read) timeouts for a deadline margin (`aws_client.call_timeouts`)."""
    return call_timeouts(deadline_margin_seconds, "SES")


def create_ses_client(*, max_concurrency: int = 8, deadline_margin_seconds: float = 5.0,
                      connect_timeout_seconds: float | None = None,
                      read_timeout_seconds: float | None = None, region_name: str | None = None) -> Any:
    """A boto3 ``sesv2`` client for the whole container (`aws_client.create_client`)."""
    return create_client("sesv2", "SES", max_concurrency=max_concurrency,
                         deadline_margin_seconds=deadline_margin_seconds,
                         connect_timeout_seconds=connect_timeout_seconds,
                         read_timeout_seconds=read_timeout_seconds, region_name=region_name)


def supports_simple_headers(client: Any) -> bool:
    """Whether this botocore knows ``Message.Headers`` (added to SES v2 in 2024);
    older ones get custom headers through raw MIME instead."""
    try:
        return "Headers" in client.meta.service_model.shape_for("Message").members
    except Exception:
        return False
