"""Redrive: dead letters back to pending, in batches fenced on `status = 'dead'`."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from sqlalchemy import Engine

from .. import sql
from ..db import run_with_retry
from ..publishers.registry import Channel

REDRIVE_BATCH = 1000


@dataclass(frozen=True, slots=True)
class RedriveSelection:
    """Which dead letters: filters combine (AND); `everything` explicitly, and alone."""

    message_ids: tuple[uuid.UUID, ...] = ()
    channel: Channel | None = None
    error_class: str | None = None
    everything: bool = False

    def __post_init__(self) -> None:
        filtered = bool(self.message_ids) or self.channel is not None or self.error_class is not None
        if self.everything and filtered:
            raise ValueError("redrive everything takes no ids, channel or error class")
        if not self.everything and not filtered:
            raise ValueError("say what to redrive: message ids, a channel, an error class, or everything")

    def params(self) -> dict[str, Any]:
        return {
            "channel": Channel(self.channel).value if self.channel else None,
            "error_class": self.error_class,
            "message_ids": [str(m) for m in self.message_ids] if self.message_ids else None,
        }


@dataclass
class RedriveResult:
    """What a redrive did (or would do); `not_dead`: requested ids that were not dead letters."""

    dry_run: bool
    moved: int = 0
    batches: int = 0
    by_channel: dict[str, int] = field(default_factory=dict)
    by_error_class: dict[str, int] = field(default_factory=dict)
    not_dead: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add(self, channel: str, error_class: str | None, n: int) -> None:
        self.moved += n
        self.by_channel[channel] = self.by_channel.get(channel, 0) + n
        key = error_class or "none"
        self.by_error_class[key] = self.by_error_class.get(key, 0) + n


def count_redrive(engine: Engine, selection: RedriveSelection) -> int:
    rows = run_with_retry(engine, lambda c: c.execute(sql.operations.redrive_preview, selection.params()).fetchall())
    return sum(int(n) for _, _, n in rows)


def redrive(engine: Engine, selection: RedriveSelection, *, dry_run: bool = False,
            batch_size: int = REDRIVE_BATCH,
            on_batch: Callable[[int], None] | None = None) -> RedriveResult:
    """Back to pending (attempts 0, due now) in batches until none older than the redrive's start
    is left; concurrent redrives skip each other's rows."""
    if not 1 <= batch_size <= 10_000:
        raise ValueError("batch_size must be between 1 and 10000")
    params = selection.params()
    result = RedriveResult(dry_run=dry_run)
    seen: set[str] = set()
    if dry_run:
        for channel, error_class, n in run_with_retry(
                engine, lambda c: c.execute(sql.operations.redrive_preview, params).fetchall()):
            result.add(channel, error_class, int(n))
        if selection.message_ids:
            found = run_with_retry(engine, lambda c: c.execute(sql.operations.dead_among, params).scalars().all())
            seen = {str(m) for m in found}
    else:
        cutoff = run_with_retry(engine, lambda c: c.execute(sql.operations.db_now).scalar_one())
        batch_params = params | {"cutoff": cutoff, "limit": batch_size}
        while True:
            rows = run_with_retry(engine, lambda c: c.execute(sql.operations.redrive_batch, batch_params).fetchall())
            if not rows:
                break
            result.batches += 1
            for message_id, channel, error_class in rows:
                seen.add(str(message_id))
                result.add(channel, error_class, 1)
            if on_batch is not None:
                on_batch(len(rows))
    result.not_dead = list(dict.fromkeys(str(m) for m in selection.message_ids if str(m) not in seen))
    return result
