"""A channel's pollers at Lambda's CPU: how the sustained latency-mode rate grows
with `OUTBOX_POLLERS`, and how the backlog of a downstream outage drains.

Both run the latency section's machinery (`latency._one_rate`: producers commit at
an offered rate, the real handler runs as latency-mode pollers in containers held
to Lambda's CPU, lag from commit to stream entry), with ordering keys, each
producer its own, checked in the stream every run.

- `run_pollers`: for 1 poller, then 2, 4 (…), the highest offered rate whose lag
  p99 stays within `LAG_P99_MS` with everything delivered within 5 s of the
  producers' end: up by `STEP` from a start rate until a rate fails, then halving
  the interval between the last rate sustained and the first that failed, at most
  `max_runs` runs per count. Each count starts from the previous count's rate.
  PostgreSQL's CPU (the bench database's backends) and the machine's are recorded
  per run, so where PostgreSQL saturates shows.
- `run_catchup`: on a PostgreSQL of the section's own (autovacuum on), the relay
  delivers to a Redis server of the bench's own, which is killed for `outage`
  seconds (its append-only file, written before each reply, keeps what was
  delivered: the kernel holds it when the process dies) while producers offer
  half of R1; then the backlog drains with the producers still offering. The
  drain rate (entries written from the restart to the last entry of a message
  committed before it) is compared with the same pollers' drain, measured first
  into that same Redis, of as large a backlog on the producers' keys while they
  offer as much: only the outage differs (decision 0072).
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from outbox_tools.redis_nodes import MissingServer, RedisNode

from .env import BenchEnv
from .growth import growth_env
from .lambda_model import SchedulerModel
from .latency import FIRST_SEED, _one_rate, producer_key, producers_for

#: A rate is sustained when the lag's p99 stays within this, milliseconds.
LAG_P99_MS = 500.0
#: The search's step up while every rate tried is sustained.
STEP = 1.5
#: The search stops when the first rate that failed is within this factor of the last sustained.
RESOLUTION = 1.15
#: Ordering keys per producer.
KEYS = 250


def sustained(run: dict[str, Any]) -> bool:
    p99 = run["lag_ms"]["p99"]
    return bool(run["sustained"] and run["check"]["ok"] and p99 is not None and p99 <= LAG_P99_MS)


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    """What the figures keep of a run (not its timeline)."""
    keep = ("offered_per_second", "seconds", "producers", "sent", "sent_per_second", "delivered",
            "delivered_per_second",
            "drained_seconds_after_producer", "lag_ms", "duplicates", "lost", "pollers", "keys_per_producer",
            "cpu_cores", "poller_seconds_per_second", "invocations", "first_error", "check")
    p99 = run["lag_ms"]["p99"]
    why = None if sustained(run) else (
        "producers behind" if run["sent"] < 0.98 * run["offered_per_second"] * run["seconds"] else
        f"lag p99 above {LAG_P99_MS:g} ms" if p99 is None or p99 > LAG_P99_MS else
        "not drained within 5 s" if not run["sustained"] else "check failed")
    return {k: run.get(k) for k in keep} | {"sustained": why is None, "not_sustained": why,
                                             "keys_out_of_order": run["check"].get("order_violations")}


def run_pollers(env: BenchEnv, *, counts: list[int], start_rate: int, seconds: float, max_runs: int,
                backlog: int, model: SchedulerModel, batch_size: int, streams: tuple[str, ...]) -> dict[str, Any]:
    rng = random.Random(model.seed)
    results = []
    rate = start_rate
    for n in counts:
        runs: list[dict[str, Any]] = []
        best: int | None = None
        failed: int | None = None
        while len(runs) < max_runs:
            run = _summary(_one_rate(env, rate, seconds, model, rng, batch_size, streams, None,
                                     pollers=n, keys=KEYS))
            runs.append(run)
            if run["sustained"]:
                best = rate
            else:
                failed = rate
            if best is not None and failed is not None and failed <= best * RESOLUTION:
                break
            if failed is None:
                rate = int(rate * STEP)
            elif best is None:
                rate = max(1, int(rate / STEP))
            else:
                rate = (best + failed) // 2
        top = max((r for r in runs if r["sustained"]), key=lambda r: r["offered_per_second"], default=None)
        results.append({"pollers": n, "sustained_per_second": top["delivered_per_second"] if top else None,
                        "sustained_offered_per_second": top["offered_per_second"] if top else None,
                        "cpu_cores_at_sustained": top["cpu_cores"] if top else None, "runs": runs,
                        "drain": _backlog_drain(env, n, backlog, model, rng, batch_size, streams)})
        rate = int((top["offered_per_second"] if top else rate) * STEP)
    r1 = results[0]["sustained_per_second"]
    d1 = results[0]["drain"]["drain_per_second"]
    for r in results:
        r["vs_one"] = round(r["sustained_per_second"] / r1, 3) if r1 and r["sustained_per_second"] else None
        d = r["drain"]["drain_per_second"]
        r["drain"]["vs_one"] = round(d / d1, 3) if d and d1 else None
    return {"lag_p99_limit_ms": LAG_P99_MS, "keys_per_producer": KEYS, "batch_size": batch_size,
            "seconds": seconds, "max_runs": max_runs, "start_rate": start_rate, "r1_per_second": r1,
            "backlog": backlog, "counts": results,
            "check": {"ok": all(x["check"]["ok"] for r in results for x in (*r["runs"], r["drain"]["run"])),
                      "keys_out_of_order": sum(x["keys_out_of_order"] or 0 for r in results
                                               for x in (*r["runs"], r["drain"]["run"])),
                      "lost": sum(x["lost"] for r in results for x in (*r["runs"], r["drain"]["run"]))}}


def backlog_key(i: int, producers: int) -> str:
    """The key of a backlog's i-th message as `producers` producers would have committed it, taking
    turns, each over `KEYS` keys of its own in order."""
    return producer_key(FIRST_SEED + i % producers, i // producers, KEYS)


def _backlog_drain(env: BenchEnv, n: int, backlog: int, model: SchedulerModel, rng: random.Random,
                   batch_size: int, streams: tuple[str, ...], keys: int = KEYS, *, rate: int = 50,
                   seconds: float = 5.0, on_producers_keys: bool = False) -> dict[str, Any]:
    """`n` pollers draining `backlog` messages over `keys` keys that wait when they start, while
    producers offer `rate` (a trickle by default: the pollers' rate with no producer to keep up
    with) for `seconds`. With `on_producers_keys` each producer commits over `KEYS` keys of its
    own and the backlog waits on those same keys, in turn, as an outage leaves it; else the
    producers and the backlog each use `keys` keys."""
    producers = producers_for(rate)

    def on_producer_keys(i: int, event: dict[str, Any]) -> dict[str, Any]:
        return event | {"key": backlog_key(i, producers)}

    run = _one_rate(env, rate, seconds, model, rng, batch_size, streams, None, pollers=n,
                    keys=KEYS if on_producers_keys else keys, backlog=backlog, backlog_keys=keys,
                    backlog_edit=on_producer_keys if on_producers_keys else None, drain_limit=600.0)
    with env.engine.connect() as conn:
        first_ms, last_ms, written = conn.execute(text(_BACKLOG), {"began": run["began_at"] * 1000}).one()
        per_second = entries_per_second(conn, first_ms, last_ms) if written else []
        shared = conn.execute(text(_SHARED_KEYS), {"began": run["began_at"]}).scalar_one()
    span = (last_ms - first_ms) / 1000 if written else None
    return {"messages": backlog, "keys": keys, "keys_the_producers_used": shared, "offered_per_second": rate,
            "seconds": round(span, 2) if span else None,
            "drain_per_second": round(written / span, 1) if span else None,
            # With producers offering, the backlog's last entry came while they still did.
            "producers_outlasted_drain": bool(written) and last_ms / 1000 <= run["began_at"] + run["seconds"],
            "entries_per_second": per_second, "run": _summary(run)}


# The backlog's keys (committed before the producers began) that the producers committed to as well.
_SHARED_KEYS = """
    SELECT count(*) FROM (SELECT DISTINCT key FROM outbox_message WHERE created_at < to_timestamp(:began)) b
      JOIN (SELECT DISTINCT key FROM outbox_message WHERE created_at >= to_timestamp(:began)) p USING (key)
