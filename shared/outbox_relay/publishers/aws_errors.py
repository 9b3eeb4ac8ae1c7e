"""Whose fault an AWS batch call's or entry's error is (docs/channels.md, "SQS, SNS and EventBridge")."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..models import ErrorClass
from .aws_client import CREDENTIAL_CODES

#: Refusals of who we are, not of where we may send: ours even for a destination the message chose.
IDENTITY_CODES = CREDENTIAL_CODES - {"AccessDeniedException", "AccessDenied", "AuthorizationError"}


class Verdict(enum.Enum):
    MESSAGE = "message"  # this message's outcome: recorded with its class
    STOP = "stop"  # our queue, topic, bus, credentials or key refused: StopBatch, the rest refunded


@dataclass(frozen=True)
class ErrorCodes:
    """A service's error codes by meaning; others are the sender's fault when it says so, else transient."""

    throttled: frozenset[str]
    #: Our destination, key or credentials refused: every message would fail the same way.
    configuration: frozenset[str]
    #: The message's fault, whatever ``SenderFault`` says (EventBridge gives none).
    permanent: frozenset[str] = frozenset()
    #: Service-side failures worth a retry, whatever ``SenderFault`` says.
    transient: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Classification:
    error_class: ErrorClass
    verdict: Verdict = Verdict.MESSAGE


def classify_code(codes: ErrorCodes, code: str, sender_fault: bool | None, *, own_destination: bool = True,
                  status: int | None = None) -> Classification:
    """A refusal of our destination stops the batch (every message would fail alike); of one the
    message chose, it is permanent."""
    if code in codes.throttled:
        return Classification(ErrorClass.THROTTLED)
    if code in codes.configuration or code in CREDENTIAL_CODES:
        if own_destination or code in IDENTITY_CODES:
            return Classification(ErrorClass.CONFIGURATION, Verdict.STOP)
        return Classification(ErrorClass.PERMANENT)
    if code in codes.transient or (status is not None and status >= 500):
        return Classification(ErrorClass.TRANSIENT)
    if code in codes.permanent or sender_fault:
        return Classification(ErrorClass.PERMANENT)
    return Classification(ErrorClass.TRANSIENT)
