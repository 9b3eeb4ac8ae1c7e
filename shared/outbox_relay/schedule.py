"""The fields a schedule's event may carry (the relay's and the maintenance function's)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ScheduledEvent(BaseModel):
    """The Scheduler's `Input` as the template defines it, or a rule's "Scheduled Event"; any
    other field is refused (decision 0057): a misspelt one must not run as if absent."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    source: str | None = None
    detail_type: str | None = Field(default=None, alias="detail-type")
    time: datetime | None = None
    scheduled_time: str | None = Field(default=None, alias="scheduledTime")
    schedule_arn: str | None = Field(default=None, alias="scheduleArn")
    execution_id: str | None = Field(default=None, alias="executionId")
    # The rest of a rule's Scheduled Event, not read.
    version: Any = None
    id: Any = None
    account: Any = None
    region: Any = None
    resources: Any = None
    detail: Any = None