"""


# Entries written in each second from :lo to :hi (Redis's clock, milliseconds): where a drain's time goes.
_PER_SECOND = """
    SELECT s, coalesce(c.n, 0)
      FROM generate_series(0, floor((CAST(:hi AS float8) - CAST(:lo AS float8)) / 1000)::int) s
      LEFT JOIN (SELECT floor((entry_ms - CAST(:lo AS float8)) / 1000)::int AS s, count(*) AS n
                   FROM (SELECT split_part(delivery_ref, '-', 1)::float8 AS entry_ms FROM outbox_message
                          WHERE status = 'delivered') e
                  WHERE entry_ms BETWEEN CAST(:lo AS float8) AND CAST(:hi AS float8) GROUP BY 1) c USING (s)
     ORDER BY s
"""


def entries_per_second(conn: Any, lo_ms: float, hi_ms: float) -> list[int]:
    """Stream entries written in each second from `lo_ms` to `hi_ms` (Redis's clock), zeros included."""
    return [n for _, n in conn.execute(text(_PER_SECOND), {"lo": lo_ms, "hi": hi_ms})]


# Every entry written from the backlog's first to its last, per second (the trickle's among them).
_BACKLOG = """
    WITH d AS (SELECT split_part(delivery_ref, '-', 1)::float8 AS entry_ms,
                      EXTRACT(EPOCH FROM created_at)::float8 * 1000 AS created_ms
                 FROM outbox_message WHERE status = 'delivered'),
         b AS (SELECT min(entry_ms) AS first_ms, max(entry_ms) AS last_ms FROM d WHERE created_ms < :began)
    SELECT b.first_ms, b.last_ms, (SELECT count(*) FROM d WHERE entry_ms BETWEEN b.first_ms AND b.last_ms) FROM b
"""


def run_catchup(env: BenchEnv, *, r1: float, pollers: int, outage: float, lead: float, tail_at_least: float,
                backlog: int, model: SchedulerModel, batch_size: int, streams: tuple[str, ...]) -> dict[str, Any]:
    rate = max(1, int(r1 * 0.5))
    keys = KEYS * producers_for(rate)  # the producers' keys, each producer its own
    waiting = max(backlog, int(rate * outage))  # what the outage leaves waiting
    with tempfile.TemporaryDirectory(prefix="outbox-bench-catchup-") as workdir, growth_env(env) as pg:
        try:
            node = RedisNode(Path(workdir), "--appendonly", "yes", "--appendfsync", "no").start()
        except MissingServer as exc:
            return {"skipped": str(exc)}
        own = dataclasses.replace(pg, servers=dataclasses.replace(pg.servers, redis_url=node.url, _cleanup=[]),
                                  _engine=None, _redis=None)
        times: dict[str, float] = {}

        ended = threading.Event()

        def outage_of_downstream(began: float) -> None:
            if ended.wait(max(0.0, began + lead - time.time())):
                return
            times["down"] = time.time()
            node.kill()
            if ended.wait(outage):
                return
            node.restart()
            times["up"] = time.time()

        try:
            # Into this Redis (its append-only file costs the drain as much): first with no producer to keep
            # up with, then the outage's backlog on the producers' keys while they offer as after it.
            unloaded = _backlog_drain(own, pollers, backlog, model, random.Random(model.seed), batch_size, streams,
                                      keys)
            # The producers outlast the drain the unloaded rate predicts by far: a long drain runs slower.
            tail = max(tail_at_least, waiting / max(1.0, (unloaded["drain_per_second"] or 2 * rate) - rate) * 4)
            _empty_file(node)
            loaded = _backlog_drain(own, pollers, waiting, model, random.Random(model.seed), batch_size, streams,
                                    keys, rate=rate, seconds=tail, on_producers_keys=True)
            _empty_file(node)
            run = _one_rate(own, rate, lead + outage + tail, model, random.Random(model.seed), batch_size, streams,
                            None, pollers=pollers, keys=KEYS, during=outage_of_downstream,
                            drain_limit=outage + 600)
            phases = _phases(own, times, run)
        finally:
            ended.set()
            try:
                own.close()
            finally:
                node.stop()
    rate_after, reference = phases["drain_per_second"], loaded["drain_per_second"]
    refs = (unloaded["run"], loaded["run"])
    return {"pollers": pollers, "offered_per_second": rate, "r1_per_second": r1, "outage_seconds": outage,
            "lead_seconds": lead, "tail_seconds": round(tail, 1), "keys_per_producer": KEYS,
            "reference_per_second": reference,
            "reference_from": f"{waiting:,} messages waiting over the producers' {keys:,} keys while they offer "
                              f"{rate:,}/s, drained into the same Redis in this section",
            "drain_vs_reference": round(rate_after / reference, 3) if rate_after and reference else None,
            "unloaded_per_second": unloaded["drain_per_second"],
            "drain_vs_unloaded": round(rate_after / unloaded["drain_per_second"], 3)
            if rate_after and unloaded["drain_per_second"] else None,
            **phases, "latency_run": _summary(run), "reference_drain": loaded, "unloaded_drain": unloaded,
            "check": {"ok": run["check"]["ok"] and all(r["check"]["ok"] for r in refs),
                      "keys_out_of_order": (run["check"].get("order_violations") or 0)
                      + sum(r["keys_out_of_order"] or 0 for r in refs),
                      "lost": run["lost"] + sum(r["lost"] for r in refs),
                      "duplicates": run["duplicates"] + sum(r["duplicates"] for r in refs)}}


def _empty_file(node: RedisNode) -> None:
    """Each run into the bench's own Redis starts from an empty append-only file: a restart
    loads only what the run itself wrote, and rewrites come at the same sizes."""
    client = node.client()

    def rewritten() -> dict[str, Any]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            info = client.info("persistence")
            if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
                return info
            time.sleep(0.1)
        raise RuntimeError("the bench's Redis did not finish rewriting its append-only file within 120 s")

    try:
        rewritten()  # a rewrite of its own that began before the flush would keep the old entries
        client.flushall()
        client.bgrewriteaof()
        if rewritten()["aof_last_bgrewrite_status"] != "ok":
            raise RuntimeError("the bench's Redis failed to rewrite its append-only file")
    finally:
        client.close()


_ENTRIES = """
    WITH d AS (SELECT split_part(delivery_ref, '-', 1)::float8 AS entry_ms,
                      EXTRACT(EPOCH FROM created_at)::float8 * 1000 AS created_ms
                 FROM outbox_message WHERE status = 'delivered'),
         b AS (SELECT max(entry_ms) AS last_ms, count(*) AS n FROM d WHERE created_ms < :up AND entry_ms >= :up)
    SELECT (SELECT count(*) FROM d WHERE entry_ms >= :down AND entry_ms < :up), b.n, b.last_ms,
           (SELECT count(*) FROM d WHERE entry_ms >= :up AND entry_ms <= b.last_ms)
      FROM b
"""


def _phases(env: BenchEnv, times: dict[str, float], run: dict[str, Any]) -> dict[str, Any]:
    """The outage and the drain after it, from the stream entries' times (Redis's clock)
    and the lag per commit second."""
    if "up" not in times:
        raise RuntimeError("the outage did not end before the producers did")
    per = run["lag_per_second_ms"]
    up_s = times["up"] - run["began_at"]
    normal = LAG_P99_MS
    # Caught up: the first commit second after the restart from which every second's p99 is normal.
    clear_s = next((s for i, s in enumerate(per["second"])
                    if s >= up_s and all(v <= normal for v in per["p99"][i:])), None)
    with env.engine.connect() as conn:
        during, backlog, last_ms, written = conn.execute(
            text(_ENTRIES), {"down": times["down"] * 1000, "up": times["up"] * 1000}).one()
        per_second = entries_per_second(conn, times["up"] * 1000, last_ms) if last_ms else []
    drain_seconds = last_ms / 1000 - times["up"] if last_ms else None
    return {"normal_lag_p99_ms": round(normal, 1), "delivered_during_outage": during,
            "backlog_at_restart": backlog,
            "backlog_drained_seconds": round(drain_seconds, 1) if drain_seconds else None,
            # Every entry written while the backlog drained (new commits among them) per second.
            "drain_per_second": round(written / drain_seconds, 1) if drain_seconds else None,
            "caught_up_after_seconds": round(clear_s - up_s, 1) if clear_s is not None else None,
            "entries_per_second": per_second}
