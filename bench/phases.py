"""Where one invocation's time goes, step by step, at one batch size.

The drain gives totals; this section splits each invocation of the real
handler into the steps it runs one after another, and gives for each the wall
time and the CPU of the relay process and of the PostgreSQL backend serving
it, in microseconds per message:

- gate:               the `PING` before claiming;
- claim, server:      from sending the claim until its first row arrives.
                      PostgreSQL runs a data-modifying statement to
                      completion before it sends any row (PostgreSQL source,
                      src/include/utils/portal.h: PORTAL_ONE_RETURNING and
                      PORTAL_ONE_MOD_WITH fill the portal's tuplestore first);
- claim, rows:        receiving and decoding the rows (pg8000), and the commit;
- claim, messages:    building the claimed messages from the rows;
- publish:            packing the script calls and the pipeline's round trip
                      (Redis's CPU is given for the whole run: Redis works
                      only in this step);
- record:             the outcome write;
- handler, the rest:  event parsing, deadline, metrics and the summary log.

Wall time is `time.perf_counter`, the relay's CPU `time.thread_time`, the
backend's CPU `/proc/<pid>/schedstat` (nanoseconds; only when PostgreSQL runs
on this host). The hooks wrap the store's and publisher's methods and
pg8000's statement call, for this section only; they cost a few
microseconds per invocation (reading /proc at each mark), not per message.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterator

import pg8000.core
from outbox_relay import store as store_module
from outbox_relay.publishers.redis_streams import RedisStreamsPublisher

from .drain import prepare_backlog, warm
from .env import BenchEnv, is_local_postgres, redis_cpu_seconds
from .handler import relay

STEPS = ("gate", "claim, server", "claim, rows", "claim, messages", "publish", "record", "handler, the rest")


def backend_cpu_ns(pid: int | None) -> int | None:
    """CPU nanoseconds a local process has run (`/proc/<pid>/schedstat`, first field); None when unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None


class _Clock:
    """One invocation's marks (wall seconds, relay CPU seconds, backend CPU ns or
    None) and the time summed per step for steps that may run more than once."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.marks: dict[str, tuple[float, float, int | None]] = {}
        self.sums: dict[str, list[float]] = {}
        self.in_claim = False
        self.in_deliver = False

    def reset(self) -> None:
        self.marks.clear()
        self.sums.clear()

    def now(self) -> tuple[float, float, int | None]:
        return time.perf_counter(), time.thread_time(), backend_cpu_ns(self.pid)

    def mark(self, name: str) -> None:
        self.marks[name] = self.now()

    def add(self, step: str, start: tuple[float, float, int | None]) -> None:
        """Add the time since `start` (from `now()`) to `step`."""
        end = self.now()
        total = self.sums.setdefault(step, [0.0, 0.0, 0.0])
        total[0] += end[0] - start[0]
        total[1] += end[1] - start[1]
        if start[2] is not None and end[2] is not None:
            total[2] += (end[2] - start[2]) / 1e9

    def span(self, start: str, end: str) -> tuple[float, float, float]:
        """Wall, relay CPU and backend CPU (seconds) between two marks; zeros when
        either is missing (the step did not run)."""
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
                    clock.add(step, start)
                    if step == "record" and inside:
                        clock.add("record in deliver", start)
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
                clock.mark("claim first row")
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
        clock = _Clock(pids[0] if len(pids) == 1 and is_local_postgres(pids[0]) else None)
        pg_known = clock.pid is not None and backend_cpu_ns(clock.pid) is not None
        redis0 = redis_cpu_seconds(env.redis)
        started = time.perf_counter()
        with _hooks(clock):
            while True:
                clock.reset()
                clock.mark("invoke")
                result = r.invoke()
                clock.mark("invoke end")
                if result["claimed"] == 0:
                    break
                invocations += 1
                delivered += result["delivered"]
                m = clock.marks
                if "claim first row" not in m and "claim rows end" in m:  # no row came back
                    m["claim first row"] = m["claim rows end"]
                deliver, record = clock.summed("deliver"), clock.summed("record")
                inside = clock.summed("record in deliver")
                spans = {
                    "gate": clock.summed("gate"),
                    "claim, server": clock.span("claim", "claim first row"),
                    "claim, rows": clock.span("claim first row", "claim rows end"),
                    "claim, messages": clock.span("claim rows end", "claim end"),
                    "publish": tuple(d - i for d, i in zip(deliver, inside)),
                    "record": record,
                }
                accounted = [sum(v[i] for v in spans.values()) for i in range(3)]
                spans["handler, the rest"] = tuple(w - a for w, a in zip(clock.span("invoke", "invoke end"), accounted))
                for step, values in spans.items():
                    for i, v in enumerate(values):
                        totals[step][i] += v
                if "claim" in m and "claim rows end" in m:
                    first_row_ms.append((m["claim first row"][0] - m["claim"][0]) * 1e3)
                    rows_ms.append((m["claim rows end"][0] - m["claim first row"][0]) * 1e3)
        wall = time.perf_counter() - started
        redis1 = redis_cpu_seconds(env.redis)
        counts = env.counts()

    def per_message(seconds: float) -> float | None:
        return round(seconds / delivered * 1e6, 1) if delivered else None

    steps = [{"step": step, "wall_us": per_message(t[0]), "relay_cpu_us": per_message(t[1]),
              "postgresql_cpu_us": per_message(t[2]) if pg_known else None} for step, t in totals.items()]
    return {
        "batch_size": batch_size,
        "messages": n,
        "invocations": invocations,
        "messages_per_second": round(delivered / wall, 1) if wall else None,
        "steps": steps,
        "sum_wall_us": per_message(sum(t[0] for t in totals.values())),
        "redis_cpu_us": (per_message(redis1 - redis0) if redis0 is not None and redis1 is not None else None),
        "claim_first_row_ms_median": round(statistics.median(first_row_ms), 2) if first_row_ms else None,
        "claim_rows_ms_median": round(statistics.median(rows_ms), 2) if rows_ms else None,
        "check": {"delivered": delivered, "rows_delivered": counts.get("delivered", 0),
                  "ok": delivered == n == counts.get("delivered", 0)},
    }
