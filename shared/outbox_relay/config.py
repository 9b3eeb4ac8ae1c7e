"""Settings from environment variables (docs/configuration.md), validated once: a bad value stops
the cold start naming the variable. Empty counts as unset (template.yaml declares some empty for
`sam local invoke --env-vars`)."""

from __future__ import annotations

import difflib
import functools
import logging
import os
import re
from typing import Any, ClassVar, Literal, Mapping

from pydantic import AliasChoices, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigurationError
from .models import Mode, OrderingOnDead
from .publishers.registry import CHANNELS, Channel, spec_for
from .publishers.spec import ChannelSpec
from .urls import EndpointUrl, parse_database_url

DatabaseTls = Literal["disable", "require", "verify-full"]

SERVICE_NAME = "outbox-relay"
# CloudWatch namespaces: 1-255 of these characters, not starting with ':' ("Amazon
# CloudWatch concepts", Namespaces); one it refuses loses every EMF metric silently.
_NAMESPACE_RE = re.compile(r"[0-9A-Za-z.\-_/#: ]{1,255}")
_INT = re.compile(r"-?[0-9]+")
#: OUTBOX_ variables read elsewhere: the `outbox` command's, the test suite's.
OTHER_VARIABLES = frozenset({"OUTBOX_SERVERS"})
OTHER_PREFIX = "OUTBOX_TEST_"


