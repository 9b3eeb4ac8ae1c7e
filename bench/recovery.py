"""Recovery after a fleet-wide crash (docs/design.md, "Per-key ordering", its suspects; decision 0035).

One fleet of `invocations` warm relay containers (processes, each held to
Lambda's CPU at the function's memory: `lambda_model.start`), each running
drain-mode invocations of the real handler back to back until one claims
nothing, as `bench.concurrency` does, serves every pass of the section:

- **drain**: a backlog of `n` fresh pending messages;
- **recovery**: the same `n` messages in the state a fleet-wide crash leaves.
  Each batch was claimed through the relay's own claim (`LeaseStore.claim`,
  the same batch size) under the token of an invocation that then died
  before publishing it (as in a Redis outage that ran every invocation into
  its timeout); then every lease is moved back by one interval on the
  database's clock, so that the last one ran out a second ago and they keep
  the order in which they were claimed (what waiting out the lease would do);
- **poison**: the recovery again with one message among them that kills its
  invocation whenever it is about to be published (the process exits at
  once, nothing released or recorded). The fleet replaces a dead container
  and runs again after the dead invocation's leases are expired the same way,
  until a pass neither crashes nor leaves anything to do.

Drain and recovery are timed from a common start signal to the last
container's empty claim, after the same preparation (VACUUM ANALYZE,
CHECKPOINT), in interleaved rounds; the recovery's time is given as a ratio to
the drain's. Every pass is checked in the database and in the streams.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import statistics
import time
from collections import Counter
from typing import Any

from sqlalchemy import text

from outbox_relay.config import Settings
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore, lease_token

from . import lambda_model
from .concurrency import env_arguments
from .drain import DRAIN_ENV, checkpoint
from .env import BenchEnv

#: What marks the poison message's payload; the poisoned containers die on it.
POISON_FIELD = "bench_poison"
#: Exit status of a container killed by the poison message.
POISON_EXIT = 3
#: The relay's own default retry budget (OUTBOX_MAX_ATTEMPTS, the template's MaxAttempts).
MAX_ATTEMPTS = Settings.model_fields["max_attempts"].default
TIMEOUT_SECONDS = float(DRAIN_ENV["OUTBOX_FUNCTION_TIMEOUT_SECONDS"])
LEASE_SECONDS = float(DRAIN_ENV["OUTBOX_LEASE_SECONDS"])


def _worker(ready: Any, commands: Any, out: Any, index: int, env_args: dict[str, Any], batch_size: int) -> None:
    """One container: warm once, then for each command a pass of invocations until one claims nothing."""
    import os

    from .concurrency import worker_env
    from .handler import relay

    env = worker_env(env_args)
    try:
        with relay(env, batch_size, extra_env=DRAIN_ENV, timeout_seconds=TIMEOUT_SECONDS) as r:
            publisher = r.deps.publisher
            deliver = publisher.deliver
            ready.put(index)
            while True:
                command = commands.get()
                if command is None:
                    return
                if command.get("poison"):
                    marker = f'"{POISON_FIELD}"'

                    def crashing(messages: Any, *args: Any, _deliver: Any = deliver, _marker: str = marker) -> Any:
                        if any(_marker in m.payload_json for m in messages):
                            os._exit(POISON_EXIT)  # the message kills its invocation
                        return _deliver(messages, *args)

                    publisher.deliver = crashing
                else:
                    publisher.deliver = deliver
                r.statements.take()
                counts = Counter()
                started = time.perf_counter()
                while True:
                    result = r.invoke()
                    counts["invocations"] += 1
                    for field in ("claimed", "delivered", "dead", "released", "lease_lost", "batches", "polls",
                                  "suspects"):
                        counts[field] += result[field]
                    if result["claimed"] == 0:
                        break
                counts["statements"] = r.statements.take()
                out.put({"index": index, "seconds": time.perf_counter() - started, "error": None, **counts})
    except BaseException as exc:  # report, never hang the parent
        ready.put(index)
        out.put({"index": index, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        env.close()


class Fleet:
    """`k` warm relay containers kept across passes; one killed is replaced by a new one."""

    def __init__(self, env: BenchEnv, k: int, batch_size: int) -> None:
        self.env, self.k, self.batch_size = env, k, batch_size
        self.ctx = mp.get_context("spawn")
        self.env_args = env_arguments(env)
        self.out, self.ready = self.ctx.Queue(), self.ctx.Queue()
        self.procs: dict[int, Any] = {}
        self.commands: dict[int, Any] = {}
        self.replaced = 0
        env.reset_table()  # the warm-up invocations find nothing
        for i in range(k):
            self._start(i)
        self._wait_ready(range(k))

    def _start(self, index: int) -> None:
        self.commands[index] = self.ctx.Queue()
        self.procs[index] = self.ctx.Process(target=_worker, daemon=True, args=(
            self.ready, self.commands[index], self.out, index, self.env_args, self.batch_size))
        lambda_model.start(self.procs[index])

    def _wait_ready(self, indexes: Any) -> None:
        for _ in indexes:
            try:
                self.ready.get(timeout=600)
            except queue.Empty:
                raise RuntimeError("a relay container did not start within 600 s") from None

    def run(self, *, poison: bool = False) -> tuple[list[dict[str, Any]], list[int], float]:
        """One pass: every container starts at once and invokes until an invocation claims
        nothing (or the poison kills it). Returns the reports, the containers killed and the
        wall seconds from the start until the last one ended."""
        started = time.perf_counter()
        for index in self.procs:
            self.commands[index].put({"poison": poison})
        reports: dict[int, dict[str, Any]] = {}
        killed: list[int] = []
        ended = started
        while len(reports) + len(killed) < len(self.procs):
            try:
                report = self.out.get(timeout=0.05)
            except queue.Empty:
                for index, p in self.procs.items():
                    if index not in reports and index not in killed and p.exitcode not in (None, 0):
                        killed.append(index)
                        ended = time.perf_counter()
                if time.perf_counter() - started > 3600:
                    raise RuntimeError("a recovery pass took more than an hour")
                continue
            if report["error"]:
                raise RuntimeError(f"relay container failed: {report['error']}")
            reports[report["index"]] = report
            ended = time.perf_counter()
        for index in killed:
            if self.procs[index].exitcode != POISON_EXIT:
                raise RuntimeError(f"relay container died with exit status {self.procs[index].exitcode}")
            self.procs[index].join(timeout=30)
            lambda_model.release(self.procs[index])
            self.replaced += 1
            self._start(index)
        self._wait_ready(killed)
        return list(reports.values()), killed, ended - started

    def close(self) -> None:
        for index, p in self.procs.items():
            if p.is_alive():
                self.commands[index].put(None)
        for p in self.procs.values():
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=30)
            lambda_model.release(p)


def enqueue(env: BenchEnv, n: int, streams: tuple[str, ...], poison_at: int | None = None) -> None:
    """`n` events as `BenchEnv.enqueue` writes them (same seed, same payloads); with
    `poison_at`, that message's payload also carries the poison marker."""
    def poison(i: int, event: dict[str, Any]) -> dict[str, Any]:
        return dict(event, payload=dict(event["payload"], **{POISON_FIELD: True})) if i == poison_at else event

    env.enqueue(n, streams=streams, edit=poison)


