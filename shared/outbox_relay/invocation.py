"""A relay handler's work: the schedule's event, one invocation in the configured mode, metrics."""

from __future__ import annotations

import time
from typing import Any, Callable

from pydantic import Field, ValidationError

from . import observability as obs
from .errors import ConfigurationError, InvalidEventError
from .loop import NO_TIME, RelayLoop
from .models import Mode
from .pollers import BEATS_PER_TTL, Handover, HeartbeatThread, Pollers
from .publishers.base import Deadline
from .publishers.registry import Channel
from .runtime import Dependencies
from .schedule import ScheduledEvent
from .store import lease_token
from .summary import COUNTERS, Summary


class ScheduleEvent(ScheduledEvent):
    channel: Channel | None = None  # another than OUTBOX_CHANNEL is a misrouted schedule
    # From a poller starting its successor or adding one: its lease token, why, and the slot.
    predecessor: str | None = Field(default=None, max_length=200)
    reason: str | None = None
    slot: int | None = Field(default=None, ge=0, le=99)


class MetricsWindow:
    """EMF metrics flushed at least every `interval_seconds` while a long invocation runs, each
    flush what happened since the one before; the handler flushes the rest."""

    def __init__(self, channel: Channel, interval_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.channel, self.interval, self.clock = channel, interval_seconds, clock
        self._sent, self._unreachable_sent = dict.fromkeys(COUNTERS, 0), 0.0
        self._due = clock() + interval_seconds

    def maybe_flush(self, summary: Summary) -> None:
        if self.clock() >= self._due:
            self.add(summary)
            # Powertools flushed by itself if the 100th lag value filled the document.
            if obs.metrics.metric_set:
                obs.metrics.flush_metrics()
            self._due = self.clock() + self.interval

    def add(self, summary: Summary) -> None:
        obs.ensure_namespace()
        obs.metrics.add_dimension(name="channel", value=self.channel.value)
        counters = summary.counters()
        for name, metric in ((c, obs.COUNTER_METRICS[c]) for c in COUNTERS):
            obs.emit(metric, counters[name] - self._sent[name])
        self._sent = counters
        unreachable = summary.database_unreachable_seconds - self._unreachable_sent
        if unreachable > 0:
            obs.emit(obs.DATABASE_UNREACHABLE, round(unreachable, 3))
            self._unreachable_sent = summary.database_unreachable_seconds
        if summary.oldest_pending_age_seconds is not None:
            obs.emit(obs.OLDEST_PENDING_AGE, summary.oldest_pending_age_seconds)
        lag = summary.take_window_lag()
        if lag.count:
            obs.emit(obs.DELIVERY_LAG_MAX, lag.max_ms)
        # Last: Powertools flushes the document by itself when a metric reaches 100 values.
        for value in lag.samples():
            obs.emit(obs.DELIVERY_LAG, value)


def _run_poller(deps: Dependencies, deadline: Deadline, owner: str, window: MetricsWindow,
                slot: int | None) -> tuple[Summary, Handover]:
    settings = deps.settings
    handover = Handover(deps.pollers, owner, settings.channel, deadline,
                        lead_seconds=settings.effective_successor_lead_seconds,
                        start_successor=deps.start_successor, rate_shared=deps.publisher.rate_shared,
                        slot=slot, pollers=Pollers(settings.pollers, settings.pollers_max or settings.pollers,
                                                            settings.pollers_add_age_seconds))
    handover.start()
    deps.publisher.share_rate(handover.rate_share)

    def progress(summary: Summary) -> None:
        handover.observe(summary)
        handover.emit_metrics()
        window.maybe_flush(summary)

    failed = True
    try:
        with HeartbeatThread(handover, settings.poller_ttl_seconds / BEATS_PER_TTL,
                             join_seconds=min(2.0, settings.deadline_margin_seconds / 2)):
            summary = RelayLoop(deps.store, deps.publisher, deps.policy, handover.deadline(), owner,
                                     on_progress=progress, may_claim=handover.may_claim,
                                     part=handover.claim_part).run()
        failed = False
    finally:
        handover.finish(failed=failed)
    if handover.leaving and summary.skipped == NO_TIME:
        summary.skipped = None  # it left for a newer poller before it claimed anything
    return summary, handover


def run_relay(event: dict[str, Any] | None, context: Any, deps: Dependencies) -> dict[str, Any]:
    try:
        parsed = ScheduleEvent.model_validate(event or {})
    except ValidationError as exc:
        raise InvalidEventError.of(exc) from None
    channel = deps.settings.channel
    if parsed.channel is not None and parsed.channel is not channel:
        raise ConfigurationError("OUTBOX_CHANNEL", f"this function relays {channel.value}, "
                                 f"the event asks for {parsed.channel.value}")
    remaining = context.get_remaining_time_in_millis() / 1000.0
    if remaining >= deps.settings.lease_seconds:  # a message could be claimed twice while its first delivery runs
        raise ConfigurationError("OUTBOX_LEASE_SECONDS", f"the lease ({deps.settings.lease_seconds:g}s) must be longer "
                                 f"than the function timeout (at least {remaining:.0f}s remain in this invocation)")
    deadline = Deadline(context.get_remaining_time_in_millis, deps.settings.deadline_margin_seconds)
    owner = lease_token(context.aws_request_id)
    window = MetricsWindow(channel, deps.settings.metrics_interval_seconds)

    if deps.policy.mode is Mode.LATENCY and deps.pollers is not None:
        summary, handover = _run_poller(deps, deadline, owner, window, parsed.slot)
    else:
        summary, handover = RelayLoop(deps.store, deps.publisher, deps.policy, deadline, owner,
                                           on_progress=window.maybe_flush).run(), None
    if summary.oldest_pending_age_seconds is None:
        # Nothing recorded: a last claim that found nothing says none was due; else read it.
        summary.oldest_pending_age_seconds = 0.0 if summary.last_claim_found is False \
            else deps.store.oldest_pending_age_seconds()
    result = summary.as_dict()
    result["oldest_pending_age_seconds"] = round(summary.oldest_pending_age_seconds, 3)
    if handover is not None:
        handover.emit_metrics()
        result["handover"] = handover.summary()

    window.add(summary)
    counters = deps.publisher.counters
    if counters:
        # The publisher's own counts (Redis: not replicated, memory full, stream full, trimmed).
        for name, value in counters.items():
            obs.emit(name, value)
        result["downstream"] = dict(counters)
    obs.emit(obs.BATCH_STOPPED, 1 if summary.stopped else 0)
    obs.emit(obs.GATE_CLOSED, 1 if summary.gate_closed else 0)
    obs.emit(obs.BATCH_DURATION, summary.duration_ms)
    obs.logger.info("relay batch done", extra={k: v for k, v in result.items() if k != "lease_owner"}
                    | {"lease_owner": summary.lease_owner, "schedule": parsed.schedule_arn or parsed.source})
    return result
