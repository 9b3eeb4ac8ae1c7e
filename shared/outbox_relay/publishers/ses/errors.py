"""Whose fault an SES ``SendEmail`` error is: a refusal of a value every message shares stops the
batch, or it would dead-letter the whole queue one message at a time."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ...models import ErrorClass
from ...observability import logger as log
from ..aws_client import CREDENTIAL_CODES

_THROTTLE_CODES = frozenset({"TooManyRequestsException", "LimitExceededException", "Throttling", "ThrottlingException"})
_MESSAGE_CODES = frozenset({"MessageRejected", "MailFromDomainNotVerifiedException", "NotFoundException",
                            "BadRequestException", "InvalidParameterValue", "ValidationException"})


class Verdict(enum.Enum):
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


def classify_client_error(code: str, message: str, *, own_sender: str | None = None,
                          own_configuration_set: str | None = None, default_sender: str | None = None,
                          default_configuration_set: str | None = None) -> Classification:
    """`own_*`: what the message chose itself (None: the default); the text tells the daily quota from
    the rate throttle."""
    text = (message or "").lower()
    if "daily message quota exceeded" in text:
        return Classification(ErrorClass.THROTTLED, Verdict.QUOTA)
    if code in _THROTTLE_CODES or "maximum sending rate exceeded" in text:
        return Classification(ErrorClass.THROTTLED, Verdict.MESSAGE)
    if code == "AccountSuspendedException":
        return Classification(ErrorClass.CONFIGURATION, Verdict.STOP)
    if code == "SendingPausedException":
        return Classification(ErrorClass.DOWNSTREAM_UNAVAILABLE, Verdict.PAUSED)
    if code in CREDENTIAL_CODES:
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
    if own_sender:
        domain = own_sender.rsplit("@", 1)[-1].lower()
        if own_sender.lower() in text or f"identity/{domain}" in text:
            return True
    return bool(own_configuration_set) and f"configuration-set/{own_configuration_set.lower()}" in text


def classify_exception(exc: BaseException, *, own_sender: str | None = None,
                       own_configuration_set: str | None = None, default_sender: str | None = None,
                       default_configuration_set: str | None = None) -> tuple[Classification, str]:
    """What ``SendEmail`` raised, classified, with the code (or exception type) for the error text."""
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(err.get("Code") or "Unknown")
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        c = classify_client_error(code, str(err.get("Message") or ""), own_sender=own_sender,
                                  own_configuration_set=own_configuration_set, default_sender=default_sender,
                                  default_configuration_set=default_configuration_set)
        if c.error_class is ErrorClass.TRANSIENT and (status is None or status < 500):
            log.warning("unrecognised SES error code; retrying with backoff", extra={"error_code": code})
        return c, code
    if isinstance(exc, bx.ParamValidationError):  # refused by the SDK before sending: this message's request
        return Classification(ErrorClass.PERMANENT, Verdict.MESSAGE), "ParamValidationError"
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.NoRegionError)):
        return Classification(ErrorClass.CONFIGURATION, Verdict.STOP), type(exc).__name__
    # Connection refused or reset, timeouts, TLS (BotoCoreError), or anything else: nobody's fault.
    return Classification(ErrorClass.TRANSIENT, Verdict.MESSAGE), type(exc).__name__


def answer_was_lost(exc: BaseException) -> bool:
    """Whether SES may have accepted a send whose answer we lost (read timeout, dropped connection, 5xx)."""
    from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

    if isinstance(exc, (ReadTimeoutError, ConnectionClosedError)):
        return True
    if isinstance(exc, ClientError):
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        code = str((exc.response.get("Error") or {}).get("Code") or "")
        return status is not None and status >= 500 and code not in _THROTTLE_CODES
    return False