def crash_fleet(env: BenchEnv, batch_size: int) -> int:
    """Claim every pending message through the relay's claim, a batch per dead
    invocation, then let their leases run out. Returns the invocations that died."""
    store = LeaseStore(env.engine, Channel.REDIS, default_max_attempts=MAX_ATTEMPTS)
    dead = 0
    while store.claim(lease_token(f"crashed-{dead}"), batch_size, LEASE_SECONDS).messages:
        dead += 1
    expire_leases(env)
    return dead


def expire_leases(env: BenchEnv) -> int:
    """Move every lease back by one interval on the database clock, so that the last
    ends a second ago and they keep their order (waiting out the lease, without the wait)."""
    with env.engine.connect() as conn:
        return conn.execute(text(
            "UPDATE outbox_message SET lease_expires_at = lease_expires_at "
            "  - ((SELECT max(lease_expires_at) FROM outbox_message WHERE status = 'leased') - now()) "
            "  - interval '1 second' "
            "WHERE status = 'leased'")).rowcount


def prepare(env: BenchEnv, n: int, streams: tuple[str, ...], batch_size: int, *, crashed: bool,
            poison_at: int | None = None) -> int:
    """The table and streams emptied, `n` messages enqueued and, when `crashed`, every one
    under an expired lease; VACUUM ANALYZE and CHECKPOINT as for every drain. Returns the
    invocations that died holding them."""
    env.reset_table()
    env.clean_redis()
    enqueue(env, n, streams, poison_at)
    dead = crash_fleet(env, batch_size) if crashed else 0
    env.vacuum_analyze()
    checkpoint(env)
    return dead


