"""Latency mode's poller handover (docs/design.md, "The poller handover"): each poller registers,
renews from a heartbeat, leaves for a newer poller of its slot, takes over dead ones' leases and
starts its own successor near its deadline, so a slot costs about one poller at a time. Times
that are compared live in PostgreSQL, on its clock; this process keeps only durations."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from sqlalchemy import Engine

from . import observability as obs
from . import sql
from .db import retry_while_unreachable, run_with_retry
from .publishers.base import Deadline
from .publishers.registry import Channel
from .store import Part

#: Heartbeats per registration time-to-live: a renewal that fails now and then
#: (a slow statement, a dropped connection) does not let the registration expire.
BEATS_PER_TTL = 5
#: At most one poller is added per channel this often: the added one's work shows
#: in the backlog's age before another is asked for.
ADD_COOLDOWN_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Pollers:
    """OUTBOX_POLLERS, up to OUTBOX_POLLERS_MAX while the oldest due message is older than `add_age_seconds`."""

    count: int = 1
    max: int = 1
    add_age_seconds: float = 1.0


@dataclass(frozen=True, slots=True)
class Renewal:
    registered: bool = True
    newer: int = 0
    others: int = 0
    older_unaware: int = 0
    expired: int = 0
    at: str | None = None  # the database's now(), the reference of `older_unaware`
    backlog_age: float = 0.0
    part: int = 0  # its slot's place among the live slots, and their count
    parts: int = 1


class Registry(Protocol):
    """The registry statements a poller runs (tests pass a model of them)."""

    def register(self, owner: str, deadline_seconds: float, slot: int | None) -> tuple[float | None, int, int]: ...

    def renew(self, owner: str, aware_after: str | None) -> Renewal: ...

    def take_over(self) -> tuple[int, int]: ...

    def request_successor(self, owner: str, lead_seconds: float) -> bool: ...

    def add(self, owner: str, max_slots: int, lead_seconds: float) -> int | None: ...

    def leave(self, owner: str) -> None: ...


class PollerRegistry:
    """`Registry` on PostgreSQL: one statement each (`sql/relay.sql`)."""

    def __init__(self, engine: Engine, channel: Channel, ttl_seconds: float, slots: int = 1) -> None:
        self.engine, self.channel, self.ttl_seconds = engine, Channel(channel), float(ttl_seconds)
        self.slots = int(slots)

    def _params(self, **more: Any) -> dict[str, Any]:
        return {"channel": self.channel.value, "ttl_seconds": self.ttl_seconds, **more}

    def register(self, owner: str, deadline_seconds: float, slot: int | None = None) -> tuple[float | None, int, int]:
        gap, live, slot = run_with_retry(self.engine, lambda c: c.execute(sql.relay.register_poller, self._params(
            owner=owner, deadline_seconds=float(deadline_seconds), slot=slot, slots=self.slots)).one())
        return (None if gap is None else float(gap)), int(live), int(slot)

    def renew(self, owner: str, aware_after: str | None) -> Renewal:
        at, registered, newer, others, unaware, expired, age, part, parts = run_with_retry(
            self.engine, lambda c: c.execute(sql.relay.renew_poller,
                                             self._params(owner=owner, aware_after=aware_after)).one())
        return Renewal(bool(registered), int(newer), int(others), int(unaware), int(expired), at, float(age or 0),
                       int(part), int(parts))

    def take_over(self) -> tuple[int, int]:
        pollers, messages = run_with_retry(self.engine, lambda c: c.execute(
            sql.relay.take_over_pollers, {"channel": self.channel.value}).one())
        return int(pollers), int(messages)

    def request_successor(self, owner: str, lead_seconds: float) -> bool:
        return run_with_retry(self.engine, lambda c: c.execute(
            sql.relay.request_successor, {"owner": owner, "lead_seconds": float(lead_seconds)}).first()) is not None

    def add(self, owner: str, max_slots: int, lead_seconds: float) -> int | None:
        return run_with_retry(self.engine, lambda c: c.execute(sql.relay.add_poller, self._params(
            owner=owner, max_slots=int(max_slots), lead_seconds=float(lead_seconds),
            cooldown_seconds=ADD_COOLDOWN_SECONDS)).scalar())

    def leave(self, owner: str) -> None:
        run_with_retry(self.engine, lambda c: c.execute(sql.relay.leave_poller, {"owner": owner}))


#: Starts the successor: called with the event to invoke it with; raises on failure.
StartSuccessor = Callable[[dict[str, Any]], None]


class Handover:
    """One poller's side of the handover: `start()`, `beat()` from a `HeartbeatThread`, `finish()`.
    `rate_shared` (SES): no claim while older pollers may not know of it, paced at its share.
    `background=False` (tests on a fake clock) starts the successor in the heartbeat's call."""

    def __init__(self, registry: Registry, owner: str, channel: Channel, deadline: Deadline, *,
                 lead_seconds: float, start_successor: StartSuccessor | None, rate_shared: bool = False,
                 background: bool = True, slot: int | None = None, pollers: Pollers = Pollers()) -> None:
        self.registry, self.owner, self.channel, self.outer = registry, owner, Channel(channel), deadline
        self.lead_seconds, self.start_successor = float(lead_seconds), start_successor
        self.rate_shared, self.background, self.slot, self.pollers = rate_shared, background, slot, pollers
        self.leaving = self.shed = self.registered = False
        self._age, self._claims, self._found, self._window = 0.0, 0, 0, (0, 0)
        self.others = self.older_unaware = self.taken_over = 0
        self.gap_seconds: float | None = None
        self.successor: str | None = None  # requested | not_started | refused | not_needed
        self._aware_after: str | None = None
        self.part: Part | None = None  # the keys this poller claims first (decision 0070)
        self._started_left = deadline.seconds_left()
        self._starting: threading.Thread | None = None
        self._metrics: list[tuple[str, float]] = []
        self._lock = threading.Lock()  # one successor request at a time
        self._metrics_lock = threading.Lock()  # apart: a request may wait on the database

    def deadline(self) -> Deadline:
        """Passed at once when this poller leaves: nothing new starts, what is in flight is recorded."""
        outer = self.outer
        return Deadline(lambda: 0 if self.leaving else outer.remaining_ms(), outer.margin_seconds)

    def may_claim(self) -> bool:
        return not (self.rate_shared and self.older_unaware)

    def claim_part(self) -> Part | None:
        return self.part

    def rate_share(self) -> float:
        return 1.0 / (1 + self.others)

    def start(self, sleep: Callable[[float], Any] = time.sleep) -> None:
        """Register (retried while PostgreSQL is unreachable), then renew: the reference for older pollers."""
        def register() -> tuple[float | None, int, int]:
            self._started_left = self.outer.seconds_left()
            return self.registry.register(self.owner, self._started_left, self.slot)

        self.gap_seconds, self.others, self.slot = retry_while_unreachable(
            register, time_left=self.outer.seconds_left, sleep=sleep)
        self.registered = True
        self._metric(obs.POLLERS, 1 + self.others)
        self.older_unaware = self.others
        if self.gap_seconds is not None:
            self._metric(obs.SECONDS_WITHOUT_POLLER, self.gap_seconds)
        self.beat()

    def beat(self) -> None:
        """Renew and act on what it read; errors are logged: the next heartbeat tries again."""
        try:
            renewal = self.registry.renew(self.owner, self._aware_after)
            unaware = renewal.older_unaware
            if self._aware_after is None:
                # The reference: an older poller that renews after it has seen this registration.
                self._aware_after, unaware = renewal.at, renewal.others
            if renewal.others != self.others:
                self._metric(obs.POLLERS, 1 + renewal.others)
            self.others, self.older_unaware, self._age = renewal.others, unaware, renewal.backlog_age
            self.part = (renewal.part, renewal.parts) if renewal.parts > 1 else None
            if not renewal.registered and not self.leaving:
                # Another poller found it expired and took its leases over: this one counts as dead.
                self.leaving = True
                obs.logger.warning("registration taken over by another poller; stopping",
                                   extra={"lease_owner": self.owner})
                return
            if renewal.newer and not self.leaving:
                self.leaving = True
                obs.logger.info("handing over: a newer poller is polling", extra={"lease_owner": self.owner})
            if renewal.expired:
                pollers, messages = self.registry.take_over()
                if pollers:
                    self.taken_over += messages
                    self._metric(obs.LEASES_TAKEN_OVER, messages)
                    obs.logger.warning("took over the leases of pollers whose registration expired",
                                       extra={"pollers": pollers, "messages": messages})
            if not self.leaving and self.pollers.max > self.pollers.count:
                self.scale()
            if not self.leaving and self.outer.seconds_left() <= self.lead_seconds:
                self.hand_over("deadline", background=True)
        except Exception as exc:
            obs.logger.warning("poller heartbeat failed", extra={"error_type": type(exc).__name__})

    def observe(self, summary: Any) -> None:
        self._claims, self._found = summary.polls, summary.batches

    def backlog_old(self) -> bool:
        return self._age > self.pollers.add_age_seconds

    def scale(self) -> None:
        """While the backlog is old, add a poller; else an added one that found nothing in half its claims leaves."""
        claims, found = self._claims - self._window[0], self._found - self._window[1]
        self._window = (self._claims, self._found)
        if self.backlog_old():
            slot = self.registry.add(self.owner, self.pollers.max, self.lead_seconds)
            if slot is not None:
                self._invoke("backlog", slot, background=True)
        elif self.slot is not None and self.slot >= self.pollers.count and claims >= 2 and found * 2 <= claims:
            self.leaving = self.shed = True
            obs.logger.info("leaving: an added poller that finds nothing to do", extra={"slot": self.slot})

    def hand_over(self, reason: str, *, background: bool = False) -> None:
        """Start a successor once, unless a newer poller is live or an added slot is not needed.
        `background`: on a thread of its own (a slow invoke must not hold up the heartbeat)."""
        with self._lock:
            if self.successor is not None or self.start_successor is None or not self.registered:
                return
            if self.slot is not None and self.slot >= self.pollers.count and not self.backlog_old():
                self.successor = "not_needed"
            elif not self.registry.request_successor(self.owner, self.lead_seconds):
                self.successor = "refused"
            else:
                self.successor = "requested"
        if self.successor == "requested":
            self._invoke(reason, self.slot, background=background)

    def _invoke(self, reason: str, slot: int | None, *, background: bool) -> None:
        if self.start_successor is None:
            return
        if background and self.background:
            self._starting = threading.Thread(target=self._start, args=(reason, slot), name="outbox-successor",
                                              daemon=True)
            self._starting.start()
        else:
            self._start(reason, slot)

    def _start(self, reason: str, slot: int | None) -> None:
        added = reason == "backlog"
        try:
            self.start_successor({"source": "outbox.handover", "channel": self.channel.value,
                                  "predecessor": None if added else self.owner, "reason": reason, "slot": slot})
            obs.logger.info("added a poller" if added else "started a successor", extra={"reason": reason})
        except Exception as exc:
            if not added:
                self.successor = "not_started"
            self._metric(obs.SUCCESSOR_NOT_STARTED, 1)
            obs.logger.error("could not add a poller" if added else
                             "could not start a successor; going on until the deadline",
                             extra={"reason": reason, "error_type": type(exc).__name__})

    def finish(self, *, failed: bool) -> None:
        """Start a successor (unless a newer poller is live) at the deadline, or on an early end after
        `lead_seconds` of polling (sooner, none: a fault ending every poller makes no chain); leave."""
        if not self.registered:
            return
        try:
            if not self.leaving:
                if self.outer.passed():
                    self.hand_over("deadline")
                elif self._started_left - self.outer.seconds_left() >= self.lead_seconds:
                    self.hand_over("error" if failed else "stopped")
            if self._starting is not None:
                self._starting.join(timeout=max(0.0, self.outer.remaining_ms() / 1000.0 - self.outer.margin_seconds / 2))
            self.registry.leave(self.owner)
        except Exception as exc:
            obs.logger.warning("could not leave the poller registry", extra={"error_type": type(exc).__name__})

    def _metric(self, name: str, value: float) -> None:
        with self._metrics_lock:
            self._metrics.append((name, value))

    def emit_metrics(self) -> None:
        """From the invocation's thread: Powertools' metric set is not thread-safe."""
        with self._metrics_lock:
            noted, self._metrics = self._metrics, []
        for name, value in noted:
            obs.emit(name, value)

    def summary(self) -> dict[str, Any]:
        return {"gap_seconds": None if self.gap_seconds is None else round(self.gap_seconds, 3),
                "left_for_newer": self.leaving and not self.shed, "shed": self.shed, "slot": self.slot,
                "successor": self.successor, "leases_taken_over": self.taken_over}


class HeartbeatThread:
    """`handover.beat()` every `interval`; stopping waits at most `join_seconds`, so a renewal stuck
    on a lost database does not carry the invocation past its deadline margin."""

    def __init__(self, handover: Handover, interval: float, join_seconds: float = 2.0) -> None:
        self.handover, self.interval, self.join_seconds = handover, float(interval), float(join_seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.handover.beat()

    def __enter__(self) -> "HeartbeatThread":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.join_seconds)


def lambda_starter(function_name: str, region: str | None) -> StartSuccessor:
    """An asynchronous Invoke of this very function; the client built on first use."""
    client: list[Any] = []

    def start(event: dict[str, Any]) -> None:
        if not client:
            import boto3
            from botocore.config import Config

            client.append(boto3.client("lambda", region_name=region, config=Config(
                connect_timeout=2, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"})))
        client[0].invoke(FunctionName=function_name, InvocationType="Event", Payload=json.dumps(event).encode())

    return start

