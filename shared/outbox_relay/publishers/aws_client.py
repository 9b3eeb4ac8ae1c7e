"""boto3 clients for the AWS channels, one per container; SDK retries off: a retried call
could arrive twice, and a retried throttle hides the signal the backoff needs."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError

CONNECT_TIMEOUT_SECONDS = 2.0
#: Time kept after the longest possible call to record its outcome, seconds.
RECORD_RESERVE_SECONDS = 1.0
MIN_READ_TIMEOUT_SECONDS = 1.0
MAX_READ_TIMEOUT_SECONDS = 15.0
#: Below this margin a call started just before it could outlive the deadline.
MIN_DEADLINE_MARGIN_SECONDS = CONNECT_TIMEOUT_SECONDS + MIN_READ_TIMEOUT_SECONDS + RECORD_RESERVE_SECONDS
#: Within one invocation a gate asks the service again after this long, not before every claim.
GATE_INTERVAL_SECONDS = 10.0
#: Error codes that refuse our credentials or permissions, whatever the service.
CREDENTIAL_CODES = frozenset({"AccessDeniedException", "AccessDenied", "UnrecognizedClientException",
                              "InvalidClientTokenId", "SignatureDoesNotMatch", "InvalidSignatureException",
                              "ExpiredToken", "ExpiredTokenException", "MissingAuthenticationTokenException",
                              "IncompleteSignature", "AuthorizationError", "InvalidSecurity"})


def call_timeouts(deadline_margin_seconds: float, relay: str) -> tuple[float, float]:
    """(connect, read) timeouts: one unretried attempt ends before the deadline with time left to record it."""
    if deadline_margin_seconds < MIN_DEADLINE_MARGIN_SECONDS:
        raise ConfigurationError(
            "OUTBOX_DEADLINE_MARGIN_SECONDS",
            f"is {deadline_margin_seconds:g}s; the {relay} relay needs at least {MIN_DEADLINE_MARGIN_SECONDS:g}s "
            f"({CONNECT_TIMEOUT_SECONDS:g}s connect + {MIN_READ_TIMEOUT_SECONDS:g}s read timeout + "
            f"{RECORD_RESERVE_SECONDS:g}s to record), so a call started before the margin ends before the deadline")
    read = deadline_margin_seconds - CONNECT_TIMEOUT_SECONDS - RECORD_RESERVE_SECONDS
    return CONNECT_TIMEOUT_SECONDS, min(MAX_READ_TIMEOUT_SECONDS, max(MIN_READ_TIMEOUT_SECONDS, read))


def create_client(service: str, relay: str, *, max_concurrency: int = 8, deadline_margin_seconds: float = 5.0,
                  read_timeout_seconds: float | None = None, region_name: str | None = None) -> Any:
    """A client of `service` with a pool as large as the concurrency (``AWS_ENDPOINT_URL_<SERVICE>``: moto)."""
    import boto3
    from botocore.config import Config

    connect, read = call_timeouts(deadline_margin_seconds, relay)
    config = Config(retries={"mode": "standard", "total_max_attempts": 1},
                    max_pool_connections=max(10, max_concurrency),
                    connect_timeout=connect,
                    read_timeout=read if read_timeout_seconds is None else read_timeout_seconds,
                    user_agent_extra="outbox-relay")
    session = boto3.session.Session(region_name=region_name)
    # '' (an empty AWS_DEFAULT_REGION) would fail only when the first request is signed.
    if not session.region_name:
        raise ConfigurationError("AWS_DEFAULT_REGION", f"no AWS region is configured for the {relay} client "
                                 "(Lambda sets it; set AWS_REGION or AWS_DEFAULT_REGION for local runs)")
    return session.client(service, config=config)


def client_for(settings: Any, client: Any | None, service: str, relay: str, max_concurrency: int) -> Any:
    """`client`, else a new one for `settings`; refuses a deadline margin too small first."""
    margin = float(settings.deadline_margin_seconds)
    call_timeouts(margin, relay)
    return client if client is not None else create_client(
        service, relay, max_concurrency=max_concurrency, deadline_margin_seconds=margin,
        region_name=settings.region)
