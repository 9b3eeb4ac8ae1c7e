"""Settings, from environment variables, validated once.

Every variable, its default and its unit is listed in the README
("Configuration"). A bad value raises `ConfigurationError` naming the variable,
which stops a Lambda cold start before any message is touched. A variable set
to the empty string counts as unset (template.yaml declares some variables
empty so that `sam local invoke --env-vars` may fill them in).
"""

from __future__ import annotations

import functools
from typing import ClassVar, Literal

from pydantic import AliasChoices, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigurationError
from .models import Channel


class Settings(BaseSettings):
    """The relay's configuration. Field docs name the variable and the unit."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="ignore", frozen=True, env_ignore_empty=True)

    #: These settings drive a relay (claims under a lease, a downstream). The
    #: maintenance function's settings (`MaintenanceSettings`) do not, and skip
    #: the relay-only relations below.
    relays: ClassVar[bool] = True

    # --- what this function relays ---
    channel: Channel = Channel.REDIS  # OUTBOX_CHANNEL: redis | ses

    # --- PostgreSQL ---
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    """SQLAlchemy URL, `postgresql+pg8000://user:pass@host:5432/db`."""
    database_secret_arn: str | None = Field(default=None, validation_alias="DATABASE_SECRET_ARN")
    """Secrets Manager secret holding the RDS-style JSON (host, port, username, password, dbname)."""
    database_iam_auth: bool = Field(default=False, validation_alias="DATABASE_IAM_AUTH")
    """Log in with an RDS IAM auth token generated per new connection instead of a password."""
    database_tls: Literal["disable", "require", "verify-full"] = Field(
        default="disable", validation_alias="DATABASE_TLS"
    )
    database_ca_bundle: str | None = Field(default=None, validation_alias="DATABASE_CA_BUNDLE")
    """PEM file of CA certificates for `verify-full` (the RDS global bundle)."""
    database_pool_size: int = Field(default=2, ge=1, le=20, validation_alias="DATABASE_POOL_SIZE")

    # --- Redis ---
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    """`redis://` or `rediss://` (TLS) URL, with AUTH user/password if any."""
    redis_url_secret_arn: str | None = Field(default=None, validation_alias="REDIS_URL_SECRET_ARN")
    """Secrets Manager secret whose string is the Redis URL (ElastiCache AUTH token inside)."""
    redis_socket_timeout_seconds: float = Field(default=5.0, gt=0, le=60, allow_inf_nan=False)
    redis_dedupe_ttl_seconds: int = Field(default=7 * 24 * 3600, ge=60, le=365 * 24 * 3600)
    """How long a published message id is remembered for idempotent re-publish, seconds."""
    redis_maxlen: int = Field(default=0, ge=0)
    """Approximate stream trim (`XADD MAXLEN ~ n`); 0 disables trimming."""

    # --- claiming and leasing ---
    batch_size: int = Field(default=500, ge=1, le=10_000)
    batch_max_bytes: int = Field(default=32 * 1024 * 1024, ge=64 * 1024, le=1024 * 1024 * 1024)
    """Byte budget of one claim: bytes of payload JSON text, as the relay holds it in memory."""
    lease_seconds: float = Field(default=120.0, gt=0, le=3600, allow_inf_nan=False)
    function_timeout_seconds: float = Field(default=60.0, gt=0, le=900, allow_inf_nan=False)
    """The Lambda function's timeout, seconds; the lease must be longer."""
    deadline_margin_seconds: float = Field(default=5.0, ge=0, le=300, allow_inf_nan=False)
    """Stop starting deliveries when less than this remains before the Lambda timeout."""

    # --- retries ---
    max_attempts: int = Field(default=10, ge=1, le=1000)
    backoff_base_seconds: float = Field(default=1.0, gt=0, le=3600, allow_inf_nan=False)
    backoff_cap_seconds: float = Field(default=900.0, gt=0, le=7 * 24 * 3600, allow_inf_nan=False)
    backoff_floor_seconds: float = Field(default=0.5, ge=0, le=3600, allow_inf_nan=False)
    throttle_delay_seconds: float = Field(default=2.0, ge=0, le=3600, allow_inf_nan=False)
    """Deferral of a throttled message (attempt refunded), seconds."""
    error_max_chars: int = Field(default=1000, ge=100, le=100_000)

    # --- Amazon SES ---
    ses_from: str | None = None
    """Default sender (`From`) when a message names none; must be a verified identity."""
    ses_configuration_set: str | None = None
    ses_max_concurrency: int = Field(default=8, ge=1, le=64)
    ses_record_group_size: int = Field(default=10, ge=1, le=500)
    """Outcomes are written after at most this many sends complete (the duplicate window)."""
    ses_quota_deferral_seconds: float = Field(default=3600.0, ge=60, le=2 * 24 * 3600, allow_inf_nan=False)
    """Deferral when the 24-hour sending quota is used up, seconds."""
    ses_max_send_rate: float | None = Field(default=None, gt=0, le=100_000, allow_inf_nan=False)
    """Override of the account's MaxSendRate (emails/second); normally read from GetAccount."""

    # --- retention (maintenance function) ---
    retain_delivered_seconds: float = Field(default=7 * 24 * 3600, gt=0, le=10 * 366 * 24 * 3600, allow_inf_nan=False)
    retain_dead_seconds: float = Field(default=30 * 24 * 3600, gt=0, le=10 * 366 * 24 * 3600, allow_inf_nan=False)

    @model_validator(mode="after")
    def _check_relations(self) -> "Settings":
        if self.relays and self.lease_seconds <= self.function_timeout_seconds:
            raise ValueError(
                f"OUTBOX_LEASE_SECONDS ({self.lease_seconds:g}s) must be longer than "
                f"OUTBOX_FUNCTION_TIMEOUT_SECONDS ({self.function_timeout_seconds:g}s), "
                "or a message could be claimed twice while its first delivery is still running"
            )
        if self.deadline_margin_seconds >= self.function_timeout_seconds:
            raise ValueError(
                f"OUTBOX_DEADLINE_MARGIN_SECONDS ({self.deadline_margin_seconds:g}s) must be shorter than "
                f"OUTBOX_FUNCTION_TIMEOUT_SECONDS ({self.function_timeout_seconds:g}s), or nothing is ever delivered"
            )
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise ValueError("OUTBOX_BACKOFF_CAP_SECONDS must be >= OUTBOX_BACKOFF_BASE_SECONDS")
        if self.backoff_floor_seconds > self.backoff_cap_seconds:
            raise ValueError("OUTBOX_BACKOFF_FLOOR_SECONDS must be <= OUTBOX_BACKOFF_CAP_SECONDS")
        if self.database_url is None and self.database_secret_arn is None:
            raise ValueError("DATABASE_URL: set DATABASE_URL or DATABASE_SECRET_ARN")
        if self.database_url is not None and not self.database_url.startswith("postgresql"):
            raise ValueError("DATABASE_URL: must be a SQLAlchemy PostgreSQL URL, postgresql+pg8000://…")
        if self.relays and self.channel is Channel.REDIS and self.redis_url is None and self.redis_url_secret_arn is None:
            raise ValueError("REDIS_URL: set REDIS_URL or REDIS_URL_SECRET_ARN for OUTBOX_CHANNEL=redis")
        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("REDIS_URL: must start with redis://, rediss:// or unix://")
        return self


