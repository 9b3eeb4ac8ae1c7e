"""Pollers that follow the load: offered load stepped from 10 % of one poller's
sustained rate (R1) to 300 % and back, with `OUTBOX_POLLERS_MAX` above
`OUTBOX_POLLERS`, and how the live pollers follow each step (decision 0068).

It runs the latency section's machinery (`latency._one_rate`: producers commit
along the steps, the real handler runs as latency-mode pollers in containers held
to Lambda's CPU, pollers added by the asynchronous invoke of their own function),
with ordering keys checked in the stream. While the producers run, the channel's
live pollers are read each second from the registry (`outbox_poller`), as the
`Pollers` metric reports them; afterwards, per second: committed, delivered, live
pollers, poller-seconds (the registrations' spans), what the load needs and the lag.

- A step is followed from the second on which the live pollers stay at what the
  new load needs (up: at least it; down: at most it) until the step's end, by
  the median of 5 s around each second, counted from the step.
- "Needs": the offered rate / R1 rounded up, at least `OUTBOX_POLLERS`, at most
  `OUTBOX_POLLERS_MAX`.
- Lag "outside the steps": the commits from `settle` seconds after each step on.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

from sqlalchemy import text

from .env import BenchEnv
from .lambda_model import SchedulerModel
from .latency import _one_rate, _registry
from .scaling import KEYS, _summary, entries_per_second

#: Offered load per step, as fractions of R1.
FRACTIONS = (0.1, 3.0, 0.1)
#: Seconds after a step within which the pollers should have followed (and its lag is not counted).
FOLLOW_SECONDS = 60.0


def needs(offered: float, r1: float, pollers: int, pollers_max: int) -> int:
    return min(pollers_max, max(pollers, math.ceil(offered / r1 - 1e-9)))


class _LivePollers:
    """The channel's live registrations, read once a second while the producers run."""

    def __init__(self, env: BenchEnv, seconds: float) -> None:
        self.env, self.seconds = env, seconds
        self.samples: list[tuple[float, int]] = []

    def run(self, began: float) -> None:
        while time.time() < began + self.seconds:
            try:
                with self.env.engine.connect() as conn:
                    live = conn.execute(text(_LIVE)).scalar_one()
                self.samples.append((time.time(), int(live)))
            except Exception:  # a sample missed (a loaded machine); the next one counts
                pass
            time.sleep(max(0.0, 1.0 - (time.time() - began) % 1.0))


_LIVE = ("SELECT count(*) FROM outbox_poller WHERE channel = 'redis' AND left_at IS NULL "
         "AND expires_at > now()")
_PER_SECOND = """
    SELECT floor(EXTRACT(EPOCH FROM created_at) - :origin)::int, count(*) FROM outbox_message GROUP BY 1
"""
# The lag of the commits of the given seconds (from :origin), stream entry minus commit.
_LAG_OF_SECONDS = """
    WITH d AS (SELECT split_part(delivery_ref, '-', 1)::float8 - EXTRACT(EPOCH FROM created_at) * 1000 AS lag
                 FROM outbox_message
                WHERE status = 'delivered'
                  AND floor(EXTRACT(EPOCH FROM created_at) - :origin)::int = ANY(CAST(:seconds AS int[])))
    SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
           percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), max(lag) FROM d
"""