def _state(env: BenchEnv) -> dict[str, Any]:
    """Rows per status, attempts of the delivered rows, and the dead rows."""
    with env.engine.connect() as conn:
        statuses = dict(conn.execute(text("SELECT status, count(*) FROM outbox_message GROUP BY status")).all())
        attempts = dict(conn.execute(text(
            "SELECT attempts, count(*) FROM outbox_message WHERE status = 'delivered' GROUP BY attempts")).all())
        dead = conn.execute(text(
            "SELECT m.message_id::text, m.attempts, coalesce(m.max_attempts, :d), m.last_error_class, "
            "       strpos(b.payload::text, :marker) > 0 "
            "  FROM outbox_message m JOIN outbox_message_body b USING (seq) WHERE m.status = 'dead'"),
            {"d": MAX_ATTEMPTS, "marker": f'"{POISON_FIELD}"'}).all()
        delivered_ids = {r[0] for r in conn.execute(text(
            "SELECT message_id::text FROM outbox_message WHERE status = 'delivered'"))}
    return {"statuses": statuses, "attempts": attempts, "dead": dead, "delivered_ids": delivered_ids}


def _stream_check(env: BenchEnv, delivered_ids: set[str]) -> dict[str, Any]:
    ids = env.stream_message_ids()
    distinct = set(ids)
    return {"stream_entries": len(ids), "distinct_ids": len(distinct), "duplicates": len(ids) - len(distinct),
            "lost": len(delivered_ids - distinct), "not_delivered_in_stream": len(distinct - delivered_ids)}


def _pass_result(kind: str, n: int, reports: list[dict[str, Any]], wall: float, dead_invocations: int,
                 env: BenchEnv) -> dict[str, Any]:
    totals = Counter()
    for r in reports:
        totals.update({k: v for k, v in r.items() if isinstance(v, int) and k != "index"})
    state = _state(env)
    stream = _stream_check(env, state["delivered_ids"])
    delivered_rows = state["statuses"].get("delivered", 0)
    attempts_expected = 2 if kind == "recovery" else 1
    ok = (delivered_rows == n == totals["delivered"] == stream["stream_entries"] == stream["distinct_ids"]
          and stream["lost"] == 0 and stream["not_delivered_in_stream"] == 0 and not state["dead"]
          and state["attempts"] == {attempts_expected: n})
    batches = max(1, totals["batches"])
    return {
        "kind": kind, "messages": n, "wall_seconds": round(wall, 3),
        "messages_per_second": round(totals["delivered"] / wall, 1) if wall else None,
        "invocations": totals["invocations"], "claims": totals["polls"], "batches": totals["batches"],
        "suspects": totals["suspects"], "statements": totals["statements"],
        "statements_per_batch": round(totals["statements"] / batches, 2),
        "dead_holders": dead_invocations,
        "per_process_delivered": sorted((r["delivered"] for r in reports), reverse=True),
        "check": {"rows_delivered": delivered_rows, "rows_dead": len(state["dead"]),
                  "attempts": {str(k): v for k, v in sorted(state["attempts"].items())}, **stream, "ok": ok},
    }


