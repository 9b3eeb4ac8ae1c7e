"""Logging, metrics and tracing: Powertools singletons sharing one service name.

Metric names below are the exact names the code emits (EMF, dimension
`channel`); `template.yaml`'s alarms and dashboard use the same names, and a
test checks that they agree. Logs carry message ids, counts and error
classes, never payloads, addresses or subjects.
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit

SERVICE = "outbox-relay"
DEFAULT_NAMESPACE = "OutboxRelay"

logger = Logger(service=SERVICE)
metrics = Metrics(service=SERVICE)
tracer = Tracer(service=SERVICE)

# Relay (per invocation, dimension channel)
CLAIMED = "Claimed"
DELIVERED = "Delivered"
RETRIED = "Retried"
DEAD_LETTERED = "DeadLettered"
RELEASED = "Released"
LEASE_LOST = "LeaseLost"
THROTTLED = "Throttled"
BATCH_STOPPED = "BatchStopped"
GATE_CLOSED = "GateClosed"
BATCH_DURATION = "BatchDuration"
OLDEST_PENDING_AGE = "OldestPendingAge"
# Maintenance (daily, dimension channel)
PENDING_DEPTH = "PendingDepth"
DEAD_COUNT = "DeadCount"
PURGED = "Purged"

#: Every metric the code emits, with its unit.
METRIC_UNITS: dict[str, MetricUnit] = {
    CLAIMED: MetricUnit.Count,
    DELIVERED: MetricUnit.Count,
    RETRIED: MetricUnit.Count,
    DEAD_LETTERED: MetricUnit.Count,
    RELEASED: MetricUnit.Count,
    LEASE_LOST: MetricUnit.Count,
    THROTTLED: MetricUnit.Count,
    BATCH_STOPPED: MetricUnit.Count,
    GATE_CLOSED: MetricUnit.Count,
    BATCH_DURATION: MetricUnit.Milliseconds,
    OLDEST_PENDING_AGE: MetricUnit.Seconds,
    PENDING_DEPTH: MetricUnit.Count,
    DEAD_COUNT: MetricUnit.Count,
    PURGED: MetricUnit.Count,
}


def ensure_namespace() -> None:
    """Use POWERTOOLS_METRICS_NAMESPACE when set, else the default namespace."""
    if not metrics.namespace:
        metrics.namespace = DEFAULT_NAMESPACE


def emit(name: str, value: float) -> None:
    """Add one metric with its declared unit."""
    metrics.add_metric(name=name, unit=METRIC_UNITS[name], value=value)
