"""Day partitions without an operator (docs/decisions/0066): days opened ahead, days older than
the delivered window dropped whole, each drop one short transaction that waits on no lock long."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Callable

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from .. import sql
from ..db import run_with_retry

#: Days kept open ahead of today: a maintenance run missed for days never leaves ids without one.
MARGIN_DAYS = 7
#: Opening or dropping a day locks the parent tables: each try waits this long for them, well below
#: the deadlock timeout, so a producer or relay statement never waits long or is the deadlock's victim.
LOCK_TIMEOUT = "200ms"
#: Tries per opening or drop, a second apart; a day still busy is left for the next run.
LOCK_TRIES = 10
EPOCH = date(1970, 1, 1)


@dataclass
class DaysResult:
    opened: int = 0
    dropped: list[int] = field(default_factory=list)
    kept: int = 0  # rows of dropped days moved to day 0
    skipped: list[int] = field(default_factory=list)  # busy: left for the next run
    swap_pending: bool = False  # 0016 prepared online, not swapped in: no day to manage yet

    def as_dict(self) -> dict[str, Any]:
        return {"opened": self.opened, "dropped": [day_text(d) for d in self.dropped], "kept": self.kept,
                "skipped": [day_text(d) for d in self.skipped], "swap_pending": self.swap_pending}


def day_text(day: int | None) -> str | None:
    return None if day is None else (EPOCH + timedelta(days=day)).isoformat()


def manage_days(engine: Engine, *, delivered_older_than_seconds: float, margin_days: int = MARGIN_DAYS,
                keep_going: Callable[[], bool] | None = None) -> DaysResult:
    """Open the days through `margin_days` ahead, then drop each day that ended before the window."""
    result = DaysResult()
    if not run_with_retry(engine, lambda c: c.execute(sql.operations.days_managed).scalar_one()):
        # The old tables still serve; the swap opens the margin, and ids beyond it go to day 0 meanwhile.
        result.swap_pending = True
        return result
    result.opened = _with_short_locks(engine, sql.operations.open_days, {"margin_days": int(margin_days)}) or 0
    window = {"older_than_seconds": float(delivered_older_than_seconds)}
    days = run_with_retry(engine, lambda c: [r[0] for r in c.execute(sql.operations.expired_days, window)])
    for day in days:
        if keep_going is not None and not keep_going():
            break
        kept = _with_short_locks(engine, sql.operations.drop_day, {**window, "day": day})
        if kept is None:
            result.skipped.append(day)
        else:
            result.kept += kept
            result.dropped.append(day)
    return result


def _with_short_locks(engine: Engine, statement: Any, params: dict[str, Any]) -> int | None:
    """The statement's count, in a transaction that waits at most LOCK_TIMEOUT for each lock;
    None when every try found the tables busy."""
    def run(c: Any) -> int:
        c.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        return int(c.execute(statement, params).scalar_one())

    for attempt in range(LOCK_TRIES):
        try:
            return int(run_with_retry(engine, run))
        except DBAPIError as exc:
            if _sqlstate(exc) != "55P03":  # lock_not_available
                raise
            if attempt + 1 < LOCK_TRIES:
                time.sleep(1.0)
    return None


@dataclass(frozen=True, slots=True)
class Partitions:
    days: int
    oldest_day: int | None
    newest_day: int | None
    margin_days: int | None  # open days ahead of today; None: none open
    message_bytes: int
    body_bytes: int
    history_bytes: int

    @classmethod
    def of(cls, row: Any) -> "Partitions":
        return cls(int(row.days), row.oldest_day, row.newest_day, row.margin_days, int(row.message_bytes),
                   int(row.body_bytes), int(row.history_bytes))

    def as_dict(self) -> dict[str, Any]:
        return {"days": self.days, "oldest_day": day_text(self.oldest_day), "newest_day": day_text(self.newest_day),
                "margin_days": self.margin_days,
                "bytes": {"outbox_message": self.message_bytes, "outbox_message_body": self.body_bytes,
                          "outbox_message_history": self.history_bytes}}


def partitions(engine: Engine) -> Partitions:
    return Partitions.of(run_with_retry(engine, lambda c: c.execute(sql.operations.partitions).one()))


def _sqlstate(exc: DBAPIError) -> str | None:
    detail = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
    return detail.get("C") if isinstance(detail, dict) else None
