"""The SES channel's settings (OUTBOX_SES_*): a mixin of `config.Settings`."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings


class SesSettings(BaseSettings):
    """Amazon SES: the default sender, the configuration set, and the pace."""

    ses_from: str | None = None
    """Default sender (`From`) when a message names none; must be a verified identity."""
    ses_configuration_set: str | None = None
    ses_max_concurrency: int = Field(default=8, ge=1, le=64)
    ses_record_group_size: int = Field(default=10, ge=1, le=500)
    """Outcomes are written after at most this many sends complete (the duplicate window)."""
    ses_quota_deferral_seconds: float = Field(default=3600.0, ge=60, le=2 * 24 * 3600, allow_inf_nan=False)
    """Deferral when the 24-hour sending quota is used up, seconds."""
    ses_max_send_rate: float | None = Field(default=None, gt=0, le=100_000, allow_inf_nan=False)
    """Cap on the account's MaxSendRate from GetAccount, recipients per second (SES counts
    recipients); the lower one wins."""


#: The SES settings are checked field by field, and when its publisher is built
#: (`publisher.build_ses_publisher`): no relation names a variable first.
RELATION_VARIABLES: tuple[str, ...] = ()


def check_settings(s: Any, relayed: bool) -> None:
    """No relation between the SES settings and the rest."""
