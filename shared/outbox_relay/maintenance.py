"""What the maintenance function does, outside its handler.

On its daily schedule: the retention purge with the configured windows
(`OUTBOX_RETAIN_DELIVERED_SECONDS`, `OUTBOX_RETAIN_DEAD_SECONDS`), in bounded
batches that stop before the Lambda timeout, then the backlog metrics.
On a redrive request: the redrive, then the backlog metrics.

Backlog metrics (EMF, namespace from POWERTOOLS_METRICS_NAMESPACE, dimensions
`channel` and `service`), one EMF document per channel because an EMF
document carries one set of dimension values: PendingDepth, OldestPendingAge
(seconds), DeadCount and, after a purge, Purged. Every channel is reported,
with zeros when it has no messages, so the dashboard and the backlog alarm have
data while the relay is idle.

Nothing here runs at import; `get_dependencies()` builds the settings and the
engine once per container and `reset()` forgets them (tests).
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
from sqlalchemy import Engine

from . import observability as obs
from .config import MaintenanceSettings, load_maintenance_settings
from .db import create_relay_engine
from .errors import InvalidEventError
from .feedback.store import purge_email_events
from .models import ErrorClass
from .operations.purge import PurgeResult, purge
from .operations.redrive import RedriveSelection, redrive
from .operations.stats import Backlog, backlog
from .publishers.registry import Channel
from .schedule import ScheduledEvent

#: Purge batches are not started when fewer seconds than this remain in the
#: invocation (at least the relay's deadline margin): the backlog query and the
#: metrics still have to run. What is left is purged the next day.
MIN_RESERVE_SECONDS = 10.0


class ScheduledRun(ScheduledEvent):
    """The schedule's event (`schedule.ScheduledEvent`): the template's `Input`
    (`action` ``maintenance``) or an EventBridge rule's "Scheduled Event".
    `action`, when present, must be ``maintenance``."""

    action: Literal["maintenance"] = "maintenance"


class RedriveRequest(BaseModel):
    """An operator's redrive request, e.g. ``{"action": "redrive", "channel":
    "redis", "error_class": "transient"}``. Selectors combine (all must match);
    ``"all": true`` alone redrives every dead letter. Unknown fields are
    refused: a misspelt selector must not widen a redrive."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["redrive"]
    ids: list[uuid.UUID] = Field(default_factory=list, max_length=10_000)
    channel: Channel | None = None
    error_class: ErrorClass | None = None
    # Strict: "false" or "yes" in a request is refused, not read as a boolean.
    all: StrictBool = False
    dry_run: StrictBool = False
    source: str | None = None

    def selection(self) -> RedriveSelection:
        """The `RedriveSelection`; raises `ValueError` when nothing or too much is selected."""
        return RedriveSelection(tuple(self.ids), self.channel,
                                    self.error_class.value if self.error_class else None, self.all)


@dataclass(frozen=True)
class MaintenanceDependencies:
    """What a maintenance invocation needs; tests may build their own."""

    settings: MaintenanceSettings
    engine: Engine


@functools.cache
def get_dependencies() -> MaintenanceDependencies:
    """Settings and engine for this container, built on first use (cold start).
    Raises `ConfigurationError` naming the variable at fault."""
    settings = load_maintenance_settings()
    return MaintenanceDependencies(settings, create_relay_engine(settings))


def reset() -> None:
    """Forget the cached dependencies (tests, or after changing the environment)."""
    if get_dependencies.cache_info().currsize:
        get_dependencies().engine.dispose()
    get_dependencies.cache_clear()


def run_maintenance(event: dict[str, Any] | None, context: Any, deps: MaintenanceDependencies) -> dict[str, Any]:
    """Run one maintenance invocation and return its summary dict.

    `event` is a `ScheduledRun` (purge, then backlog metrics) or a
    `RedriveRequest` (redrive, then backlog metrics). Metrics are added to the
    Powertools singleton: every channel but the last is flushed here (one EMF
    document per channel), the last by the handler's `log_metrics`.

    Raises `InvalidEventError` for an unusable event (naming the field), a
    redrive request that selects nothing included.
    """
    event = event or {}
    purged: PurgeResult | None = None
    summary: dict[str, Any]
    if event.get("action") == "redrive":
        try:
            request = RedriveRequest.model_validate(event)
            selection = request.selection()
        except ValidationError as exc:
            raise InvalidEventError.of(exc) from None
        except ValueError as exc:
            raise InvalidEventError("event", str(exc)) from None
        result = redrive(deps.engine, selection, dry_run=request.dry_run)
        summary = {"action": "redrive", "redrive": result.as_dict()}
        obs.logger.info("redrive done", extra={"moved": result.moved, "dry_run": result.dry_run,
                                               "by_channel": result.by_channel,
                                               "by_error_class": result.by_error_class})
    else:
        try:
            run = ScheduledRun.model_validate(event)
        except ValidationError as exc:
            raise InvalidEventError.of(exc) from None
        reserve = max(MIN_RESERVE_SECONDS, deps.settings.deadline_margin_seconds)
        purged = purge(
            deps.engine,
            delivered_older_than_seconds=deps.settings.retain_delivered_seconds,
            dead_older_than_seconds=deps.settings.retain_dead_seconds,
            keep_going=lambda: context.get_remaining_time_in_millis() / 1000.0 > reserve,
        )
        # SES feedback events go with the longer of the two windows: a dead letter's story is kept as long as it is.
        events_purged = purge_email_events(
            deps.engine, older_than_seconds=max(deps.settings.retain_delivered_seconds,
                                                deps.settings.retain_dead_seconds),
            keep_going=lambda: context.get_remaining_time_in_millis() / 1000.0 > reserve)
        summary = {"action": "maintenance", "purged": purged.as_dict(), "email_events_purged": events_purged,
                   "retain_delivered_seconds": deps.settings.retain_delivered_seconds,
                   "retain_dead_seconds": deps.settings.retain_dead_seconds}
        obs.logger.info("retention purge done", extra={"delivered": purged.delivered, "dead": purged.dead,
                                                       "batches": purged.batches, "complete": purged.complete,
                                                       "schedule": run.schedule_arn or run.source})
    figures = backlog(deps.engine)
    summary["backlog"] = [{"channel": b.channel.value, "pending_depth": b.pending_depth,
                           "oldest_pending_age_seconds": b.oldest_pending_age_seconds,
                           "dead_count": b.dead_count} for b in figures]
    emit_backlog(figures, purged)
    return summary


def emit_backlog(figures: list[Backlog], purged: PurgeResult | None = None) -> None:
    """Add PendingDepth, OldestPendingAge, DeadCount (and Purged, when a purge
    ran) per channel to the metrics singleton, one dimension set per EMF
    document: the set of each channel but the last is flushed here."""
    obs.ensure_namespace()
    for i, b in enumerate(figures):
        if i:
            obs.metrics.flush_metrics()
        obs.metrics.add_dimension(name="channel", value=b.channel.value)
        obs.emit(obs.PENDING_DEPTH, b.pending_depth)
        obs.emit(obs.OLDEST_PENDING_AGE, b.oldest_pending_age_seconds)
        obs.emit(obs.DEAD_COUNT, b.dead_count)
        if purged is not None:
            obs.emit(obs.PURGED, purged.by_channel.get(b.channel.value, 0))
