"""Settings, from environment variables, validated once.

Every variable, its default and its unit is listed in docs/configuration.md. A
bad value raises `ConfigurationError` naming the variable, which stops a Lambda
cold start before any message is touched. A variable set to the empty string
counts as unset (template.yaml declares some variables empty so that
`sam local invoke --env-vars` may fill them in).
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import re
from typing import ClassVar, Literal, Mapping

from pydantic import AliasChoices, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigurationError
from .models import Mode, OrderingOnDead
from .publishers.registry import CHANNELS, Channel, spec_for
from .publishers.spec import ChannelSpec
from .urls import EndpointUrl, parse_database_url

#: DATABASE_TLS: no TLS; TLS without checking the certificate; certificate and host name verified.
DatabaseTls = Literal["disable", "require", "verify-full"]

#: The Powertools service name of every function (`observability.SERVICE`).
SERVICE_NAME = "outbox-relay"
# CloudWatch namespaces: 1-255 of these characters, not starting with ':' ("Amazon
# CloudWatch concepts", Namespaces); one it refuses loses every EMF metric silently.
_NAMESPACE_RE = re.compile(r"[0-9A-Za-z.\-_/#: ]{1,255}")
_INT = re.compile(r"-?[0-9]+")
#: OUTBOX_ variables that are not settings but are read elsewhere in the project: the
#: `outbox` command's servers, and the test suite's own (OUTBOX_TEST_*).
OTHER_VARIABLES = frozenset({"OUTBOX_SERVERS"})
OTHER_PREFIX = "OUTBOX_TEST_"


class SdkEnvironment(BaseSettings):
    """Variables that Powertools and the AWS SDK read themselves, at import or at
    their first call, where a bad value is a bare ValueError (a traceback) or is
    silently ignored. They are checked here with the rest, so start-up stops
    naming the variable; the libraries still read them."""

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
    #: A channel's service endpoint (AWS_ENDPOINT_URL_<SERVICE>) is in its own settings.
    aws_endpoint_url: EndpointUrl = Field(default=None, validation_alias="AWS_ENDPOINT_URL")

    @property
    def region(self) -> str | None:
        """The AWS region the clients sign for: AWS_REGION, else AWS_DEFAULT_REGION (Lambda sets both)."""
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
    """Whether the standard library's logging (which Powertools hands the value to,
    upper-cased) knows the level name."""
    return value.upper() in logging.getLevelNamesMapping()


class Settings(SdkEnvironment):
    """The settings every function shares. Field docs name the variable and the unit.
    A relay function's settings are these plus its own channel's (`settings_for`), as
    the handler cookbook composes one model per handler; another channel's variables
    are known names (never "misspelt") but are not read."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="ignore", frozen=True, env_ignore_empty=True)

    #: These settings drive a relay (claims under a lease, a downstream). The
    #: maintenance function's settings (`MaintenanceSettings`) do not, and skip
    #: the relay-only relations below.
    relays: ClassVar[bool] = True
    #: The channels whose settings this model holds (`settings_for`).
    channels: ClassVar[tuple[ChannelSpec, ...]] = ()

    # --- what this function relays ---
    channel: Channel = Channel.REDIS  # OUTBOX_CHANNEL: a registered channel (publishers/registry.py)

    # --- PostgreSQL ---
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    """SQLAlchemy URL, `postgresql+pg8000://user:pass@host:5432/db`."""
    database_secret_arn: str | None = Field(default=None, validation_alias="DATABASE_SECRET_ARN")
    """Secrets Manager secret holding the RDS-style JSON (host, port, username, password, dbname)."""
    database_iam_auth: bool = Field(default=False, validation_alias="DATABASE_IAM_AUTH")
    """Log in with an RDS IAM auth token generated per new connection instead of a password."""
    database_tls: DatabaseTls = Field(
        default="disable", validation_alias="DATABASE_TLS"
    )
    database_ca_bundle: str | None = Field(default=None, validation_alias="DATABASE_CA_BUNDLE")
    """PEM file of CA certificates for `verify-full` (the RDS global bundle)."""
    database_pool_size: int = Field(default=3, ge=1, le=20, validation_alias="DATABASE_POOL_SIZE")
    """Connections kept per container: a latency-mode poller uses three at once (claim, outcome writes, heartbeat)."""

    # --- how much one invocation does ---
    mode: Mode = Mode.BATCH
    """OUTBOX_MODE: batch (one batch), drain (while batches come back full), latency (until the deadline)."""
    poll_interval_seconds: float = Field(default=0.1, ge=0.01, le=60, allow_inf_nan=False)
    """Latency mode: the wait after a claim that found nothing, seconds."""
    poll_max_interval_seconds: float = Field(default=0.1, ge=0.01, le=60, allow_inf_nan=False)
    """Latency mode: the idle wait doubles up to this while claims keep finding nothing, seconds."""
    poller_ttl_seconds: float = Field(default=5.0, ge=1, le=60, allow_inf_nan=False)
    """Latency mode: a poller's registration expires this long after its last heartbeat
    (it renews five times as often); then it counts as dead and its leases are taken over, seconds."""
    pollers: int = Field(default=1, ge=1, le=50)
    """Latency mode: pollers of the channel kept at once, each with its own successor."""
    pollers_max: int | None = Field(default=None, ge=1, le=50)
    """Latency mode: pollers while the backlog is old, up to this many (default OUTBOX_POLLERS)."""
    pollers_add_age_seconds: float = Field(default=1.0, ge=0.1, le=3600, allow_inf_nan=False)
    """Latency mode: a poller is added while the oldest due message is older than this, seconds."""
    successor_lead_seconds: float = Field(default=15.0, ge=1, le=450, allow_inf_nan=False)
    """Latency mode: a poller with no newer one starts its successor this long before its deadline, seconds."""
    self_invoke: bool = True
    """OUTBOX_SELF_INVOKE: latency mode may start its successor by invoking its own function
    (AWS_LAMBDA_FUNCTION_NAME, which Lambda sets; without it no successor is started)."""
    function_name: str | None = Field(default=None, validation_alias="AWS_LAMBDA_FUNCTION_NAME",
                                      pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """The function a latency-mode poller invokes to start its successor (Lambda sets it)."""
    metrics_interval_seconds: float = Field(default=10.0, ge=1, le=900, allow_inf_nan=False)
    """Drain and latency modes: metrics are flushed at least this often, seconds."""

    ordering_on_dead: OrderingOnDead = OrderingOnDead.SKIP
    """OUTBOX_ORDERING_ON_DEAD: when a message with a key is dead-lettered, its key's later
    messages go on (skip) or wait until it is redriven or discarded (block)."""

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

    # --- retention (maintenance function) ---
    retain_delivered_seconds: float = Field(default=7 * 24 * 3600, gt=0, le=10 * 366 * 24 * 3600, allow_inf_nan=False)
    retain_dead_seconds: float = Field(default=30 * 24 * 3600, gt=0, le=10 * 366 * 24 * 3600, allow_inf_nan=False)

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
                "or a message could be claimed twice while its first delivery is still running"
            )
        if self.deadline_margin_seconds >= self.function_timeout_seconds:
            raise ValueError(
                f"OUTBOX_DEADLINE_MARGIN_SECONDS ({self.deadline_margin_seconds:g}s) must be shorter than "
                f"OUTBOX_FUNCTION_TIMEOUT_SECONDS ({self.function_timeout_seconds:g}s), or nothing is ever delivered"
            )
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
    """Settings of the maintenance function (retention purge, backlog metrics,
    redrive): the database and the retention windows
    (`OUTBOX_RETAIN_DELIVERED_SECONDS`, `OUTBOX_RETAIN_DEAD_SECONDS`).

    It claims nothing and publishes nothing, so it reads no channel's settings and its
    timeout is not compared with the lease; every other check applies."""

    relays: ClassVar[bool] = False


