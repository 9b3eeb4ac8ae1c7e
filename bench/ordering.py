"""The cost of per-key ordering (docs/design.md, "Per-key ordering").

One drain-mode invocation at batch 1,000 over the same backlog without keys
and with its messages spread at random over 10,000, 100 and 1 ordering keys,
in `rounds` interleaved rounds (the median of each is reported, as a ratio to
the keyless figure of the same run); then two invocations at once over 10,000
keys against one (each process then invokes again until a claim finds nothing,
as `bench.drain` does). Every run checks that each message is once in the stream
and that, per (stream, key), the stream holds the messages in enqueue order.
"""

from __future__ import annotations

import statistics
from typing import Any

from sqlalchemy import text

from .drain import DRAIN_ENV, one_invocation
from .env import BenchEnv


def run_ordering(env: BenchEnv, *, n: int, batch_size: int, key_counts: list[int], rounds: int,
                 streams: tuple[str, ...]) -> dict[str, Any]:
    cases: list[int | None] = [None, *key_counts]
    samples: dict[int | None, list[dict[str, Any]]] = {k: [] for k in cases}
    for _ in range(rounds):
        for keys in cases:
            run = one_invocation(env, n=n, batch_size=batch_size, streams=streams, keys=keys)
            _add_order_check(run, key_order(env))
            samples[keys].append(run)
    runs = [_median_run(keys, samples[keys]) for keys in cases]
    keyless = runs[0]["messages_per_second"]
    for run in runs:
        run["vs_keyless"] = round(run["messages_per_second"] / keyless, 3) if keyless else None

    from .concurrency import run_concurrency

    many = max(key_counts)
    one = next(r for r in runs if r["keys"] == many)
    two = run_concurrency(env, n=n, batch_size=batch_size, processes=[2], streams=streams, extra_env=DRAIN_ENV,
                          timeout_seconds=600, keys=many)["runs"][0]
    _add_order_check(two, key_order(env))
    two |= {"keys": many, "batch_size": batch_size,
            "vs_one_invocation": round(two["messages_per_second"] / one["messages_per_second"], 3)}
    return {"messages": n, "batch_size": batch_size, "rounds": rounds, "streams": list(streams),
            "mode": "drain", "runs": runs, "two_invocations": two}


def _add_order_check(run: dict[str, Any], order: dict[str, Any]) -> None:
    """The order check beside the run's own: ok only if both are."""
    ok = run["check"]["ok"] and order["ok"]
    run["check"] |= order
    run["check"]["ok"] = ok


def _median_run(keys: int | None, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput, every round's figure kept beside it."""
    ranked = sorted(samples, key=lambda r: r["messages_per_second"])
    run = dict(ranked[(len(ranked) - 1) // 2])
    run["keys"] = keys
    run["rounds_messages_per_second"] = [r["messages_per_second"] for r in samples]
    run["messages_per_second"] = round(statistics.median(run["rounds_messages_per_second"]), 1)
    run["check"] = dict(run["check"], ok=all(r["check"]["ok"] for r in samples))
    return run


def key_order(env: BenchEnv) -> dict[str, Any]:
    """Per (stream, key), whether the stream holds the key's messages in enqueue
    (seq) order, and whether any message is there twice."""
    with env.engine.connect() as conn:
        seq_of = {str(m): s for m, s in conn.execute(text("SELECT message_id, seq FROM outbox_message"))}
    violations = duplicates = keys_seen = 0
    for stream in env.stream_names():
        last_seq: dict[str, int] = {}
        seen: set[str] = set()
        for fields in env.stream_entries(stream):
            if fields["id"] in seen:
                duplicates += 1
                continue
            seen.add(fields["id"])
            key = fields.get("key")
            if key is None:
                continue
            seq = seq_of[fields["id"]]
            if key in last_seq and seq < last_seq[key]:
                violations += 1
            last_seq[key] = max(seq, last_seq.get(key, seq))
        keys_seen += len(last_seq)
    return {"keys_seen": keys_seen, "order_violations": violations, "duplicates": duplicates,
            "ok": violations == 0 and duplicates == 0}

