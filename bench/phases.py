"""Where one invocation's time goes, step by step, at one batch size.

The drain gives totals; this section splits each invocation of the real
handler into the steps it runs one after another, and gives for each the wall
time and the CPU of the relay process and of the PostgreSQL backend serving
it, in microseconds per message:

- gate:                 the `PING` before claiming;
- claim, first row:     from `LeaseStore.claim` being called (connection from
                        the pool, the statement sent in pg8000's three protocol
                        round trips: Parse, Describe and Bind, Execute) until
                        its first row arrives. PostgreSQL runs a
                        data-modifying statement to completion before it sends
                        any row (PostgreSQL's source, src/include/utils/portal.h:
                        PORTAL_ONE_RETURNING and PORTAL_ONE_MOD_WITH fill the
                        portal's tuplestore first);
- claim, the rows:      receiving and decoding the rows (pg8000), the commit,
                        SQLAlchemy's rows and the connection back to the pool,
                        until the statement returns;
- claim, messages:      building the claimed messages from the rows;
- publish:              packing the script calls, the pipeline's round trip,
                        reading the replies and turning them into outcomes
                        (`deliver`, less the outcome write it calls); Redis's
                        CPU is given for the whole run, as Redis works in
                        this step (and for the gate's `PING` and the bench's
                        own `INFO`, which are negligible);
- record:               the outcome writes (also a release after `deliver`);
- handler, the rest:    event parsing, deadline, metrics and the summary log.

Wall time is `time.perf_counter`, the relay's CPU `time.thread_time`, the
backend's CPU `/proc/<pid>/schedstat` (nanoseconds; only when PostgreSQL runs
on this host, see `env.is_local_backend`). Linux brings a running process's
figure up to date only at a scheduler tick or when it stops running, and the
backend is still running (sending rows) when the first row arrives, so the
claim's backend CPU is given for the whole statement, on its first step. At
every other mark the backend is waiting for the relay.

The hooks wrap the store's and publisher's methods and pg8000's statement
call, for this section only, and cost about 30 µs per invocation (a dozen
marks, each reading the clocks): 0.03 µs per message at batch 1,000, 3 µs at
batch 10.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from typing import Any, Callable, Iterator

import pg8000.core

from outbox_relay import store as store_module
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher

from . import lambda_model
from .drain import prepare_backlog, warm
from .env import BenchEnv, redis_cpu_seconds
from .handler import relay

STEPS = ("gate", "claim, first row", "claim, the rows", "claim, messages", "publish", "record",
         "handler, the rest")

Sample = tuple[float, float, int | None]


class BackendCpu:
    """CPU nanoseconds a local process has run, from `/proc/<pid>/schedstat`
    (its first field), read through a descriptor kept open (about 1 µs a read;
    opening the file each time costs 14)."""

    def __init__(self, pid: int | None) -> None:
        self.fd: int | None = None
        self.lost = False
        if pid is not None:
            try:
                self.fd = os.open(f"/proc/{pid}/schedstat", os.O_RDONLY)
            except OSError:
                self.fd = None

    def read(self) -> int | None:
        """The figure, or None when unknown; once a read fails (the backend's
        connection was replaced and its process is gone), `lost` stays set."""
        if self.fd is None:
            return None
        try:
            return int(os.pread(self.fd, 128, 0).split()[0])
        except (OSError, IndexError, ValueError):
            self.lost = True
            return None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Clock:
    """One invocation's marks and, for steps that may run more than once, their
    time summed. Each figure is (wall seconds, relay CPU seconds, backend CPU
    nanoseconds or None)."""

    def __init__(self, backend: BackendCpu) -> None:
        self.backend = backend
        self.marks: dict[str, Sample] = {}
        self.sums: dict[str, list[float]] = {}
        self.in_claim = False
        self.in_deliver = False

    def reset(self) -> None:
        self.marks.clear()
        self.sums.clear()

    def now(self, backend: bool = True) -> Sample:
        return time.perf_counter(), time.thread_time(), self.backend.read() if backend else None

    def mark(self, name: str, backend: bool = True) -> None:
        self.marks[name] = self.now(backend)

    def add(self, step: str, start: Sample, end: Sample) -> None:
        """Add the time from `start` to `end` (both from `now()`) to `step`."""
        total = self.sums.setdefault(step, [0.0, 0.0, 0.0])
        total[0] += end[0] - start[0]
        total[1] += end[1] - start[1]
        if start[2] is not None and end[2] is not None:
            total[2] += (end[2] - start[2]) / 1e9

    def span(self, start: str, end: str) -> tuple[float, float, float]:
        """Wall, relay CPU and backend CPU (seconds) between two marks; zeros when
        either is missing (the step did not run) and for the backend when either
        mark did not read it."""
        if start not in self.marks or end not in self.marks:
            return 0.0, 0.0, 0.0
        w0, c0, p0 = self.marks[start]
        w1, c1, p1 = self.marks[end]
        return w1 - w0, c1 - c0, (p1 - p0) / 1e9 if p0 is not None and p1 is not None else 0.0

    def summed(self, step: str) -> tuple[float, float, float]:
        return tuple(self.sums.get(step, (0.0, 0.0, 0.0)))  # type: ignore[return-value]


@contextlib.contextmanager
def _patched(target: Any, name: str, make: Callable[[Callable], Callable]) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, make(original))
    try:
        yield
    finally:
        setattr(target, name, original)


@contextlib.contextmanager
def _hooks(clock: _Clock) -> Iterator[None]:
    """Marks at every step boundary, for as long as the block runs."""

    def timed(step: str) -> Callable[[Callable], Callable]:
        # Summed, not marked: the outcome write runs again when the relay
        # releases what was not recorded (after `deliver`, outside it).
        def make(f: Callable) -> Callable:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                start = clock.now()
                inside = clock.in_deliver
                if step == "deliver":
                    clock.in_deliver = True
                try:
                    return f(*args, **kwargs)
                finally:
                    if step == "deliver":
                        clock.in_deliver = False
                    end = clock.now()
                    clock.add(step, start, end)
                    if step == "record" and inside:
                        clock.add("record in deliver", start, end)
            return wrapper
        return make

    def claim(f: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            clock.mark("claim")
            clock.in_claim = True
            try:
                return f(*args, **kwargs)
            finally:
                clock.in_claim = False
                clock.mark("claim end")
        return wrapper

    def statement(f: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return f(*args, **kwargs)
            finally:
                if clock.in_claim:
                    clock.mark("claim rows end")
        return wrapper

    def first_row(f: Callable) -> Callable:
        # pg8000 dispatches each message through a per-connection table of bound
        # methods, so the row handler is swapped on the connection, for the
        # claim only, and puts itself back at the first row (no cost per row).
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not clock.in_claim:
                return f(self, *args, **kwargs)
            table = self.message_types
            original = table[pg8000.core.DATA_ROW]

            def first(data: Any, context: Any) -> Any:
                clock.mark("claim first row", backend=False)  # the backend is busy: its figure is stale
                table[pg8000.core.DATA_ROW] = original
                return original(data, context)

            table[pg8000.core.DATA_ROW] = first
            try:
                return f(self, *args, **kwargs)
            finally:
                table[pg8000.core.DATA_ROW] = original
        return wrapper

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(store_module.LeaseStore, "claim", claim))
        stack.enter_context(_patched(store_module, "run_with_retry", statement))
        stack.enter_context(_patched(pg8000.core.CoreConnection, "execute_unnamed", first_row))
        stack.enter_context(_patched(store_module.LeaseStore, "record", timed("record")))
        stack.enter_context(_patched(RedisStreamsPublisher, "gate", timed("gate")))
        stack.enter_context(_patched(RedisStreamsPublisher, "deliver", timed("deliver")))
        yield


def _steps(clock: _Clock) -> dict[str, tuple[float, float, float]]:
    """One invocation's steps (seconds: wall, relay CPU, backend CPU); they add up
    to the invocation's wall time."""
    m = clock.marks
    if "claim first row" not in m and "claim rows end" in m:  # no row came back
        m["claim first row"] = m["claim rows end"]
    server, rows = clock.span("claim", "claim first row"), clock.span("claim first row", "claim rows end")
    statement_backend = clock.span("claim", "claim rows end")[2]
    deliver, inside = clock.summed("deliver"), clock.summed("record in deliver")
    steps = {
        "gate": clock.summed("gate"),
        "claim, first row": (server[0], server[1], statement_backend),
        "claim, the rows": (rows[0], rows[1], 0.0),
        "claim, messages": clock.span("claim rows end", "claim end"),
        "publish": tuple(d - i for d, i in zip(deliver, inside)),
        "record": clock.summed("record"),
    }
    accounted = [sum(v[i] for v in steps.values()) for i in range(3)]
    steps["handler, the rest"] = tuple(w - a for w, a in zip(clock.span("invoke", "invoke end"), accounted))
    return steps  # type: ignore[return-value]


