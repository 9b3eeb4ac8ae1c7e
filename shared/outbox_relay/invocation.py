"""What a relay handler does, outside the handler: parse the schedule's event,
run one batch, emit metrics and return the summary."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import observability as obs
from .errors import ConfigurationError
from .models import Channel
from .publishers.base import Deadline
from .relay import run_batch
from .runtime import Dependencies
from .store import lease_token


class ScheduleEvent(BaseModel):
    """The event a schedule sends. Two shapes are accepted:

    - EventBridge Scheduler (`AWS::Scheduler::Schedule`, the template's
      `ScheduleV2`), whose `Input` we define: `source`, `channel` and the
      Scheduler context attributes `scheduledTime`, `scheduleArn`, `executionId`;
    - an EventBridge rule's "Scheduled Event" (`detail-type`, `source`
      `aws.events`, `time`, `resources`).

    Unknown fields are ignored. A `channel` that differs from the function's
    OUTBOX_CHANNEL is refused (a misrouted schedule)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    source: str | None = None
    channel: Channel | None = None
    detail_type: str | None = Field(default=None, alias="detail-type")
    time: datetime | None = None
    scheduled_time: str | None = Field(default=None, alias="scheduledTime")
    schedule_arn: str | None = Field(default=None, alias="scheduleArn")
    execution_id: str | None = Field(default=None, alias="executionId")


def check_timeout(deps: Dependencies, context: Any) -> None:
    """Refuse to run when the Lambda timeout is not shorter than the lease (a
    message could be claimed twice while its first delivery still runs)."""
    remaining = context.get_remaining_time_in_millis() / 1000.0
    if remaining >= deps.settings.lease_seconds:
        raise ConfigurationError(
            "OUTBOX_LEASE_SECONDS",
            f"the lease ({deps.settings.lease_seconds:g}s) must be longer than the function timeout "
            f"(at least {remaining:.0f}s remain in this invocation)",
        )


def run_relay(event: dict[str, Any] | None, context: Any, deps: Dependencies) -> dict[str, Any]:
    """Run one relay invocation for `deps.settings.channel` and return the summary dict.

    Raises `pydantic.ValidationError` for an unusable event, `ConfigurationError`
    for a misrouted schedule or a timeout not shorter than the lease.
    """
    parsed = ScheduleEvent.model_validate(event or {})
    channel = deps.settings.channel
    if parsed.channel is not None and parsed.channel is not channel:
        raise ConfigurationError("OUTBOX_CHANNEL", f"this function relays {channel.value}, "
                                 f"the event asks for {parsed.channel.value}")
    check_timeout(deps, context)
    deadline = Deadline(context.get_remaining_time_in_millis, deps.settings.deadline_margin_seconds)
    owner = lease_token(getattr(context, "aws_request_id", "local"))

    summary = run_batch(deps.store, deps.publisher, deps.policy, deadline, owner)
    result = summary.as_dict()
    # Read by the batch's last outcome write; its own statement only when nothing was recorded.
    oldest = result.pop("oldest_pending_age_seconds")
    if oldest is None:
        oldest = deps.store.oldest_pending_age_seconds()
    result["oldest_pending_age_seconds"] = round(oldest, 3)

    obs.ensure_namespace()
    obs.metrics.add_dimension(name="channel", value=channel.value)
    obs.emit(obs.CLAIMED, summary.claimed)
    obs.emit(obs.DELIVERED, summary.delivered)
    obs.emit(obs.RETRIED, summary.retried)
    obs.emit(obs.DEAD_LETTERED, summary.dead)
    obs.emit(obs.RELEASED, summary.released)
    obs.emit(obs.LEASE_LOST, summary.lease_lost)
    obs.emit(obs.THROTTLED, summary.throttled)
    obs.emit(obs.BATCH_STOPPED, 1 if summary.stopped else 0)
    obs.emit(obs.GATE_CLOSED, 1 if summary.gate_closed else 0)
    obs.emit(obs.BATCH_DURATION, summary.duration_ms)
    obs.emit(obs.OLDEST_PENDING_AGE, oldest)
    obs.logger.info("relay batch done", extra={k: v for k, v in result.items() if k != "lease_owner"}
                    | {"lease_owner": summary.lease_owner, "schedule": parsed.schedule_arn or parsed.source})
    return result