class SdkEnvironment(BaseSettings):
    """Variables Powertools and the AWS SDK read themselves, where a bad value is a traceback or
    ignored: checked here too, so start-up stops naming the variable."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True, env_ignore_empty=True)

    powertools_log_level: str | None = Field(default=None, validation_alias="POWERTOOLS_LOG_LEVEL")
    powertools_trace_disabled: bool | None = Field(default=None, validation_alias="POWERTOOLS_TRACE_DISABLED")
    powertools_logger_log_event: bool | None = Field(default=None, validation_alias="POWERTOOLS_LOGGER_LOG_EVENT")
    powertools_tracer_capture_response: bool | None = Field(
        default=None, validation_alias="POWERTOOLS_TRACER_CAPTURE_RESPONSE")
    powertools_tracer_capture_error: bool | None = Field(default=None, validation_alias="POWERTOOLS_TRACER_CAPTURE_ERROR")
    powertools_metrics_disabled: bool | None = Field(default=None, validation_alias="POWERTOOLS_METRICS_DISABLED")
    powertools_dev: bool | None = Field(default=None, validation_alias="POWERTOOLS_DEV")
    powertools_metrics_namespace: str | None = Field(default=None, validation_alias="POWERTOOLS_METRICS_NAMESPACE")
    powertools_service_name: str | None = Field(default=None, validation_alias="POWERTOOLS_SERVICE_NAME")
    aws_region: str | None = Field(default=None, validation_alias="AWS_REGION")
    aws_default_region: str | None = Field(default=None, validation_alias="AWS_DEFAULT_REGION")
    aws_endpoint_url: EndpointUrl = Field(default=None, validation_alias="AWS_ENDPOINT_URL")

    @property
    def region(self) -> str | None:
        return self.aws_region or self.aws_default_region

    @field_validator("powertools_log_level")
    @classmethod
    def _log_level(cls, v: str | None) -> str | None:
        if v is not None and not log_level_ok(v):
            raise ValueError("must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return v

    @field_validator("powertools_metrics_namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        if v is not None and (not _NAMESPACE_RE.fullmatch(v) or v.startswith((":", "AWS/"))):
            raise ValueError("must be a CloudWatch namespace: 1-255 ASCII letters, digits, spaces and . - _ / # :, "
                             "not starting with ':' or 'AWS/'")
        return v

    @field_validator("powertools_service_name")
    @classmethod
    def _service(cls, v: str | None) -> str | None:
        if v is not None and v != SERVICE_NAME:
            raise ValueError(f"the functions name their service {SERVICE_NAME} themselves (the alarms select "
                             f"their metrics by it): leave it unset or set {SERVICE_NAME}")
        return v

    @field_validator("aws_region", "aws_default_region")
    @classmethod
    def _region(cls, v: str | None) -> str | None:
        from botocore.exceptions import InvalidRegionError
        from botocore.utils import validate_region_name

        if v is not None:
            try:
                validate_region_name(v)
            except InvalidRegionError:
                raise ValueError("must be an AWS region name, e.g. eu-west-1") from None
        return v


def log_level_ok(value: str) -> bool:
    """As Powertools hands the level to logging, upper-cased."""
    return value.upper() in logging.getLevelNamesMapping()


class Settings(SdkEnvironment):
    """Every function's settings; a relay's adds its channel's (`settings_for`). Another channel's
    variables are known names (never "misspelt") but not read."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="ignore", frozen=True, env_ignore_empty=True)

    relays: ClassVar[bool] = True  # False: no lease, no downstream, no relay-only relations
    channels: ClassVar[tuple[ChannelSpec, ...]] = ()

    # Each variable's meaning, unit and default: docs/configuration.md.
    channel: Channel = Channel.REDIS

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    database_secret_arn: str | None = Field(default=None, validation_alias="DATABASE_SECRET_ARN")
    database_iam_auth: bool = Field(default=False, validation_alias="DATABASE_IAM_AUTH")
    database_tls: DatabaseTls = Field(default="disable", validation_alias="DATABASE_TLS")
    database_ca_bundle: str | None = Field(default=None, validation_alias="DATABASE_CA_BUNDLE")
    # A latency-mode poller uses three connections at once: claim, outcome writes, heartbeat.
    database_pool_size: int = Field(default=3, ge=1, le=20, validation_alias="DATABASE_POOL_SIZE")

    mode: Mode = Mode.BATCH
    poll_interval_seconds: float = Field(default=0.1, ge=0.01, le=60, allow_inf_nan=False)
    poll_max_interval_seconds: float = Field(default=0.1, ge=0.01, le=60, allow_inf_nan=False)
    poller_ttl_seconds: float = Field(default=5.0, ge=1, le=60, allow_inf_nan=False)
    pollers: int = Field(default=1, ge=1, le=50)
    pollers_max: int | None = Field(default=None, ge=1, le=50)
    pollers_add_age_seconds: float = Field(default=1.0, ge=0.1, le=3600, allow_inf_nan=False)
    successor_lead_seconds: float = Field(default=15.0, ge=1, le=450, allow_inf_nan=False)
    self_invoke: bool = True
    function_name: str | None = Field(default=None, validation_alias="AWS_LAMBDA_FUNCTION_NAME",
                                      pattern=r"^[A-Za-z0-9_-]{1,64}$")
    metrics_interval_seconds: float = Field(default=10.0, ge=1, le=900, allow_inf_nan=False)
    ordering_on_dead: OrderingOnDead = OrderingOnDead.SKIP

    batch_size: int = Field(default=500, ge=1, le=10_000)
    batch_max_bytes: int = Field(default=32 * 1024 * 1024, ge=64 * 1024, le=1024 * 1024 * 1024)
    lease_seconds: float = Field(default=120.0, gt=0, le=3600, allow_inf_nan=False)
    function_timeout_seconds: float = Field(default=60.0, gt=0, le=900, allow_inf_nan=False)
    deadline_margin_seconds: float = Field(default=5.0, ge=0, le=300, allow_inf_nan=False)

    max_attempts: int = Field(default=10, ge=1, le=1000)
    backoff_base_seconds: float = Field(default=1.0, gt=0, le=3600, allow_inf_nan=False)
    backoff_cap_seconds: float = Field(default=900.0, gt=0, le=7 * 24 * 3600, allow_inf_nan=False)
    backoff_floor_seconds: float = Field(default=0.5, ge=0, le=3600, allow_inf_nan=False)
    throttle_delay_seconds: float = Field(default=2.0, ge=0, le=3600, allow_inf_nan=False)
    error_max_chars: int = Field(default=1000, ge=100, le=100_000)
    retain_delivered_seconds: float = Field(default=7 * 24 * 3600, gt=0, le=10 * 366 * 24 * 3600, allow_inf_nan=False)
    retain_dead_seconds: float = Field(default=30 * 24 * 3600, gt=0, le=10 * 366 * 24 * 3600, allow_inf_nan=False)
    #: Day partitions kept open ahead of today (docs/decisions/0066): missed runs before ids go to day 0.
    partition_margin_days: int = Field(default=7, ge=4, le=60)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_as_written(cls, v: object, info: ValidationInfo) -> object:
        # Strict numbers (decision 0057): pydantic would read "5.0" and " 5 " as 5, and "5_0" as 50.
        if isinstance(v, str):
            annotation = cls.model_fields[info.field_name].annotation
            if annotation in (int, int | None) and not _INT.fullmatch(v):
                raise ValueError("must be a valid integer, written in digits alone (e.g. 500)")
            if annotation in (float, float | None) and (v != v.strip() or "_" in v):
                raise ValueError("must be a number without spaces or underscores, e.g. 2.5")
        return v

    @property
    def effective_successor_lead_seconds(self) -> float:
        """OUTBOX_SUCCESSOR_LEAD_SECONDS; its default is cut to half a poller's time when that is shorter."""
        if "successor_lead_seconds" in self.model_fields_set:
            return self.successor_lead_seconds
        return min(self.successor_lead_seconds, (self.function_timeout_seconds - self.deadline_margin_seconds) / 2)

    @model_validator(mode="after")
    def _check_relations(self) -> "Settings":
        if self.relays and self.lease_seconds <= self.function_timeout_seconds:
            raise ValueError(
                f"OUTBOX_LEASE_SECONDS ({self.lease_seconds:g}s) must be longer than "
                f"OUTBOX_FUNCTION_TIMEOUT_SECONDS ({self.function_timeout_seconds:g}s), "
                "or a message could be claimed twice while its first delivery is still running")
        if self.deadline_margin_seconds >= self.function_timeout_seconds:
            raise ValueError(
                f"OUTBOX_DEADLINE_MARGIN_SECONDS ({self.deadline_margin_seconds:g}s) must be shorter than "
                f"OUTBOX_FUNCTION_TIMEOUT_SECONDS ({self.function_timeout_seconds:g}s), or nothing is ever delivered")
        # The poller TTL and the successor lead are read by latency mode alone (decision 0057).
        polls = self.relays and self.mode is Mode.LATENCY
        if polls and "successor_lead_seconds" in self.model_fields_set and \
                self.successor_lead_seconds * 2 > self.function_timeout_seconds - self.deadline_margin_seconds:
            # A poller must poll longer than the lead, or each would start its successor at once.
            raise ValueError(
                f"OUTBOX_SUCCESSOR_LEAD_SECONDS ({self.successor_lead_seconds:g}s) must be at most half of "
                f"OUTBOX_FUNCTION_TIMEOUT_SECONDS minus OUTBOX_DEADLINE_MARGIN_SECONDS "
                f"({self.function_timeout_seconds:g}s - {self.deadline_margin_seconds:g}s), or every poller "
                "starts its successor soon after it starts")
        if polls and self.poller_ttl_seconds >= self.lease_seconds:
            raise ValueError(f"OUTBOX_POLLER_TTL_SECONDS ({self.poller_ttl_seconds:g}s) must be shorter than "
                             f"OUTBOX_LEASE_SECONDS ({self.lease_seconds:g}s)")
        if polls and (self.pollers_max or self.pollers) < self.pollers:
            raise ValueError(f"OUTBOX_POLLERS_MAX ({self.pollers_max}) must be at least OUTBOX_POLLERS ({self.pollers})")
        if self.poll_max_interval_seconds < self.poll_interval_seconds:
            raise ValueError("OUTBOX_POLL_MAX_INTERVAL_SECONDS must be >= OUTBOX_POLL_INTERVAL_SECONDS")
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise ValueError("OUTBOX_BACKOFF_CAP_SECONDS must be >= OUTBOX_BACKOFF_BASE_SECONDS")
        if self.backoff_floor_seconds > self.backoff_cap_seconds:
            raise ValueError("OUTBOX_BACKOFF_FLOOR_SECONDS must be <= OUTBOX_BACKOFF_CAP_SECONDS")
        if self.database_url is None and self.database_secret_arn is None:
            raise ValueError("DATABASE_URL: set DATABASE_URL or DATABASE_SECRET_ARN")
        if self.database_url is not None:
            try:
                parse_database_url(self.database_url)
            except ValueError as exc:
                raise ValueError(f"DATABASE_URL: {exc}") from None
        for spec in self.channels:
            spec.check_settings(self, self.relays and self.channel == spec.name)
        return self


