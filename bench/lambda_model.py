"""AWS's scheduler and Lambda, as the latency bench models them.

- `SchedulerModel`: a slot every `period` seconds (the template's `rate(1 minute)`
  by default); each scheduled start happens uniformly at random within
  `start_jitter` seconds after its slot, a share `missed_runs` of the slots never
  starts, and every invocation waits `cold_start` seconds before its handler runs,
  counted against its timeout.
- `LocalLambda`: a pool of warm containers (processes, each running one
  invocation at a time) behind the function's reserved concurrency, started by
  asynchronous invokes. An invoke that finds the reserved concurrency reached is
  throttled and retried as Lambda retries an asynchronous event (after 1 s, then
  doubling) while the event is younger than its maximum age, then dropped.
- `InvokeApi`: an HTTP stand-in for the Lambda Invoke API on loopback, so that a
  poller's self-invoke goes through boto3 as on AWS (`AWS_ENDPOINT_URL_LAMBDA`).
- `LambdaCpu`: the CPU Lambda gives a function in proportion to its memory (one
  vCPU at 1,769 MB), imposed on every process that runs invocations, each in a
  cgroup (v1 `cpu` controller) of its own (`start`, `release`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import unquote, urlsplit

#: The template's EventInvokeConfig of the relay functions: an event that could not
#: start within this age is dropped (retries of a throttled invoke stop there).
MAX_EVENT_AGE_SECONDS = 60.0
#: The function name the containers run as (AWS_LAMBDA_FUNCTION_NAME).
FUNCTION_NAME = "outbox-relay-bench"
SCHEDULE_ARN = f"arn:aws:scheduler:us-east-1:000000000000:schedule/default/{FUNCTION_NAME}"


@dataclass(frozen=True)
class SchedulerModel:
    """How invocations are started, and the function's timing settings."""

    period: float = 60.0
    start_jitter: float = 0.0
    missed_runs: float = 0.0
    cold_start: float = 0.0
    reserved_concurrency: int = 3
    timeout: float = 150.0
    lease: float = 180.0
    margin: float = 5.0
    seed: int | None = None

    @property
    def punctual(self) -> bool:
        return not (self.start_jitter or self.missed_runs or self.cold_start)

    @property
    def key(self) -> str:
        """What identifies the model in the results file: a run replaces the runs of its model."""
        if self.punctual:
            return "punctual"
        return f"jitter {self.start_jitter:g} s, missed {self.missed_runs:g}, cold start {self.cold_start:g} s"

    def label(self) -> str:
        if self.punctual:
            return f"punctual: each run starts on its slot, every {self.period:g} s"
        parts = []
        if self.start_jitter:
            parts.append(f"starts uniform within {self.start_jitter:g} s after their slot")
        if self.missed_runs:
            parts.append(f"{self.missed_runs:.0%} of the runs missed")
        if self.cold_start:
            parts.append(f"{self.cold_start:g} s cold starts")
        return f"a slot every {self.period:g} s, " + ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"key": self.key, "label": self.label()}


@dataclass
class Slot:
    """One scheduled run: its slot and the time it starts (seconds after the first slot)."""

    index: int
    at: float
    start: float
    missed: bool


def plan_slots(model: SchedulerModel, rng: random.Random, *, measured_for: float, horizon: float) -> list[Slot]:
    """The schedule's runs in order of start, up to `horizon` seconds after the first slot.

    The first slot starts the run and is never missed. Of the slots after it within
    `measured_for` seconds of the first start, exactly the share `missed_runs`
    (rounded) is missed, chosen at random, so that runs of a few slots compare;
    later slots are missed each with that probability."""
    slots = []
    k = 0
    while k * model.period <= horizon:
        offset = rng.uniform(0.0, model.start_jitter) if model.start_jitter else 0.0
        slots.append(Slot(k, k * model.period, k * model.period + offset, False))
        k += 1
    until = slots[0].start + measured_for
    measured = [s for s in slots[1:] if s.at < until]
    for s in rng.sample(measured, int(model.missed_runs * len(measured) + 0.5)):
        s.missed = True
    for s in slots[1 + len(measured):]:
        s.missed = rng.random() < model.missed_runs
    return sorted(slots, key=lambda s: s.start)