@functools.cache
def settings_for(*channels: str, base: type[Settings] = Settings) -> type[Settings]:
    """`base` with the settings of `channels` (registered names) mixed in: a relay
    function's model is `settings_for(<its channel>)`."""
    specs = tuple(spec_for(c) for c in channels)
    name = "".join(spec.template_prefix for spec in specs) + base.__name__
    # Its own config, or the mixins' (no OUTBOX_ prefix) would win.
    namespace = {"channels": specs, "model_config": base.model_config}
    return type(name, (base, *(spec.settings for spec in specs)), namespace)  # type: ignore[return-value]


_RELATION_VARS = (
    "OUTBOX_SUCCESSOR_LEAD_SECONDS", "OUTBOX_POLLER_TTL_SECONDS", "OUTBOX_LEASE_SECONDS", "OUTBOX_DEADLINE_MARGIN_SECONDS", "OUTBOX_BACKOFF_CAP_SECONDS", "OUTBOX_BACKOFF_FLOOR_SECONDS",
    "OUTBOX_POLL_MAX_INTERVAL_SECONDS", "OUTBOX_POLLERS_MAX", "DATABASE_URL",
    *(var for spec in CHANNELS for var in spec.relation_variables),
)


def _variable_for(cls: type[Settings], field: str) -> str:
    aliases = {i.validation_alias for i in cls.model_fields.values() if isinstance(i.validation_alias, str)}
    if field in aliases:
        return field
    info = cls.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, str):
        return info.validation_alias
    if info is not None and isinstance(info.validation_alias, AliasChoices):
        return str(info.validation_alias.choices[0])
    return f"OUTBOX_{field.upper()}"


def load_settings(**overrides: object) -> Settings:
    """Read and validate the environment (plus `overrides`, by field name).

    The model is the common settings plus those of the channel it relays
    (OUTBOX_CHANNEL, or the `channel` override; redis when unset).

    Raises `ConfigurationError` whose `variable` is the environment variable at
    fault and whose text says what is wrong with it.
    """
    channel = overrides.get("channel") or next(
        (v for k, v in os.environ.items() if k.upper() == "OUTBOX_CHANNEL" and v), Channel.REDIS.value)
    try:
        cls = settings_for(Channel(channel).value)
    except ValueError:
        cls = Settings  # which refuses the channel, naming OUTBOX_CHANNEL
    return _load(cls, overrides)


def load_maintenance_settings(**overrides: object) -> MaintenanceSettings:
    """Like `load_settings`, for the maintenance function (`MaintenanceSettings`)."""
    return _load(MaintenanceSettings, overrides)  # type: ignore[return-value]


def variables() -> frozenset[str]:
    """Every environment variable the settings read, every channel's included."""
    names = set()
    for name, info in settings_for(*(spec.name for spec in CHANNELS)).model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice) for choice in alias.choices)
        else:
            names.add(alias if isinstance(alias, str) else f"OUTBOX_{name.upper()}")
    return frozenset(names)


def check_unknown_variables(environ: Mapping[str, str] | None = None) -> None:
    """Refuse an OUTBOX_ variable that no setting reads (decision 0057): a misspelt
    one would leave its setting at the default without a word. Names the closest
    setting when one is near. Raises `ConfigurationError`."""
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
    """The process-wide settings, validated on first use (cold start). Tests call
    `get_settings.cache_clear()` after changing the environment."""
    return load_settings()