class MaintenanceSettings(Settings):
    """It claims and publishes nothing: no channel's settings, no timeout against the lease."""

    relays: ClassVar[bool] = False


@functools.cache
def settings_for(*channels: str, base: type[Settings] = Settings) -> type[Settings]:
    """`base` with the settings of `channels` (registered names) mixed in."""
    specs = tuple(spec_for(c) for c in channels)
    name = "".join(spec.template_prefix for spec in specs) + base.__name__
    # Its own config, or the mixins' (no OUTBOX_ prefix) would win.
    namespace = {"channels": specs, "model_config": base.model_config}
    return type(name, (base, *(spec.settings for spec in specs)), namespace)  # type: ignore[return-value]


_RELATION_VARS = ("OUTBOX_SUCCESSOR_LEAD_SECONDS", "OUTBOX_POLLER_TTL_SECONDS", "OUTBOX_LEASE_SECONDS",
                  "OUTBOX_DEADLINE_MARGIN_SECONDS", "OUTBOX_BACKOFF_CAP_SECONDS", "OUTBOX_BACKOFF_FLOOR_SECONDS",
                  "OUTBOX_POLL_MAX_INTERVAL_SECONDS", "OUTBOX_POLLERS_MAX", "DATABASE_URL",
                  *(var for spec in CHANNELS for var in spec.relation_variables))