def schedule_event(slot_time: float) -> dict[str, Any]:
    """The event EventBridge Scheduler sends (the template's Input) for a slot at `slot_time` (epoch)."""
    return {"source": "outbox.scheduler", "channel": "redis",
            "scheduledTime": datetime.fromtimestamp(slot_time, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "scheduleArn": SCHEDULE_ARN, "executionId": str(uuid.uuid4())}


@dataclass
class Invocation:
    """One invocation as the bench saw it (epoch seconds)."""

    id: int
    source: str  # "schedule" | "self-invoke"
    slot: int | None
    accepted_at: float
    requested_at: float | None = None  # handed to a container (after throttles)
    container: int | None = None
    began: float | None = None  # the handler started (after the cold start)
    ended: float | None = None
    throttles: int = 0
    dropped: bool = False
    predecessor: str | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None
    event: dict[str, Any] = field(default_factory=dict, repr=False)


class LocalLambda:
    """The function as Lambda runs it: `containers` warm processes fed through
    their command queues, at most `reserved` invocations at once, asynchronous
    invokes throttled and retried while younger than `max_event_age`.

    `on_message` takes the containers' reports ("begin", "end")."""

    def __init__(self, commands: list[Any], *, timeout: float, cold_start: float, reserved: int,
                 max_event_age: float = MAX_EVENT_AGE_SECONDS) -> None:
        self.commands = commands
        self.timeout, self.cold_start, self.reserved = timeout, cold_start, reserved
        self.max_event_age = max_event_age
        self.lock = threading.Lock()
        self.free = list(range(len(commands)))
        self.running: dict[int, int] = {}
        self.invocations: list[Invocation] = []
        self.refused = 0  # requests the Invoke API answered 400
        self.closed = False
        self._timers: list[threading.Timer] = []
        self.first_began = threading.Event()

    def invoke_async(self, event: dict[str, Any], source: str, slot: int | None = None) -> Invocation:
        """Accept an asynchronous invoke (202) and try to start it now."""
        with self.lock:
            inv = Invocation(len(self.invocations), source, slot, time.time(), event=event,
                             predecessor=event.get("predecessor"))
            self.invocations.append(inv)
        self._attempt(inv, 1.0)
        return inv

    def _attempt(self, inv: Invocation, retry_after: float) -> None:
        with self.lock:
            if self.closed:
                return
            if len(self.running) >= self.reserved or not self.free:
                inv.throttles += 1
                if time.time() + retry_after - inv.accepted_at > self.max_event_age:
                    inv.dropped = True
                    return
                timer = threading.Timer(retry_after, self._attempt, args=(inv, retry_after * 2))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()
                return
            container = self.free.pop(0)
            self.running[inv.id] = container
            inv.container, inv.requested_at = container, time.time()
            self.commands[container].put({"id": inv.id, "event": inv.event, "requested_mono": time.monotonic(),
                                          "timeout": self.timeout, "cold_start": self.cold_start})

    def on_message(self, message: dict[str, Any]) -> None:
        with self.lock:
            inv = self.invocations[message["id"]]
            if message["kind"] == "begin":
                inv.began = message["at"]
                self.first_began.set()
                return
            inv.ended, inv.summary, inv.error = message["at"], message.get("summary"), message.get("error")
            container = self.running.pop(inv.id, None)
            if container is not None:
                self.free.append(container)

    def close(self) -> None:
        """Start nothing more (pending retries are cancelled)."""
        with self.lock:
            self.closed = True
            timers, self._timers = self._timers, []
        for t in timers:
            t.cancel()


_INVOKE_PATH = re.compile(r"/2015-03-31/functions/([^/]+)/invocations")


class InvokeApi:
    """The Lambda Invoke API on loopback: `POST /2015-03-31/functions/{name}/invocations`
    with `X-Amz-Invocation-Type: Event` for this function is accepted (202, empty
    body) and handed to `invoke(event)`; anything else is answered 400."""

    def __init__(self, invoke: Callable[[dict[str, Any]], Any], refused: Callable[[], None],
                 function_name: str = FUNCTION_NAME) -> None:

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                match = _INVOKE_PATH.fullmatch(urlsplit(self.path).path)
                name = unquote(match[1]) if match else None
                if name is not None and (name == function_name or name.endswith(f":function:{function_name}")) \
                        and self.headers.get("X-Amz-Invocation-Type") == "Event":
                    try:
                        event = json.loads(body or b"{}")
                    except ValueError:
                        event = None
                    if isinstance(event, dict):
                        # Queued before the 202, as Lambda does: a caller that sees the answer finds it queued.
                        invoke(event)
                        self._answer(202, b"")
                        return
                self._refuse()

            def _refuse(self) -> None:
                refused()
                self._answer(400, json.dumps({"Type": "User", "message": "not an asynchronous invoke of "
                                              f"{function_name}"}).encode(), "application/json")

            def _answer(self, status: int, body: bytes, content_type: str | None = None) -> None:
                self.send_response(status)
                self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
                if content_type:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _other(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self._refuse()

            do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = _other  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="bench-invoke-api", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def aws_environment(endpoint_url: str) -> dict[str, str | None]:
    """What a container's environment holds of AWS: the function's name, the Invoke
    API stand-in, a region and credentials that sign requests to it only."""
    return {"AWS_LAMBDA_FUNCTION_NAME": FUNCTION_NAME, "AWS_ENDPOINT_URL_LAMBDA": endpoint_url,
            "AWS_ENDPOINT_URL": None, "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_SESSION_TOKEN": None,
            "AWS_PROFILE": None, "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true"}


def uncovered(intervals: list[tuple[float, float]], lo: float, hi: float) -> tuple[float, float, int]:
    """Seconds of [lo, hi] outside the union of `intervals`, the longest such
    stretch, and how many stretches of a second or more there are."""
    spans = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi and b > a)
    gaps = []
    at = lo
    for a, b in spans:
        if a > at:
            gaps.append(a - at)
        at = max(at, b)
    if hi > at:
        gaps.append(hi - at)
    return sum(gaps), max(gaps, default=0.0), sum(1 for g in gaps if g >= 1.0)


def covered_seconds(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """The sum of the lengths of `intervals` clipped to [lo, hi] (overlaps counted twice)."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


# --- Lambda's CPU ----------------------------------------------------------

#: AWS documents that a function at 1,769 MB has the equivalent of one vCPU; CPU is
#: allocated in proportion to memory below and above it.
MB_PER_VCPU = 1769
#: Where this machine mounts the cgroup v1 `cpu` controller.
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 100_000
TEMPLATE = Path(__file__).resolve().parent.parent / "template.yaml"


def cpu_share(memory_mb: float, cores: int | None = None) -> float:
    """Cores Lambda gives a function of `memory_mb`, at most the machine's `cores`."""
    return min(memory_mb / MB_PER_VCPU, cores or os.cpu_count() or 1)


def template_function_memory_mb(path: Path = TEMPLATE) -> int:
    """The template's `FunctionMemoryMB` default, read from its Parameters block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    at = lines.index("  FunctionMemoryMB:")
    for line in lines[at + 1:]:
        if not line.startswith("    "):
            break
        if line.strip().startswith("Default:"):
            return int(line.split(":", 1)[1])
    raise ValueError(f"{path.name} declares no default for FunctionMemoryMB")


class CpuCapError(RuntimeError):
    """The machine cannot hold processes to a CPU share (one line, for the user)."""


def process_age_seconds(pid: int | str = "self") -> float:
    """Seconds since process `pid` was created (its fork), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start / ticks


class LambdaCpu:
    """Lambda's CPU share at `memory_mb`, imposed on the processes that run invocations.

    `start(process)` starts a `multiprocessing.Process` (or anything with `start()`)
    inside a fresh cgroup whose CFS quota is the share: the starting thread enters the
    cgroup for the fork, so the child is held from its first instruction (its cold
    start included) and the bench's other threads never are. `release(process)`, once
    the process has ended, reads the cgroup's throttling and removes it. With
    `capped=False` processes start as they are and the figures are labelled uncapped."""

    def __init__(self, memory_mb: int, *, capped: bool = True, root: Path = CGROUP_CPU) -> None:
        self.memory_mb, self.capped, self.root = memory_mb, capped, root
        self.share = cpu_share(memory_mb)
        self._names = itertools.count()
        self._groups: dict[int, Path] = {}
        self._lock = threading.Lock()
        self._stats = {"cgroups": 0, "periods": 0, "throttled_periods": 0, "throttled_seconds": 0.0}
        if capped:
            self._check()

    @property
    def quota_us(self) -> int:
        return round(self.share * CFS_PERIOD_US)

    def label(self) -> str:
        held = f"Lambda's CPU at {self.memory_mb:,} MB ({self.share:.2f} of a core)"
        return f"held to {held}" if self.capped else f"uncapped (not held to {held})"

    def _check(self) -> None:
        try:
            group = self._group()
            group.rmdir()
        except OSError as exc:
            raise CpuCapError(f"cannot hold invocations to Lambda's CPU: {self.root} is not a writable cgroup v1 "
                              f"cpu controller ({exc.strerror or exc}); run as root, or pass --uncapped") from None

    def _group(self) -> Path:
        group = self.root / f"outbox-bench-{os.getpid()}-{next(self._names)}"
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(self.quota_us))
        return group

    def start(self, process: Any) -> None:
        if not self.capped:
            process.start()
            return
        import multiprocessing.resource_tracker

        # Started outside the cgroup, so that it is not the one held.
        multiprocessing.resource_tracker.ensure_running()
        group = self._group()
        tid = str(threading.get_native_id())
        home = _thread_cpu_cgroup(self.root)
        (group / "tasks").write_text(tid)  # cgroup v1 moves this thread alone
        try:
            process.start()
        finally:
            (home / "tasks").write_text(tid)
        with self._lock:
            self._groups[process.pid] = group

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """The bench's own process, every thread of it, held while the block runs: for the
        sections whose handler (and minimal loop) run in this process, around their timed part."""
        if not self.capped:
            yield
            return
        group, pid = self._group(), str(os.getpid())
        home = _thread_cpu_cgroup(self.root)
        (group / "cgroup.procs").write_text(pid)
        try:
            yield
        finally:
            (home / "cgroup.procs").write_text(pid)
            self._remove(group)

    def release(self, process: Any) -> None:
        """Once `process` has ended: its throttling counted, its cgroup removed."""
        with self._lock:
            group = self._groups.pop(getattr(process, "pid", None), None)
        if group is not None:
            self._remove(group)

    def _remove(self, group: Path) -> None:
        stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines() if line.strip())
        with self._lock:
            self._stats["cgroups"] += 1
            self._stats["periods"] += int(stat.get("nr_periods", 0))
            self._stats["throttled_periods"] += int(stat.get("nr_throttled", 0))
            self._stats["throttled_seconds"] += int(stat.get("throttled_time", 0)) / 1e9
        for _ in range(50):  # a process that just exited may still be leaving its cgroup
            try:
                group.rmdir()
                return
            except OSError:
                time.sleep(0.1)

    def record(self) -> dict[str, Any]:
        """What a section's results say of the CPU (and the counts start again)."""
        with self._lock:
            stats, self._stats = self._stats, {k: type(v)() for k, v in self._stats.items()}
        out = {"function_memory_mb": self.memory_mb, "share": round(self.share, 3), "capped": self.capped,
               "label": self.label()}
        if self.capped:
            out |= stats | {"throttled_seconds": round(stats["throttled_seconds"], 3)}
        return out


def _thread_cpu_cgroup(root: Path) -> Path:
    """The cgroup of the `cpu` controller the calling thread is in."""
    for line in Path("/proc/thread-self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return root / path.lstrip("/")
    return root


#: The CPU every section holds its invocation processes to (`python -m bench` sets it).
CPU = LambdaCpu(template_function_memory_mb(), capped=False)


def use(cpu: LambdaCpu) -> None:
    global CPU
    CPU = cpu


def start(process: Any) -> None:
    """Start a process that runs invocations (or the minimal loop) under the bench's CPU."""
    CPU.start(process)


def release(process: Any) -> None:
    CPU.release(process)


def holding() -> contextlib.AbstractContextManager[None]:
    """The bench's process held to the bench's CPU for a block (`LambdaCpu.holding`)."""
    return CPU.holding()
