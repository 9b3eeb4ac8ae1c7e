"""Where SES feedback is written and read; addresses are hashed before they reach a statement."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

from sqlalchemy import Engine

from .. import sql
from ..db import run_with_retry
from ..store import text_array_literal
from .events import FeedbackEvent
from .hashing import AddressHasher, normalise


@dataclass(frozen=True, slots=True)
class Recorded:
    """What recording one event did; `in_flight`: the message was leased (its outcome write settles it)."""

    found: bool
    new: bool
    settled: bool
    suppressed: int
    in_flight: bool = False


class FeedbackStore:
    def __init__(self, engine: Engine, hasher: AddressHasher | None = None, *, suppress: bool = True) -> None:
        self.engine, self.hasher, self.suppress = engine, hasher, suppress

    def record(self, e: FeedbackEvent) -> Recorded:
        assert self.hasher is not None, "recording needs the addresses' key"
        hashes = [self.hasher.hash(a) for a in e.recipients]
        suppress = hashes if (self.suppress and e.suppress_reason) else []
        params = {"tag_id": e.outbox_message_id, "ses_id": e.ses_message_id, "event_type": e.event_type,
                  "event_at": e.event_at.isoformat(), "subtype": e.subtype, "event_key": e.event_key,
                  "recipients": text_array_literal(hashes) if hashes else None,
                  "configuration_set": e.configuration_set, "suppress_reason": e.suppress_reason or "bounce",
                  "suppress": text_array_literal(suppress) if suppress else None}
        found, new, settled, suppressed, _, in_flight = run_with_retry(
            self.engine, lambda c: c.execute(sql.feedback.record_email_event, params).one())
        return Recorded(bool(found), bool(new), bool(settled), int(suppressed), bool(in_flight))

    def events_of(self, message_id: str) -> list[dict[str, Any]]:
        return run_with_retry(self.engine, lambda c: [dict(r._mapping) for r in c.execute(
            sql.feedback.email_events_of, {"message_id": message_id})])


@dataclass(frozen=True, slots=True)
class Suppressed:
    address_hash: str
    reason: str
    detail: str | None
    message_id: Any
    created_at: datetime


class SuppressionList:
    """By address (`entries` needs no key), one statement per call."""

    def __init__(self, engine: Engine, hasher: AddressHasher | None = None) -> None:
        self.engine, self.hasher = engine, hasher

    def reasons(self, addresses: Iterable[str]) -> Mapping[str, str]:
        by_hash: dict[str, str] = {}
        for a in addresses:
            by_hash.setdefault(self._hash(a), normalise(a))
        if not by_hash:
            return {}
        rows = run_with_retry(self.engine, lambda c: c.execute(
            sql.feedback.suppressed_among, {"hashes": text_array_literal(list(by_hash))}).all())
        return {by_hash[h]: reason for h, reason in rows}

    def add(self, address: str, detail: str | None = None) -> bool:
        row = run_with_retry(self.engine, lambda c: c.execute(
            sql.feedback.suppression_add, {"address_hash": self._hash(address), "detail": detail}).first())
        return row is not None

    def remove(self, address: str) -> str | None:
        return run_with_retry(self.engine, lambda c: c.execute(
            sql.feedback.suppression_remove, {"address_hash": self._hash(address)}).scalar())

    def _hash(self, address: str) -> str:
        if self.hasher is None:
            raise ValueError("the suppression list needs the addresses' key to look an address up")
        return self.hasher.hash(address)

    def entries(self, limit: int = 100) -> list[Suppressed]:
        rows = run_with_retry(self.engine, lambda c: c.execute(sql.feedback.suppression_list,
                                                                {"limit": int(limit)}).all())
        return [Suppressed(*r) for r in rows]


EVENT_PURGE_BATCH = 5000


def purge_email_events(engine: Engine, *, older_than_seconds: float, keep_going: Any = lambda: True,
                       batch: int = EVENT_PURGE_BATCH) -> int:
    deleted = 0
    while keep_going():
        n = run_with_retry(engine, lambda c: c.execute(sql.feedback.purge_email_events, {
            "older_than_seconds": float(older_than_seconds), "limit": int(batch)}).rowcount)
        deleted += n
        if n < batch:
            break
    return deleted