def run_autoscale(env: BenchEnv, *, r1: float, r1_from: str, step_seconds: float, pollers: int, pollers_max: int,
                  add_age_seconds: float, model: SchedulerModel, batch_size: int,
                  streams: tuple[str, ...]) -> dict[str, Any]:
    steps = [(step_seconds, max(1, round(f * r1))) for f in FRACTIONS]
    seconds = step_seconds * len(steps)
    mean = max(1, round(sum(s * r for s, r in steps) / seconds))
    live = _LivePollers(env, seconds)
    settings = {"OUTBOX_POLLERS_MAX": str(pollers_max), "OUTBOX_POLLERS_ADD_AGE_SECONDS": f"{add_age_seconds:g}"}
    run = _one_rate(env, mean, seconds, model, random.Random(model.seed), batch_size, streams, None,
                    pollers=pollers, keys=KEYS, during=live.run, drain_limit=600.0, steps=steps, settings=settings)
    origin = run["began_at"]
    with env.engine.connect() as conn:
        committed = dict(conn.execute(text(_PER_SECOND), {"origin": origin}).all())
        delivered = entries_per_second(conn, origin * 1000, (origin + seconds) * 1000)
    spans = [(r["started"], r["until"]) for r in _registry(env) or []]
    n = math.ceil(seconds)
    offered = [next(r for i, (_, r) in enumerate(steps) if s < step_seconds * (i + 1) or i == len(steps) - 1)
               for s in range(n)]
    sampled = _per_second([(t - origin, v) for t, v in live.samples], n)
    need = [needs(o, r1, pollers, pollers_max) for o in offered]
    used = [round(sum(max(0.0, min(b, origin + s + 1) - max(a, origin + s)) for a, b in spans), 3) for s in range(n)]
    lag = run["lag_per_second_ms"]
    lag_at = {s: (p50, p99) for s, p50, p99 in zip(lag["second"], lag["p50"], lag["p99"])}
    settle = min(FOLLOW_SECONDS, step_seconds / 2)
    changes = [_change(step_seconds * (i + 1), need[min(n - 1, math.ceil(step_seconds * i))],
                       need[min(n - 1, math.ceil(step_seconds * (i + 1)))], sampled, step_seconds)
               for i in range(len(steps) - 1)]
    outside = [s for s in range(n) if not any(c["at_second"] <= s < c["at_second"] + settle for c in changes)]
    with env.engine.connect() as conn:
        counted, p50, p99, top = conn.execute(text(_LAG_OF_SECONDS), {
            "origin": origin, "seconds": "{" + ",".join(map(str, outside)) + "}"}).one()
    per_step = []
    for i, (_, rate) in enumerate(steps):
        within = range(math.ceil(step_seconds * i), min(n, math.ceil(step_seconds * (i + 1))))
        spent, needed = sum(used[s] for s in within), sum(need[s] for s in within)
        per_step.append({"fraction": FRACTIONS[i], "offered_per_second": rate, "needs": need[within[0]],
                         "committed_per_second": _mean(committed.get(s, 0) for s in within),
                         "delivered_per_second": _mean(delivered[s] for s in within),
                         "live_pollers_most": max((v for s in within if (v := sampled[s]) is not None), default=None),
                         "poller_seconds_per_second": round(spent / len(within), 3) if within else None,
                         "vs_needs": round(spent / needed, 3) if needed else None})
    spent, needed = sum(used), sum(need)
    result = {
        "r1_per_second": r1, "r1_from": r1_from, "fractions": list(FRACTIONS), "step_seconds": step_seconds,
        "pollers": pollers, "pollers_max": pollers_max, "add_age_seconds": add_age_seconds,
        "keys_per_producer": KEYS, "batch_size": batch_size, "settle_seconds": settle,
        "follow_target_seconds": FOLLOW_SECONDS, "steps": per_step, "changes": changes,
        "lag_outside_steps_ms": {"messages": counted, **{k: None if v is None else round(float(v), 1)
                                                         for k, v in (("p50", p50), ("p99", p99), ("max", top))}},
        "poller_seconds_per_second": round(spent / n, 3), "needs_per_second": round(needed / n, 3),
        "vs_needs": round(spent / needed, 3) if needed else None,
        "per_second": {"second": list(range(n)), "offered": offered,
                       "committed": [committed.get(s, 0) for s in range(n)],
                       "delivered": delivered[:n], "live_pollers": sampled,
                       "poller_seconds": used, "needs": need,
                       "lag_p50_ms": [lag_at.get(s, (None, None))[0] for s in range(n)],
                       "lag_p99_ms": [lag_at.get(s, (None, None))[1] for s in range(n)]},
        "latency_run": _summary(run),
        "check": {"ok": run["check"]["ok"], "keys_out_of_order": run["check"].get("order_violations"),
                  "lost": run["lost"], "duplicates": run["duplicates"]},
    }
    return result


def _per_second(samples: list[tuple[float, int]], n: int) -> list[int | None]:
    """The last sample within each second (None: none was taken in it)."""
    out: list[int | None] = [None] * n
    for t, v in samples:
        if 0 <= t < n:
            out[int(t)] = v
    return out


def _change(at: float, before: int, after: int, sampled: list[int | None], step_seconds: float) -> dict[str, Any]:
    """From when the live pollers stayed at what the load after the step at `at` needs (up: at
    least it, down: at most it) to the step's end, by the median of 5 s around each second
    (a handover's overlap, a second or two, does not count)."""
    up = after >= before
    end = min(len(sampled), math.ceil(at + step_seconds))

    def meets(s: int) -> bool:
        near = sorted(v for v in sampled[max(0, s - 2):s + 3] if v is not None)
        return bool(near) and (near[len(near) // 2] >= after if up else near[len(near) // 2] <= after)

    reached = next((s for s in range(math.ceil(at), end) if all(meets(t) for t in range(s, end))), None)
    return {"at_second": at, "direction": "up" if up else "down", "needs_before": before, "needs_after": after,
            "followed_after_seconds": None if reached is None else round(reached + 1 - at, 1)}


def _mean(values: Any) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 1) if values else None
