"""Redis as it runs on AWS: one node against a cluster of three primaries, WAIT 1
against none, and a failover in the middle of a drain with WAIT 1.

The section starts servers of its own (`outbox_tools.redis_nodes`) on free loopback
ports, in a temporary directory removed afterwards: a primary with one replica, and
a Redis Cluster of three primaries with one replica each. The bench database is the
bench's own. Each drain is one drain-mode invocation of the real handler at one batch
size over a backlog spread over many streams (100 by default, so over every primary).

Messages/second = messages delivered / wall time of the invocation (enqueue excluded),
as in the drain section. The failover run kills a primary (SIGKILL) once a tenth of
the backlog is delivered, lets its replica take over, brings the node back as that
replica's replica (as a replaced node), and drains the rest; then it counts the
messages recorded delivered whose entry is not in their stream, and the message ids
found in more than one entry.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import text

from outbox_tools.redis_nodes import MissingServer, OwnCluster, RedisNode, replicated_pair

from . import lambda_model
from .drain import DRAIN_ENV, checkpoint, warm
from .env import BenchEnv, percentile
from .handler import relay


def stream_names(count: int) -> tuple[str, ...]:
    return tuple(f"bench.s{i:03d}" for i in range(count))


def run_redis(env: BenchEnv, *, n: int, batch_size: int, streams: int, failover_n: int,
              wait_samples: int = 500) -> dict[str, Any]:
    names = stream_names(streams)
    with tempfile.TemporaryDirectory(prefix="outbox-bench-redis-") as workdir:
        try:
            primary, replica = replicated_pair(Path(workdir) / "single")
        except MissingServer as exc:
            return {"skipped": str(exc), "runs": []}
        cluster = None
        try:
            cluster = OwnCluster(Path(workdir) / "cluster").start()
            runs = []
            for topology, url, is_cluster in (("single node", primary.url, False),
                                              ("cluster, 3 primaries", cluster.url, True)):
                for wait in (0, 1):
                    runs.append(_drain(env, url, is_cluster, wait, n=n, batch_size=batch_size, streams=names,
                                       flush=_flusher([primary] if not is_cluster else cluster.primary_nodes()),
                                       count=_counter(primary if not is_cluster else cluster)))
                    runs[-1]["topology"] = topology
            wait_ms = _wait_round_trip(primary, wait_samples)
            failover = _failover(env, cluster, n=failover_n, batch_size=batch_size, streams=names)
        except MissingServer as exc:
            return {"skipped": str(exc), "runs": []}
        finally:
            primary.stop()
            replica.stop()
            if cluster is not None:
                cluster.stop()
    by = {(r["topology"], r["wait_replicas"]): r["messages_per_second"] for r in runs}

    def share(a: tuple[str, int], b: tuple[str, int]) -> float | None:
        return round(by[a] / by[b], 3) if by.get(a) and by.get(b) else None

    return {
        "messages": n, "batch_size": batch_size, "streams": streams, "mode": "drain", "runs": runs,
        "cluster_vs_single": share(("cluster, 3 primaries", 0), ("single node", 0)),
        "wait1_vs_none_single": share(("single node", 1), ("single node", 0)),
        "wait1_vs_none_cluster": share(("cluster, 3 primaries", 1), ("cluster, 3 primaries", 0)),
        "wait_round_trip_ms": wait_ms, "failover": failover,
        "check": {"ok": all(r["check"]["ok"] for r in runs) and failover["check"]["ok"]},
    }


def _flusher(nodes: list[RedisNode]):
    def flush() -> None:
        for node in nodes:  # the section's own servers, never the shared Redis
            client = node.client()
            client.flushall()
            client.close()
    return flush


def _counter(target: Any):
    def count(streams: tuple[str, ...]) -> Counter:
        """Entries per message id over `streams`, on the section's own servers."""
        client = target.client()
        seen: Counter = Counter()
        for stream in streams:
            for _, fields in client.xrange(stream):
                seen[fields[b"id"].decode()] += 1
        client.close()
        return seen
    return count


def _relay_env(url: str, is_cluster: bool, wait: int) -> dict[str, str | None]:
    return DRAIN_ENV | {"REDIS_URL": url, "OUTBOX_REDIS_CLUSTER": "true" if is_cluster else "false",
                        "OUTBOX_REDIS_WAIT_REPLICAS": str(wait)}


def _prepare(env: BenchEnv, n: int, streams: tuple[str, ...], flush) -> None:
    env.reset_table()
    flush()
    env.enqueue(n, streams=streams)
    env.vacuum_analyze()
    checkpoint(env)


