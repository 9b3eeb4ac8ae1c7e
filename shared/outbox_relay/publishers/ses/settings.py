"""The SES channel's settings (OUTBOX_SES_*): a mixin of `config.Settings`."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings

from ...urls import EndpointUrl


class SesSettings(BaseSettings):
    aws_endpoint_url_sesv2: EndpointUrl = Field(default=None, validation_alias="AWS_ENDPOINT_URL_SESV2")
    ses_from: str | None = None
    """Default sender (`From`) when a message names none; must be a verified identity."""
    ses_configuration_set: str | None = None
    ses_max_concurrency: int = Field(default=8, ge=1, le=64)
    ses_record_group_size: int = Field(default=10, ge=1, le=500)
    """Outcomes are written after at most this many sends complete (the duplicate window)."""
    ses_quota_deferral_seconds: float = Field(default=3600.0, ge=60, le=2 * 24 * 3600, allow_inf_nan=False)
    """Deferral when the 24-hour sending quota is used up, seconds."""
    ses_max_send_rate: float | None = Field(default=None, gt=0, le=100_000, allow_inf_nan=False)
    """Cap on the account's MaxSendRate, recipients per second (SES counts recipients)."""
    ses_feedback: bool = False
    """OUTBOX_SES_FEEDBACK: the configuration set's events reach the feedback function."""
    ses_settle_seconds: float = Field(default=600.0, ge=5, le=24 * 3600, allow_inf_nan=False)
    """With feedback: how long a send whose answer was lost waits for its event before it goes again."""
    ses_suppression: bool | None = None
    """OUTBOX_SES_SUPPRESSION: dead-letter messages to suppressed addresses; unset: with feedback."""
    ses_address_key: str | None = Field(default=None, repr=False)
    """The key of the addresses' keyed hashes (at least 32 characters); or the secret below."""
    ses_address_key_secret_arn: str | None = Field(default=None, pattern=r"^arn:aws[a-z-]*:secretsmanager:")
    """Secrets Manager secret holding that key (the template generates it)."""

    @property
    def ses_suppression_on(self) -> bool:
        return self.ses_feedback if self.ses_suppression is None else self.ses_suppression


RELATION_VARIABLES: tuple[str, ...] = ("OUTBOX_SES_FEEDBACK", "OUTBOX_SES_ADDRESS_KEY")


def check_settings(s: Any, relayed: bool) -> None:
    if relayed and s.ses_feedback and not s.ses_configuration_set:
        raise ValueError("OUTBOX_SES_FEEDBACK: needs OUTBOX_SES_CONFIGURATION_SET, the configuration set whose "
                         "event destination reaches the feedback function")
    if relayed and s.ses_suppression_on and not (s.ses_address_key or s.ses_address_key_secret_arn):
        raise ValueError("OUTBOX_SES_ADDRESS_KEY: the suppression list is on (OUTBOX_SES_SUPPRESSION, or "
                         "OUTBOX_SES_FEEDBACK): set it or OUTBOX_SES_ADDRESS_KEY_SECRET_ARN")
    if s.ses_address_key is not None and len(s.ses_address_key) < 32:
        raise ValueError("OUTBOX_SES_ADDRESS_KEY: must be at least 32 characters")