class MaintenanceSettings(Settings):
    """Settings of the maintenance function (retention purge, backlog metrics,
    redrive): the database and the retention windows
    (`OUTBOX_RETAIN_DELIVERED_SECONDS`, `OUTBOX_RETAIN_DEAD_SECONDS`).

    It claims nothing and publishes nothing, so it needs no Redis URL and its
    timeout is not compared with the lease; every other check applies."""

    relays: ClassVar[bool] = False


_RELATION_VARS = (
    "OUTBOX_LEASE_SECONDS", "OUTBOX_DEADLINE_MARGIN_SECONDS", "OUTBOX_BACKOFF_CAP_SECONDS", "OUTBOX_BACKOFF_FLOOR_SECONDS",
    "DATABASE_URL", "REDIS_URL",
)


def _variable_for(field: str) -> str:
    aliases = {i.validation_alias for i in Settings.model_fields.values() if isinstance(i.validation_alias, str)}
    if field in aliases:
        return field
    info = Settings.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, str):
        return info.validation_alias
    if info is not None and isinstance(info.validation_alias, AliasChoices):
        return str(info.validation_alias.choices[0])
    return f"OUTBOX_{field.upper()}"


def load_settings(**overrides: object) -> Settings:
    """Read and validate the environment (plus `overrides`, by field name).

    Raises `ConfigurationError` whose `variable` is the environment variable at
    fault and whose text says what is wrong with it.
    """
    return _load(Settings, overrides)


def load_maintenance_settings(**overrides: object) -> MaintenanceSettings:
    """Like `load_settings`, for the maintenance function (`MaintenanceSettings`)."""
    return _load(MaintenanceSettings, overrides)  # type: ignore[return-value]


def _load(cls: type[Settings], overrides: dict[str, object]) -> Settings:
    try:
        return cls(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first.get("loc") or ()
        message = str(first.get("msg", "invalid value"))
        if loc:
            return _raise(_variable_for(str(loc[0])), message)
        for var in _RELATION_VARS:
            if var in message:
                return _raise(var, message.removeprefix("Value error, "))
        return _raise("OUTBOX_*", message)


def _raise(variable: str, message: str) -> Settings:
    text = message.removeprefix("Value error, ").removeprefix(f"{variable}: ")
    raise ConfigurationError(variable, text) from None


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, validated on first use (cold start). Tests call
    `get_settings.cache_clear()` after changing the environment."""
    return load_settings()