def run_phases(env: BenchEnv, *, n: int, batch_size: int, streams: tuple[str, ...]) -> dict[str, Any]:
    """Drain `n` messages at `batch_size` with the step hooks; figures per message."""
    totals = {step: [0.0, 0.0, 0.0] for step in STEPS}
    first_row_ms: list[float] = []
    rows_ms: list[float] = []
    delivered = invocations = 0
    with relay(env, batch_size) as r:
        prepare_backlog(env, n, streams)
        warm(r)
        pids = env.backend_pids()
        backend = BackendCpu(pids[0] if len(pids) == 1 else None)
        pg_known = backend.read() is not None
        clock = _Clock(backend)
        redis0 = redis_cpu_seconds(env.redis)
        started = time.perf_counter()
        try:
            with lambda_model.holding(), _hooks(clock):
                while True:
                    clock.reset()
                    clock.mark("invoke")
                    result = r.invoke()
                    clock.mark("invoke end")
                    if result["claimed"] == 0:
                        break
                    invocations += 1
                    delivered += result["delivered"]
                    for step, values in _steps(clock).items():
                        for i, v in enumerate(values):
                            totals[step][i] += v
                    m = clock.marks
                    if result["claimed"] == batch_size and "claim" in m and "claim rows end" in m:
                        first_row_ms.append((m["claim first row"][0] - m["claim"][0]) * 1e3)
                        rows_ms.append((m["claim rows end"][0] - m["claim first row"][0]) * 1e3)
        finally:
            pg_known = pg_known and not backend.lost
            backend.close()
        wall = time.perf_counter() - started
        redis1 = redis_cpu_seconds(env.redis)
        counts = env.counts()

    def per_message(seconds: float) -> float | None:
        return round(seconds / delivered * 1e6, 1) + 0.0 if delivered else None  # + 0.0: no "-0.0"

    steps = [{"step": step, "wall_us": per_message(t[0]), "relay_cpu_us": per_message(t[1]),
              "postgresql_cpu_us": (per_message(t[2]) if pg_known and step != "claim, the rows" else None)}
             for step, t in totals.items()]
    return {
        "batch_size": batch_size,
        "messages": n,
        "invocations": invocations,
        "messages_per_second": round(delivered / wall, 1) if wall else None,
        "steps": steps,
        "sum_wall_us": per_message(sum(t[0] for t in totals.values())),
        "redis_cpu_us": (per_message(redis1 - redis0) if redis0 is not None and redis1 is not None else None),
        # over the claims of a full batch only (None when no claim was full)
        "claim_first_row_ms_median": round(statistics.median(first_row_ms), 2) if first_row_ms else None,
        "claim_rows_ms_median": round(statistics.median(rows_ms), 2) if rows_ms else None,
        "check": {"delivered": delivered, "rows_delivered": counts.get("delivered", 0),
                  "ok": delivered == n == counts.get("delivered", 0)},
    }
