"""Dead letters: `outbox dead list`, `show` and `discard`."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import Engine

from .. import sql
from ..db import run_with_retry
from ..models import MessageRow, Status
from ..publishers.registry import Channel


@dataclass(frozen=True, slots=True)
class DeadLetter:
    seq: int
    message_id: uuid.UUID
    channel: str
    destination: str
    type: str
    attempts: int
    max_attempts: int | None
    last_error_class: str | None
    last_error: str | None
    dead_at: datetime | None
    created_at: datetime
    dead_for_seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def list_dead(engine: Engine, *, channel: Channel | None = None, error_class: str | None = None,
              since_seconds: float | None = None, since: datetime | None = None,
              limit: int = 50) -> list[DeadLetter]:
    """Newest first, filtered by what is given (`since_seconds` by the database's clock)."""
    if not 1 <= limit <= 10_000:
        raise ValueError("limit must be between 1 and 10000")
    if since is not None and since.tzinfo is None:
        raise ValueError("since must be timezone-aware")
    params = {"channel": Channel(channel).value if channel else None, "error_class": error_class,
              "since_seconds": since_seconds, "since": since, "limit": limit}
    rows = run_with_retry(engine, lambda c: c.execute(sql.operations.list_dead, params).fetchall())
    return [DeadLetter(*r) for r in rows]


def get_message(engine: Engine, message_id: uuid.UUID | str) -> MessageRow | None:
    mid = uuid.UUID(str(message_id))
    row = run_with_retry(engine, lambda c: c.execute(sql.operations.get_message, {"message_id": str(mid)}).first())
    return MessageRow.from_mapping(row._mapping) if row is not None else None


@dataclass(frozen=True, slots=True)
class HistoryLine:
    at: datetime
    event: str
    attempt: int | None
    error_class: str | None
    error: str | None
    ref: str | None
    actor: str | None
    next_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def history_of(engine: Engine, message: MessageRow) -> list[HistoryLine]:
    """Oldest first; a delivery from the row (the relay writes no line for one) unless SES settled it."""
    rows = run_with_retry(engine, lambda c: c.execute(sql.operations.history_of, {"seq": message.seq}).fetchall())
    lines = [HistoryLine(*r) for r in rows]
    if message.status is Status.DELIVERED and message.delivered_at is not None \
            and not (lines and lines[-1].event == "settled"):
        lines.append(HistoryLine(message.delivered_at, "delivered", message.attempts, None, None,
                                 message.delivery_ref, None, None))
    return lines


@dataclass(frozen=True, slots=True)
class DiscardResult:
    discarded: tuple[str, ...]
    not_dead: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"discarded": list(self.discarded), "not_dead": list(self.not_dead)}


def discard(engine: Engine, message_ids: Sequence[uuid.UUID | str]) -> DiscardResult:
    """For good (a discarded one holds back no key); one statement fenced on `status = 'dead'`."""
    ids = list(dict.fromkeys(str(uuid.UUID(str(m))) for m in message_ids))  # each once, in the order given
    if not ids:
        raise ValueError("say which dead letters to discard: one or more message ids")
    found = run_with_retry(engine, lambda c: c.execute(sql.operations.discard_dead, {"message_ids": ids})
                           .scalars().all())
    done = {str(m) for m in found}
    return DiscardResult(tuple(i for i in ids if i in done), tuple(i for i in ids if i not in done))
