"""The maintenance function's work: daily the day partitions (days opened ahead, expired days
dropped) and the retention purge (bounded batches that stop before the timeout), or an operator's
redrive; then the partition margin and every channel's backlog metrics, zeros included, so the
dashboard and the alarms have data while the relay is idle."""

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
from .operations.partitions import Partitions, manage_days, partitions
from .operations.purge import PurgeResult, purge
from .operations.redrive import RedriveSelection, redrive
from .operations.stats import Backlog, backlog
from .publishers.registry import Channel
from .schedule import ScheduledEvent

#: No purge batch starts with less time left (or the deadline margin): the backlog metrics must run.
MIN_RESERVE_SECONDS = 10.0


class ScheduledRun(ScheduledEvent):
    action: Literal["maintenance"] = "maintenance"


class RedriveRequest(BaseModel):
    """Selectors combine (all must match); unknown fields are refused: a misspelt one must not widen it."""

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
        return RedriveSelection(tuple(self.ids), self.channel, self.error_class.value if self.error_class else None,
                                self.all)


@dataclass(frozen=True)
class MaintenanceDependencies:
    settings: MaintenanceSettings
    engine: Engine


@functools.cache
def get_dependencies() -> MaintenanceDependencies:
    settings = load_maintenance_settings()
    return MaintenanceDependencies(settings, create_relay_engine(settings))


def reset() -> None:
    if get_dependencies.cache_info().currsize:
        get_dependencies().engine.dispose()
    get_dependencies.cache_clear()


def run_maintenance(event: dict[str, Any] | None, context: Any, deps: MaintenanceDependencies) -> dict[str, Any]:
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
                                               "by_channel": result.by_channel, "by_error_class": result.by_error_class})
    else:
        try:
            run = ScheduledRun.model_validate(event)
        except ValidationError as exc:
            raise InvalidEventError.of(exc) from None
        reserve = max(MIN_RESERVE_SECONDS, deps.settings.deadline_margin_seconds)
        delivered, dead = deps.settings.retain_delivered_seconds, deps.settings.retain_dead_seconds

        def keep_going() -> bool:
            return context.get_remaining_time_in_millis() / 1000.0 > reserve

        days = manage_days(deps.engine, delivered_older_than_seconds=delivered,
                           margin_days=deps.settings.partition_margin_days, keep_going=keep_going)
        # What no dropped day took: day 0 (ids of no open day, rows kept past their day) and dead letters.
        purged = purge(deps.engine, delivered_older_than_seconds=delivered, dead_older_than_seconds=dead,
                       keep_going=keep_going, day_zero=True)
        # SES feedback events go with the longer of the two windows: a dead letter's story is kept as long as it is.
        events_purged = purge_email_events(deps.engine, older_than_seconds=max(delivered, dead), keep_going=keep_going)
        summary = {"action": "maintenance", "days": days.as_dict(), "purged": purged.as_dict(), "email_events_purged": events_purged,
                   "retain_delivered_seconds": delivered, "retain_dead_seconds": dead}
        obs.logger.info("retention purge done", extra={"delivered": purged.delivered, "dead": purged.dead,
                                                       "batches": purged.batches, "complete": purged.complete,
                                                       "schedule": run.schedule_arn or run.source})
    figures = backlog(deps.engine)
    summary["partitions"] = (parts := partitions(deps.engine)).as_dict()
    emit_partitions(parts)
    summary["backlog"] = [{"channel": b.channel.value, "pending_depth": b.pending_depth,
                           "oldest_pending_age_seconds": b.oldest_pending_age_seconds,
                           "dead_count": b.dead_count} for b in figures]
    emit_backlog(figures, purged)
    return summary


def emit_partitions(parts: Partitions) -> None:
    """Open days ahead of today (the margin alarm's) and the tables' bytes, in a document of
    their own (no channel)."""
    obs.ensure_namespace()
    obs.emit(obs.PARTITION_MARGIN, float(parts.margin_days or 0))
    obs.emit(obs.TABLE_BYTES, float(parts.message_bytes + parts.body_bytes + parts.history_bytes))
    obs.metrics.flush_metrics()


def emit_backlog(figures: list[Backlog], purged: PurgeResult | None = None) -> None:
    """One EMF document per channel (a document has one set of dimension values); the handler
    flushes the last."""
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
