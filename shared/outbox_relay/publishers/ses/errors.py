"""Whose fault an SES ``SendEmail`` error is, and so what happens next
(docs/channels.md, "Errors: whose fault, and what happens").

A rejection about a value every message shares (the configured sender, the
configured configuration set, the account) would dead-letter the whole queue
one message at a time, so it stops the batch instead, with attempts refunded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ...models import ErrorClass
from ...observability import logger as log
from ..aws_client import CREDENTIAL_CODES

_THROTTLE_CODES = frozenset({"TooManyRequestsException", "LimitExceededException", "Throttling",
                             "ThrottlingException"})
_CREDENTIAL_CODES = CREDENTIAL_CODES
_MESSAGE_CODES = frozenset({"MessageRejected", "MailFromDomainNotVerifiedException", "NotFoundException",
                            "BadRequestException", "InvalidParameterValue", "ValidationException"})


class Verdict(enum.Enum):
    """What one send attempt means for the batch."""

    DELIVERED = "delivered"  # SES accepted it
    MESSAGE = "message"  # this message's outcome (permanent, transient, throttled): recorded
    QUOTA = "quota"  # daily quota exceeded: deferred long, no further sends this invocation
    STOP = "stop"  # our account, credentials, identity or configuration set refused: StopBatch
    PAUSED = "paused"  # sending paused: DownstreamUnavailable
    NOT_STARTED = "not_started"  # never sent (deadline, batch stopped): the relay releases it


@dataclass(frozen=True, slots=True)
class Classification:
    error_class: ErrorClass
    verdict: Verdict


def classify_client_error(code: str, message: str, status: int | None, *, own_sender: str | None = None,
                          own_configuration_set: str | None = None, default_sender: str | None = None,
                          default_configuration_set: str | None = None) -> Classification:
    """Classify an SES v2 ``SendEmail`` error by whose fault it is.

    Args:
        code: the error code (``ClientError.response["Error"]["Code"]``).
        message: the error message; quota and rate throttles are told apart by it
            ("Errors related to the sending quotas for your Amazon SES account":
            "Daily message quota exceeded", "Maximum sending rate exceeded").
        status: the HTTP status code, if any.
        own_sender / own_configuration_set: the address and configuration set the
            message names itself (None when it uses the configured default).
        default_sender / default_configuration_set: OUTBOX_SES_FROM's address and
            OUTBOX_SES_CONFIGURATION_SET.

    The rules (SES API v2 reference, "SendEmail", Errors):
    - quota exceeded → throttled, deferred long (QUOTA); rate throttles
      (TooManyRequests, LimitExceeded, Throttling) → throttled, refunded;
    - AccountSuspended → configuration (STOP); SendingPaused → downstream
      unavailable (PAUSED);
    - credential or IAM refusals → configuration (STOP), unless they name the
      sender identity or configuration set the message chose itself (permanent);
    - MessageRejected / MailFromDomainNotVerified / NotFound / BadRequest:
      about a value from our configuration (the configured sender identity,
      the configured configuration set) every message would fail the same way →
      configuration (STOP); otherwise the message's fault → permanent;
    - 5xx and unknown codes → transient (retried with backoff).
    """
    text = (message or "").lower()
    if "daily message quota exceeded" in text:
        return Classification(ErrorClass.THROTTLED, Verdict.QUOTA)
    if code in _THROTTLE_CODES or "maximum sending rate exceeded" in text:
        return Classification(ErrorClass.THROTTLED, Verdict.MESSAGE)
    if code == "AccountSuspendedException":
        return Classification(ErrorClass.CONFIGURATION, Verdict.STOP)
    if code == "SendingPausedException":
        return Classification(ErrorClass.DOWNSTREAM_UNAVAILABLE, Verdict.PAUSED)
    if code in _CREDENTIAL_CODES:
        if _names_own_choice(text, own_sender, own_configuration_set):
            return Classification(ErrorClass.PERMANENT, Verdict.MESSAGE)
        return Classification(ErrorClass.CONFIGURATION, Verdict.STOP)
    if code in _MESSAGE_CODES:
        ours = False
        if own_sender is None and default_sender:
            if code == "MailFromDomainNotVerifiedException" or default_sender.lower() in text:
                ours = True
        if own_configuration_set is None and default_configuration_set:
            if code == "NotFoundException" or default_configuration_set.lower() in text:
                ours = True
        if ours:
            return Classification(ErrorClass.CONFIGURATION, Verdict.STOP)
        return Classification(ErrorClass.PERMANENT, Verdict.MESSAGE)
    return Classification(ErrorClass.TRANSIENT, Verdict.MESSAGE)


def _names_own_choice(text: str, own_sender: str | None, own_configuration_set: str | None) -> bool:
    """Whether an IAM refusal names the sender identity (address or domain) or the
    configuration set that the message chose itself."""
    if own_sender:
        domain = own_sender.rsplit("@", 1)[-1].lower()
        if own_sender.lower() in text or f"identity/{domain}" in text:
            return True
    return bool(own_configuration_set) and f"configuration-set/{own_configuration_set.lower()}" in text


def classify_exception(exc: BaseException, *, own_sender: str | None = None,
                       own_configuration_set: str | None = None, default_sender: str | None = None,
                       default_configuration_set: str | None = None) -> tuple[Classification, str]:
    """Classify any exception a ``SendEmail`` call raised; returns the classification and
    the error code (or exception type name) for the stored error text."""
    from botocore.exceptions import (
        ClientError,
        NoCredentialsError,
        NoRegionError,
        ParamValidationError,
        PartialCredentialsError,
    )

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(err.get("Code") or "Unknown")
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        c = classify_client_error(code, str(err.get("Message") or ""), status, own_sender=own_sender,
                                  own_configuration_set=own_configuration_set, default_sender=default_sender,
                                  default_configuration_set=default_configuration_set)
        if c.error_class is ErrorClass.TRANSIENT and (status is None or status < 500):
            log.warning("unrecognised SES error code; retrying with backoff", extra={"error_code": code})
        return c, code
    if isinstance(exc, ParamValidationError):  # refused by the SDK before sending: this message's request
        return Classification(ErrorClass.PERMANENT, Verdict.MESSAGE), "ParamValidationError"
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError, NoRegionError)):
        return Classification(ErrorClass.CONFIGURATION, Verdict.STOP), type(exc).__name__
    # Connection refused or reset, timeouts, TLS (BotoCoreError), or anything else: nobody's fault.
    return Classification(ErrorClass.TRANSIENT, Verdict.MESSAGE), type(exc).__name__


def answer_was_lost(exc: BaseException) -> bool:
    """Whether SES may have accepted a send whose answer we did not get: the
    request went out and then the connection dropped (reset or closed before the
    reply), the reply came later than the read timeout, or SES answered 5xx
    after the body was sent. A refused connection or a connect timeout sent
    nothing, and any other answer is SES's word: those are not ambiguous."""
    from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

    if isinstance(exc, (ReadTimeoutError, ConnectionClosedError)):
        return True
    if isinstance(exc, ClientError):
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        code = str((exc.response.get("Error") or {}).get("Code") or "")
        return status is not None and status >= 500 and code not in _THROTTLE_CODES
    return False

