"""Logging, metrics and tracing: Powertools singletons sharing one service name. The
metric names are the template's (a test checks); logs never carry personal data."""

from __future__ import annotations

import os

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from pydantic import TypeAdapter, ValidationError

from .config import SERVICE_NAME, log_level_ok
from .publishers.registry import CHANNELS

SERVICE = SERVICE_NAME
DEFAULT_NAMESPACE = "OutboxRelay"


def _boolean_ok(value: str) -> bool:
    try:
        TypeAdapter(bool).validate_python(value)
        return True
    except ValidationError:
        return False


# Powertools raises at import on a bad value of these three; build with a safe one so the
# settings can refuse it naming the variable (`config.SdkEnvironment`).
_level = os.environ.get("POWERTOOLS_LOG_LEVEL")
_trace_disabled = os.environ.get("POWERTOOLS_TRACE_DISABLED")
_dev = os.environ.get("POWERTOOLS_DEV")
if _dev and not _boolean_ok(_dev):
    del os.environ["POWERTOOLS_DEV"]  # it has no parameter: unset while the singletons are built
try:
    logger = Logger(service=SERVICE, level="INFO" if _level and not log_level_ok(_level) else None)
    metrics = Metrics(service=SERVICE)
    tracer = Tracer(service=SERVICE, disabled=True if _trace_disabled and not _boolean_ok(_trace_disabled) else None)
finally:
    if _dev is not None:
        os.environ["POWERTOOLS_DEV"] = _dev

# Relay (per invocation, dimension channel)
CLAIMED, DELIVERED, RETRIED, DEAD_LETTERED = "Claimed", "Delivered", "Retried", "DeadLettered"
RELEASED, LEASE_LOST, THROTTLED = "Released", "LeaseLost", "Throttled"
BATCH_STOPPED, GATE_CLOSED, BATCH_DURATION = "BatchStopped", "GateClosed", "BatchDuration"
OLDEST_PENDING_AGE, DELIVERY_LAG, DELIVERY_LAG_MAX = "OldestPendingAge", "DeliveryLag", "DeliveryLagMax"
# Latency mode's poller handover (the live pollers as one saw them), and seconds PostgreSQL could not be reached.
POLLERS, SECONDS_WITHOUT_POLLER, SUCCESSOR_NOT_STARTED = "Pollers", "SecondsWithoutPoller", "SuccessorNotStarted"
LEASES_TAKEN_OVER, DATABASE_UNREACHABLE = "LeasesTakenOver", "DatabaseUnreachableSeconds"
# Maintenance (daily, dimension channel)
PENDING_DEPTH, DEAD_COUNT, PURGED = "PendingDepth", "DeadCount", "Purged"
# No dimension: open days ahead of today, the outbox tables' bytes.
PARTITION_MARGIN, TABLE_BYTES = "PartitionMarginDays", "OutboxTableBytes"

# SES feedback (dimension service; the reputation ones by configuration_set).
FEEDBACK_METRICS = ("FeedbackRecorded", "FeedbackDuplicate", "FeedbackUnknownMessage", "FeedbackRefused",
                    "FeedbackSettled", "FeedbackSuppressed", "EmailSent", "EmailBounced", "EmailComplained")

#: Every metric the code emits, with its unit: counts but for these.
METRIC_UNITS: dict[str, MetricUnit] = {
    BATCH_DURATION: MetricUnit.Milliseconds, DELIVERY_LAG: MetricUnit.Milliseconds,
    DELIVERY_LAG_MAX: MetricUnit.Milliseconds, OLDEST_PENDING_AGE: MetricUnit.Seconds,
    SECONDS_WITHOUT_POLLER: MetricUnit.Seconds, DATABASE_UNREACHABLE: MetricUnit.Seconds,
    TABLE_BYTES: MetricUnit.Bytes,
}
METRIC_UNITS.update(dict.fromkeys(
    (CLAIMED, DELIVERED, RETRIED, DEAD_LETTERED, RELEASED, LEASE_LOST, THROTTLED, BATCH_STOPPED, GATE_CLOSED,
     POLLERS, SUCCESSOR_NOT_STARTED, LEASES_TAKEN_OVER, PENDING_DEPTH, DEAD_COUNT, PURGED, PARTITION_MARGIN,
     *FEEDBACK_METRICS,
     *(name for spec in CHANNELS for name in spec.metrics)), MetricUnit.Count))

#: The relay summary's message counts (`relay.COUNTERS`) and the metric each one is.
COUNTER_METRICS = {"claimed": CLAIMED, "delivered": DELIVERED, "retried": RETRIED, "dead": DEAD_LETTERED,
                   "released": RELEASED, "lease_lost": LEASE_LOST, "throttled": THROTTLED}


def ensure_namespace() -> None:
    if not metrics.namespace:
        metrics.namespace = DEFAULT_NAMESPACE


def emit(name: str, value: float) -> None:
    metrics.add_metric(name=name, unit=METRIC_UNITS[name], value=value)
