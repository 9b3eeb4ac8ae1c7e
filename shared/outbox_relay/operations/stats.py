"""Queue statistics (`outbox stats`) and backlog figures (the maintenance metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from sqlalchemy import Engine

from .. import sql
from ..db import run_with_retry
from ..publishers.registry import Channel
from .partitions import Partitions

#: Email feedback counts per channel (docs/design.md, "SES feedback").
FEEDBACK_COUNTS = ("bounced", "complained", "suppressed", "ambiguous")
HELD_COUNTS = ("keys_waiting_for_retry", "keys_behind_dead_letter")
LAG_WINDOW_SECONDS = 300.0


def queue_stats(engine: Engine, *, lag_window_seconds: float = LAG_WINDOW_SECONDS) -> dict[str, Any]:
    """`outbox stats` (docs/operating.md), in one transaction by the database clock."""
    with engine.begin() as conn:  # one transaction: a transaction pooler keeps it on one server connection
        rows = [dict(r._mapping) for r in conn.execute(sql.operations.stats)]
        lags = {r.channel: r for r in conn.execute(sql.operations.recent_delivery_lag,
                                                    {"window_seconds": float(lag_window_seconds)})}
        held = {r.channel: r for r in conn.execute(sql.operations.held_keys)}
        feedback = {r.channel: r for r in conn.execute(sql.feedback.feedback_stats)}
        pollers = [{"channel": r.channel, "live": int(r.live),
                    "last_gap_seconds": None if r.last_gap_seconds is None else round(float(r.last_gap_seconds), 3),
                    "last_gap_ended_seconds_ago": None if r.last_gap_ended_seconds_ago is None
                    else round(float(r.last_gap_ended_seconds_ago), 1)}
                   for r in conn.execute(sql.operations.pollers)]
        parts = Partitions.of(conn.execute(sql.operations.partitions).one())
    for r in rows:
        r["oldest_pending_age_seconds"] = round(float(r["oldest_pending_age_seconds"]), 3)
        for source, names in ((held.get(r["channel"]), HELD_COUNTS), (feedback.get(r["channel"]), FEEDBACK_COUNTS)):
            for key in names:
                r[key] = int(getattr(source, key)) if source else 0
        lag = lags.get(r["channel"])
        r["delivery_lag_ms"] = {"window_seconds": lag_window_seconds, "delivered": lag.delivered if lag else 0,
                                **{k: (round(float(getattr(lag, k)), 1) if lag is not None else None)
                                   for k in ("p50", "p99", "max")}}
    totals: dict[str, Any] = {key: sum(r[key] for r in rows) for key in (
        "pending", "due_now", "leased", "expired_leases", "delivered", "dead", "discarded", "dead_last_hour",
        "dead_last_day", *HELD_COUNTS, *FEEDBACK_COUNTS)}
    totals["oldest_pending_age_seconds"] = max((r["oldest_pending_age_seconds"] for r in rows), default=0.0)
    return {"channels": rows, "totals": totals, "pollers": pollers, "partitions": parts.as_dict()}


def delivery_lag_series(engine: Engine, *, window_seconds: float = LAG_WINDOW_SECONDS,
                        buckets: int = 60) -> dict[str, Any]:
    """`outbox stats --chart`: per channel, each of `buckets` slices' largest lag (ms) and count."""
    series: dict[str, dict[str, list[Any]]] = {}
    with engine.connect() as conn:
        for r in conn.execute(sql.operations.delivery_lag_series,
                              {"window_seconds": float(window_seconds), "buckets": int(buckets)}):
            ch = series.setdefault(r.channel, {"max_ms": [None] * buckets, "delivered": [0] * buckets})
            ch["max_ms"][r.bucket] = round(float(r.max), 1)
            ch["delivered"][r.bucket] = int(r.delivered)
    return {"bucket_seconds": window_seconds / buckets,
            "channels": [{"channel": name, **values} for name, values in sorted(series.items())]}


@dataclass(frozen=True, slots=True)
class Backlog:
    channel: Channel
    pending_depth: int
    oldest_pending_age_seconds: float
    dead_count: int


def backlog(engine: Engine, channels: Iterable[Channel] = tuple(Channel)) -> list[Backlog]:
    """One statement; channels without rows get zeros."""
    names = [Channel(c).value for c in channels]
    rows = run_with_retry(engine, lambda c: c.execute(sql.operations.backlog, {"channels": names}).fetchall())
    return [Backlog(Channel(ch), int(depth), round(float(age), 3), int(dead)) for ch, depth, age, dead in rows]
