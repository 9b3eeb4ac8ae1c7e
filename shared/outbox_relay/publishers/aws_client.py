"""boto3 clients for the AWS channels (SES, SQS, SNS, EventBridge): one per
container, shared by the sending threads (boto3 clients are thread-safe, sessions
are not), with timeouts that fit inside the deadline margin and the SDK's own
retries off.

A call the SDK retried after a timeout could arrive twice, and a throttle retried
inside the SDK would hide the signal the relay's backoff needs.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError

#: The TCP connect timeout, seconds (see `call_timeouts`).
CONNECT_TIMEOUT_SECONDS = 2.0
#: Time kept after the longest possible call to record its outcome, seconds.
RECORD_RESERVE_SECONDS = 1.0
#: Shortest read timeout worth having, and the longest one used, seconds.
MIN_READ_TIMEOUT_SECONDS = 1.0
MAX_READ_TIMEOUT_SECONDS = 15.0
#: Smallest OUTBOX_DEADLINE_MARGIN_SECONDS for an AWS relay, seconds: connect + shortest read
#: + the record reserve. Below it a call started just before the margin could outlive the deadline.
MIN_DEADLINE_MARGIN_SECONDS = CONNECT_TIMEOUT_SECONDS + MIN_READ_TIMEOUT_SECONDS + RECORD_RESERVE_SECONDS

#: Error codes that refuse our credentials or permissions, whatever the service.
CREDENTIAL_CODES = frozenset({"AccessDeniedException", "AccessDenied", "UnrecognizedClientException",
                              "InvalidClientTokenId", "SignatureDoesNotMatch", "InvalidSignatureException",
                              "ExpiredToken", "ExpiredTokenException", "MissingAuthenticationTokenException",
                              "IncompleteSignature", "AuthorizationError", "InvalidSecurity"})


def call_timeouts(deadline_margin_seconds: float, relay: str) -> tuple[float, float]:
    """The (connect, read) timeouts, seconds, for a deadline margin
    (OUTBOX_DEADLINE_MARGIN_SECONDS): connect `CONNECT_TIMEOUT_SECONDS` (2 s), read
    ``margin - connect - RECORD_RESERVE_SECONDS`` (margin − 3 s), at least 1 s and at
    most 15 s. With the default 5 s margin: 2 s and 2 s.

    The invariant this serves: no call starts once the time left is below the margin,
    the SDK does not retry (``total_max_attempts`` 1), and one attempt lasts at most
    connect + read ≤ margin − 1 s; so a call started before the margin completes or
    times out before the deadline, leaving at least `RECORD_RESERVE_SECONDS` to record
    it. botocore's read timeout bounds each wait for the socket, not the whole response;
    these responses are small bodies.

    Raises `ConfigurationError` naming OUTBOX_DEADLINE_MARGIN_SECONDS when it is below
    `MIN_DEADLINE_MARGIN_SECONDS` (4 s): no sane timeouts fit. `relay` names the relay
    in that message ("SES", "SQS", …).
    """
    if deadline_margin_seconds < MIN_DEADLINE_MARGIN_SECONDS:
        raise ConfigurationError(
            "OUTBOX_DEADLINE_MARGIN_SECONDS",
            f"is {deadline_margin_seconds:g}s; the {relay} relay needs at least {MIN_DEADLINE_MARGIN_SECONDS:g}s "
            f"({CONNECT_TIMEOUT_SECONDS:g}s connect + {MIN_READ_TIMEOUT_SECONDS:g}s read timeout + "
            f"{RECORD_RESERVE_SECONDS:g}s to record), so a call started before the margin ends before the deadline")
    read = deadline_margin_seconds - CONNECT_TIMEOUT_SECONDS - RECORD_RESERVE_SECONDS
    return CONNECT_TIMEOUT_SECONDS, min(MAX_READ_TIMEOUT_SECONDS, max(MIN_READ_TIMEOUT_SECONDS, read))


def create_client(service: str, relay: str, *, max_concurrency: int = 8, deadline_margin_seconds: float = 5.0,
                  connect_timeout_seconds: float | None = None, read_timeout_seconds: float | None = None,
                  region_name: str | None = None) -> Any:
    """A boto3 client of `service` for the whole container: a connection pool as large
    as the call concurrency, SDK retries off, connect and read timeouts (seconds) from
    `call_timeouts(deadline_margin_seconds)` unless given.

    The endpoint follows the SDK's configuration: ``AWS_ENDPOINT_URL_<SERVICE>`` (or
    ``AWS_ENDPOINT_URL``) points it at a local moto server ("AWS SDKs and Tools Reference
    Guide", service-specific endpoints). `region_name` (AWS_REGION or AWS_DEFAULT_REGION,
    as Lambda sets both) else the SDK's own configuration. Raises `ConfigurationError`
    when no region is configured.
    """
    import boto3
    from botocore.config import Config

    connect, read = call_timeouts(deadline_margin_seconds, relay)
    config = Config(retries={"mode": "standard", "total_max_attempts": 1},
                    max_pool_connections=max(10, max_concurrency),
                    connect_timeout=connect if connect_timeout_seconds is None else connect_timeout_seconds,
                    read_timeout=read if read_timeout_seconds is None else read_timeout_seconds,
                    user_agent_extra="outbox-relay")
    session = boto3.session.Session(region_name=region_name)
    # None (no region) or '' (an empty AWS_DEFAULT_REGION, which the SDK takes as a region
    # and fails on only when the first request is signed).
    if not session.region_name:
        raise ConfigurationError("AWS_DEFAULT_REGION", f"no AWS region is configured for the {relay} client "
                                 "(Lambda sets it; set AWS_REGION or AWS_DEFAULT_REGION for local runs)")
    return session.client(service, config=config)