def _poison_pass(env: BenchEnv, fleet: Fleet, *, n: int, batch_size: int, streams: tuple[str, ...],
                 drain_seconds: float | None) -> dict[str, Any]:
    """The recovery with a poison message among the `n`: passes until one neither crashes
    nor leaves messages leased or pending; between passes the dead invocations' leases
    run out (moved back on the database clock)."""
    poison_at = n // 2
    dead_invocations = prepare(env, n, streams, batch_size, crashed=True, poison_at=poison_at)
    passes: list[dict[str, Any]] = []
    # The poison is charged once by the fleet's crash, once per invocation it kills, and
    # is dead-lettered by the claim that finds it expired with no attempts left.
    delivered_before = 0
    for _ in range(MAX_ATTEMPTS + 3):
        _, killed, wall = fleet.run(poison=True)
        # From the table: a killed invocation reports nothing.
        statuses = env.counts()
        passes.append({"wall_seconds": round(wall, 3), "invocations_killed": len(killed),
                       "delivered": statuses.get("delivered", 0) - delivered_before,
                       "dead": statuses.get("dead", 0), "pending": statuses.get("pending", 0),
                       "leased": statuses.get("leased", 0)})
        delivered_before = statuses.get("delivered", 0)
        if killed:
            expire_leases(env)
        elif not statuses.get("pending") and not statuses.get("leased"):
            break
    state = _state(env)
    stream = _stream_check(env, state["delivered_ids"])
    poison = [d for d in state["dead"] if d[4]]
    others_dead = [d for d in state["dead"] if not d[4]]
    attempts = state["attempts"]
    delivered_rows = state["statuses"].get("delivered", 0)
    poison_attempts = poison[0][1] if poison else None
    first = passes[0]
    check = {
        "poison_dead": bool(poison), "poison_attempts": poison_attempts, "max_attempts": MAX_ATTEMPTS,
        "poison_error_class": poison[0][3] if poison else None,
        "invocations_killed": sum(p["invocations_killed"] for p in passes), "other_dead": len(others_dead),
        "rows_delivered": delivered_rows, **stream,
        "innocent_attempts": {str(k): v for k, v in sorted(attempts.items())},
    }
    check["ok"] = (len(poison) == 1 and poison_attempts == MAX_ATTEMPTS and check["poison_error_class"] ==
                   "lease_expired" and not others_dead and delivered_rows == n - 1
                   == stream["stream_entries"] == stream["distinct_ids"] and stream["lost"] == 0
                   and stream["not_delivered_in_stream"] == 0 and max(attempts, default=0) <= 3
                   and check["invocations_killed"] == MAX_ATTEMPTS - 1)
    return {
        "messages": n, "poison_at": poison_at, "dead_holders": dead_invocations,
        "first_pass_seconds": first["wall_seconds"],
        "first_pass_vs_drain": round(first["wall_seconds"] / drain_seconds, 3) if drain_seconds else None,
        "first_pass_delivered": first["delivered"], "passes": passes, "check": check,
    }


def run_recovery(env: BenchEnv, *, n: int, batch_size: int, invocations: int, rounds: int,
                 streams: tuple[str, ...]) -> dict[str, Any]:
    """Drain and recovery of `n` by `invocations` containers at once in `rounds`
    interleaved rounds (drain, recovery; then recovery, drain; ...), then the recovery
    with a poison message among them."""
    order: list[str] = []
    for i in range(rounds):
        order += ["drain", "recovery"] if i % 2 == 0 else ["recovery", "drain"]
    fleet = Fleet(env, invocations, batch_size)
    try:
        samples: dict[str, list[dict[str, Any]]] = {"drain": [], "recovery": []}
        for kind in order:
            dead = prepare(env, n, streams, batch_size, crashed=kind == "recovery")
            reports, killed, wall = fleet.run()
            if killed:
                raise RuntimeError("a relay container died without a poison message")
            samples[kind].append(_pass_result(kind, n, reports, wall, dead, env))
        drain_seconds = statistics.median(s["wall_seconds"] for s in samples["drain"])
        recovery_seconds = statistics.median(s["wall_seconds"] for s in samples["recovery"])
        poison = _poison_pass(env, fleet, n=n, batch_size=batch_size, streams=streams,
                              drain_seconds=drain_seconds)
    finally:
        fleet.close()
    env.reset_table()
    env.clean_redis()
    return {
        "messages": n, "batch_size": batch_size, "invocations": invocations, "rounds": rounds,
        "streams": list(streams), "mode": "drain", "max_attempts": MAX_ATTEMPTS,
        "drain_seconds": round(drain_seconds, 3), "recovery_seconds": round(recovery_seconds, 3),
        "recovery_vs_drain": round(recovery_seconds / drain_seconds, 3),
        "runs": samples["drain"] + samples["recovery"], "order": order, "poison": poison,
        "check": {"ok": all(s["check"]["ok"] for s in samples["drain"] + samples["recovery"])
                  and poison["check"]["ok"]},
    }