def _names(field: str, alias: Any) -> list[str]:
    """The variables a field reads."""
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [alias if isinstance(alias, str) else f"OUTBOX_{field.upper()}"]


def _variable_for(cls: type[Settings], field: str) -> str:
    if any(i.validation_alias == field for i in cls.model_fields.values()):
        return field
    info = cls.model_fields.get(field)
    return _names(field, info.validation_alias)[0] if info is not None else f"OUTBOX_{field.upper()}"


def load_settings(**overrides: object) -> Settings:
    """The environment plus `overrides` (by field name), with OUTBOX_CHANNEL's settings;
    `ConfigurationError` naming the variable at fault."""
    channel = overrides.get("channel") or next(
        (v for k, v in os.environ.items() if k.upper() == "OUTBOX_CHANNEL" and v), Channel.REDIS.value)
    try:
        cls = settings_for(Channel(channel).value)
    except ValueError:
        cls = Settings  # which refuses the channel, naming OUTBOX_CHANNEL
    return _load(cls, overrides)


def load_maintenance_settings(**overrides: object) -> MaintenanceSettings:
    return _load(MaintenanceSettings, overrides)  # type: ignore[return-value]


def variables() -> frozenset[str]:
    """Every environment variable the settings read, every channel's included."""
    fields = settings_for(*(spec.name for spec in CHANNELS)).model_fields
    return frozenset(var for name, info in fields.items() for var in _names(name, info.validation_alias))


def check_unknown_variables(environ: Mapping[str, str] | None = None) -> None:
    """Refuse an OUTBOX_ variable no setting reads (decision 0057): a misspelt one would leave its
    setting at the default without a word."""
    known = variables() | OTHER_VARIABLES
    for name in sorted(os.environ if environ is None else environ):
        upper = name.upper()  # the settings read their variables in any case
        if upper.startswith("OUTBOX_") and upper not in known and not upper.startswith(OTHER_PREFIX):
            # Compared without the prefix, which every candidate shares.
            close = difflib.get_close_matches(upper[7:], sorted(k[7:] for k in known if k.startswith("OUTBOX_")),
                                              n=1, cutoff=0.5)
            hint = f"did you mean OUTBOX_{close[0]}?" if close else "docs/configuration.md lists them"
            raise ConfigurationError(name, f"is not a setting ({hint}); rename or remove it")


def _load(cls: type[Settings], overrides: dict[str, object]) -> Settings:
    check_unknown_variables()
    try:
        return cls(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first.get("loc") or ()
        message = str(first.get("msg", "invalid value"))
        if first.get("type") == "bool_parsing":
            message = "must be true or false (also 1/0, yes/no, on/off)"
        if loc:
            return _raise(_variable_for(cls, str(loc[0])), message)
        named = [(message.find(var), var) for var in _RELATION_VARS if var in message]
        if named:  # the variable the message is about is the one it names first
            return _raise(min(named)[1], message.removeprefix("Value error, "))
        return _raise("OUTBOX_*", message)


def _raise(variable: str, message: str) -> Settings:
    text = message.removeprefix("Value error, ").removeprefix(f"{variable}: ")
    raise ConfigurationError(variable, text) from None


@functools.cache
def get_settings() -> Settings:
    """Validated on first use (cold start); tests clear the cache after changing the environment."""
    return load_settings()