def _drain(env: BenchEnv, url: str, is_cluster: bool, wait: int, *, n: int, batch_size: int,
           streams: tuple[str, ...], flush, count) -> dict[str, Any]:
    with relay(env, batch_size, timeout_seconds=600, extra_env=_relay_env(url, is_cluster, wait)) as r:
        _prepare(env, n, streams, flush)
        warm(r)
        with lambda_model.holding():
            started = time.perf_counter()
            result = r.invoke()
            wall = time.perf_counter() - started
        trips = r.round_trips.take() if r.round_trips is not None else None
    counts = env.counts()
    seen = count(_named(env, streams))
    batches = max(1, result["batches"])
    return {
        "wait_replicas": wait, "batch_size": batch_size, "messages": n, "delivered": result["delivered"],
        "wall_seconds": round(wall, 3), "messages_per_second": round(result["delivered"] / wall, 1),
        "batches": result["batches"],
        "redis_round_trips_per_batch": None if trips is None else round(trips / batches, 2),
        "not_replicated": (result.get("downstream") or {}).get("NotReplicated", 0),
        "check": {"rows_delivered": counts.get("delivered", 0), "stream_entries": sum(seen.values()),
                  "ok": counts.get("delivered", 0) == n == sum(seen.values()) == len(seen)},
    }


def _named(env: BenchEnv, streams: tuple[str, ...]) -> tuple[str, ...]:
    """The streams' names as enqueued (under the bench's prefix)."""
    return tuple(env.prefix + s.removeprefix("bench.") for s in streams)


def _wait_round_trip(primary: RedisNode, samples: int) -> dict[str, float]:
    """Milliseconds a pipeline of one XADD takes with WAIT 1 after it, and without."""
    client = primary.client()
    with_wait, without = [], []
    for i in range(samples):
        for waits, into in ((False, without), (True, with_wait)):
            pipe = client.pipeline(transaction=False)
            pipe.xadd("bench-wait-probe", {"n": i}, maxlen=1000)
            if waits:
                pipe.execute_command("WAIT", 1, 1000)
            started = time.perf_counter()
            pipe.execute()
            into.append((time.perf_counter() - started) * 1000.0)
    client.delete("bench-wait-probe")
    client.close()
    return {"with_wait_p50": round(percentile(with_wait, 50), 3), "with_wait_p99": round(percentile(with_wait, 99), 3),
            "without_p50": round(percentile(without, 50), 3), "without_p99": round(percentile(without, 99), 3),
            "samples": samples}


def _failover(env: BenchEnv, cluster: OwnCluster, *, n: int, batch_size: int,
              streams: tuple[str, ...]) -> dict[str, Any]:
    flush = _flusher(cluster.primary_nodes())
    with relay(env, batch_size, timeout_seconds=600, extra_env=_relay_env(cluster.url, True, 1)) as r:
        _prepare(env, n, streams, flush)
        warm(r)
        outcome: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: outcome.update(r.invoke()))
        started = time.perf_counter()
        worker.start()
        while _delivered(env) < n // 10 and worker.is_alive():
            time.sleep(0.005)
        victim = cluster.primary_nodes()[0]
        heir = cluster.replica_of(victim)
        killed_at = _delivered(env)
        victim.kill()
        worker.join()
        promoted_by = time.monotonic() + 60
        while cluster.role_of(heir) != "master" and time.monotonic() < promoted_by:
            time.sleep(0.05)
        victim.start()  # a replaced node: empty, it joins as the new primary's replica
        cluster.wait_ok()
        invocations = 1
        drained_by = time.monotonic() + 120
        while _delivered(env) < n and time.monotonic() < drained_by:
            r.invoke()
            invocations += 1
        wall = time.perf_counter() - started
    seen = _counter(cluster)(_named(env, streams))
    with env.engine.connect() as conn:
        delivered = [str(m) for (m,) in conn.execute(text(
            "SELECT message_id FROM outbox_message WHERE status = 'delivered'"))]
    missing = sum(1 for m in delivered if m not in seen)
    duplicates = sum(c - 1 for c in seen.values() if c > 1)
    return {
        "messages": n, "wait_replicas": 1, "delivered_when_killed": killed_at, "invocations": invocations,
        "wall_seconds": round(wall, 3), "recorded_delivered": len(delivered),
        "recorded_delivered_and_missing": missing, "duplicate_entries": duplicates,
        "check": {"ok": len(delivered) == n and missing == 0 and duplicates == 0},
    }


def _delivered(env: BenchEnv) -> int:
    with env.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM outbox_message WHERE status = 'delivered'")).scalar_one()
