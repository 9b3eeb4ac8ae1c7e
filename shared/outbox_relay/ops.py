"""Operator queries: queue statistics (more operations live beside it)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

STATS = text(
    """
    SELECT channel,
           count(*) FILTER (WHERE status = 'pending')                              AS pending,
           count(*) FILTER (WHERE status = 'pending' AND available_at <= now())    AS due_now,
           count(*) FILTER (WHERE status = 'leased')                               AS leased,
           count(*) FILTER (WHERE status = 'leased' AND lease_expires_at <= now()) AS expired_leases,
           count(*) FILTER (WHERE status = 'delivered')                            AS delivered,
           count(*) FILTER (WHERE status = 'dead')                                 AS dead,
           count(*) FILTER (WHERE status = 'dead' AND dead_at > now() - interval '1 hour') AS dead_last_hour,
           count(*) FILTER (WHERE status = 'dead' AND dead_at > now() - interval '1 day')  AS dead_last_day,
           coalesce(EXTRACT(EPOCH FROM now() - min(available_at)
                    FILTER (WHERE status = 'pending' AND available_at <= now())), 0)::float8
                                                                                    AS oldest_pending_age_seconds
      FROM outbox_message
     GROUP BY channel
     ORDER BY channel
    """
)


def queue_stats(engine: Engine) -> dict[str, Any]:
    """Counts per channel and status, expired leases, dead in the last hour/day,
    and the oldest due pending message's age in seconds (database clock).

    Returns ``{"channels": [{"channel": …, "pending": …, …}], "totals": {…}}``.
    """
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(STATS)]
    for r in rows:
        r["oldest_pending_age_seconds"] = round(float(r["oldest_pending_age_seconds"]), 3)
    totals: dict[str, Any] = {}
    for key in ("pending", "due_now", "leased", "expired_leases", "delivered", "dead",
                "dead_last_hour", "dead_last_day"):
        totals[key] = sum(r[key] for r in rows)
    totals["oldest_pending_age_seconds"] = max((r["oldest_pending_age_seconds"] for r in rows), default=0.0)
    return {"channels": rows, "totals": totals}
