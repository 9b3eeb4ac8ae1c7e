"""The SES v2 client (`aws_client`), and what this botocore's SES model knows."""

from __future__ import annotations

from typing import Any

from ..aws_client import call_timeouts, create_client


def ses_timeouts(deadline_margin_seconds: float) -> tuple[float, float]:
    return call_timeouts(deadline_margin_seconds, "SES")


def create_ses_client(*, max_concurrency: int = 8, deadline_margin_seconds: float = 5.0,
                      connect_timeout_seconds: float | None = None,
                      read_timeout_seconds: float | None = None, region_name: str | None = None) -> Any:
    return create_client("sesv2", "SES", max_concurrency=max_concurrency,
                         deadline_margin_seconds=deadline_margin_seconds,
                         connect_timeout_seconds=connect_timeout_seconds,
                         read_timeout_seconds=read_timeout_seconds, region_name=region_name)


def supports_simple_headers(client: Any) -> bool:
    """Whether this botocore knows ``Message.Headers``; older ones send custom headers as raw MIME."""
    try:
        return "Headers" in client.meta.service_model.shape_for("Message").members
    except Exception:
        return False
