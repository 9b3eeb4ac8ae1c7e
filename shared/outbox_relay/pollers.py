"""The poller handover of latency mode (docs/design.md, "The poller handover").

A latency-mode invocation is a poller. It registers in `outbox_poller` when it
starts and renews the registration from a heartbeat thread about five times per
registration time-to-live. From each renewal it learns:

- a newer poller of its slot is live: it leaves (stops claiming and starting
  deliveries, finishes what is in flight, returns). The newest poller is the one
  that stays, so the cost is about one poller per slot at a time;
- a registration expired (its poller died: killed, out of memory, timed out): its
  leases are taken over at once instead of when they expire;
- older live pollers have not renewed since it registered (they may not know of
  it yet): a rate-shared channel (SES) does not claim until they have.

Near its deadline with no newer poller, it starts its successor itself (at most
once, refused by the registry when a newer poller is live); so does a poller that
ends early on an error. A poller that cannot start one says so (metric, log) and
goes on. A channel keeps `Pollers.count` slots, each a chain of pollers (a
successor takes its predecessor's slot); while the backlog's oldest due message is
older than `Pollers.add_age_seconds`, a poller asks for one more slot (up to
`Pollers.max`); a poller of an added slot leaves when half its claims find
nothing, and starts a successor only while the backlog is old. Times that are compared live in PostgreSQL, on its clock; the heartbeat's
schedule and the deadline are durations on this process's monotonic clock.
"""

from __future__ import annotations

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

#: Heartbeats per registration time-to-live: a renewal that fails now and then
#: (a slow statement, a dropped connection) does not let the registration expire.
BEATS_PER_TTL = 5
#: At most one poller is added per channel this often: the added one's work shows
#: in the backlog's age before another is asked for.
ADD_COOLDOWN_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Pollers:
    """How many pollers a channel keeps (OUTBOX_POLLERS), up to how many while its
    backlog's oldest due message is older than `add_age_seconds` (OUTBOX_POLLERS_MAX)."""

    count: int = 1
    max: int = 1
    add_age_seconds: float = 1.0


@dataclass(frozen=True, slots=True)
class Renewal:
    """What one renewal read from the registry."""

    registered: bool = True
    newer: int = 0
    others: int = 0
    older_unaware: int = 0
    expired: int = 0
    #: The database's now() of the renewal, as text (the reference of `older_unaware`).
    at: str | None = None
    #: The channel's oldest due message's age, seconds (0 when none is due).
    backlog_age: float = 0.0


class Registry(Protocol):
    """The registry statements a poller runs (tests pass a model of them)."""

    def register(self, owner: str, deadline_seconds: float, slot: int | None) -> tuple[float | None, int, int]:
        """Register; (seconds without a poller before it or None, other live pollers, its slot)."""

    def renew(self, owner: str, aware_after: str | None) -> Renewal: ...

    def take_over(self) -> tuple[int, int]:
        """Take over expired registrations' leases; (registrations, messages)."""

    def request_successor(self, owner: str, lead_seconds: float) -> bool: ...

    def add(self, owner: str, max_slots: int, lead_seconds: float) -> int | None:
        """Ask for a poller in a free slot; the slot, or None when refused."""

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
        at, registered, newer, others, unaware, expired, age = run_with_retry(self.engine, lambda c: c.execute(
            sql.relay.renew_poller, self._params(owner=owner, aware_after=aware_after)).one())
        return Renewal(bool(registered), int(newer), int(others), int(unaware), int(expired), at, float(age or 0))

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
    """One poller's side of the handover, as a state machine: `start()` once,
    `beat()` on a schedule (`HeartbeatThread`), `finish()` once at the end.
    `leaving` turns true when a newer poller is live; the invocation then stops
    (`deadline()` has passed). Counts and the reason it ended go to `summary()`.

    Args:
        registry: the registry statements.
        owner: this invocation's lease token (its registration's key).
        channel: the channel it relays.
        deadline: the invocation's deadline (Lambda's remaining time and margin).
        lead_seconds: with no newer poller, start a successor this long before the deadline.
        start_successor: invokes the successor, or None (self-invoke off): then none is started.
        rate_shared: the channel shares a rate across pollers (SES): it does not claim
            while older pollers may not have seen it, and paces at its share.
        background: the heartbeat starts the successor on a thread of its own (tests
            on a fake clock pass False: at once, in the heartbeat's call).
        slot: the slot it was started for (a successor's, an added one's), else None.
        pollers: how many pollers the channel keeps, and adds while its backlog is old.
    """

    def __init__(self, registry: Registry, owner: str, channel: Channel, deadline: Deadline, *,
                 lead_seconds: float, start_successor: StartSuccessor | None, rate_shared: bool = False,
                 background: bool = True, slot: int | None = None, pollers: Pollers = Pollers()) -> None:
        self.registry, self.owner, self.channel = registry, owner, Channel(channel)
        self.outer = deadline
        self.lead_seconds = float(lead_seconds)
        self.start_successor = start_successor
        self.rate_shared = rate_shared
        self.background = background
        self.leaving = False
        self.shed = False
        self.slot, self.pollers = slot, pollers
        #: The backlog's age (from the last renewal); claims, claims that found rows (`observe`).
        self._age, self._claims, self._found, self._window = 0.0, 0, 0, (0, 0)
        self.registered = False
        self.gap_seconds: float | None = None
        self.others = 0
        self.older_unaware = 0
        self.successor: str | None = None  # requested | not_started | refused
        self.taken_over = 0
        self._aware_after: str | None = None
        self._started_left = deadline.seconds_left()
        self._starting: threading.Thread | None = None
        self._metrics: list[tuple[str, float]] = []
        self._lock = threading.Lock()  # one successor request at a time
        self._metrics_lock = threading.Lock()  # apart: a request may wait on the database

    # -- the deadline the invocation runs under -------------------------------------------------
    def deadline(self) -> Deadline:
        """The invocation's deadline, passed at once when this poller leaves (nothing
        new is started; what is in flight finishes and is recorded)."""
        outer = self.outer
        return Deadline(lambda: 0 if self.leaving else outer.remaining_ms(), outer.margin_seconds)

    def may_claim(self) -> bool:
        """False while a rate-shared poller's older peers may not know of it yet."""
        return not (self.rate_shared and self.older_unaware)

    def rate_share(self) -> float:
        """This poller's share of a shared rate: one over the live pollers."""
        return 1.0 / (1 + self.others)

    # -- the life of a poller -------------------------------------------------------------------
    def start(self, sleep: Callable[[float], Any] = time.sleep) -> None:
        """Register, then renew once: the renewal's time is the reference for older
        pollers' awareness. While PostgreSQL cannot be reached, try again with a
        capped backoff until the deadline (then raise: nothing was claimed)."""
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
        """One heartbeat: renew, act on what it read. Errors are logged, not raised:
        the next heartbeat tries again."""
        try:
            renewal = self.registry.renew(self.owner, self._aware_after)
            unaware = renewal.older_unaware
            if self._aware_after is None:
                # The first renewal is the reference: an older poller that renews after
                # it began has seen this registration (it had committed before).
                self._aware_after, unaware = renewal.at, renewal.others
            if renewal.others != self.others:
                self._metric(obs.POLLERS, 1 + renewal.others)
            self.others, self.older_unaware, self._age = renewal.others, unaware, renewal.backlog_age
            if not renewal.registered and not self.leaving:
                # Another poller found this registration expired and took its leases
                # over: this one counts as dead, and stops (that one is polling).
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
        """Note the loop's claims and those that found rows (called after each claim)."""
        self._claims, self._found = summary.polls, summary.batches

    def backlog_old(self) -> bool:
        return self._age > self.pollers.add_age_seconds

    def scale(self) -> None:
        """While the backlog is old, ask for a poller in a free slot (the registry
        allows one add per channel at a time) and start it. Else a poller of an added
        slot whose claims found nothing in half of them since the last beat leaves."""
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
        """Start a successor unless one was started or a newer poller is live, or
        this poller holds an added slot and the backlog is not old. With
        `background`, the invoke runs on a thread of its own (a slow API call must
        not hold up the heartbeat); `finish` waits for it."""
        with self._lock:
            if self.successor is not None or self.start_successor is None or not self.registered:
                return
            if self.slot is not None and self.slot >= self.pollers.count and not self.backlog_old():
                self.successor = "not_needed"
                return
            if not self.registry.request_successor(self.owner, self.lead_seconds):
                self.successor = "refused"
                return
            self.successor = "requested"
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
        """The invocation ends. Unless a newer poller is live, start a successor
        first: at the deadline (if the heartbeat did not), or on an early end (an
        error, a stopped batch) after at least `lead_seconds` of polling; a poller
        that fails sooner starts none, so a fault that ends every poller at once
        makes no chain of invocations. Then leave the registry. Errors are logged."""
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
        """Emit the metrics noted since the last call. From the invocation's thread:
        the heartbeat thread only notes them (Powertools' metric set is not thread-safe)."""
        with self._metrics_lock:
            noted, self._metrics = self._metrics, []
        for name, value in noted:
            obs.emit(name, value)

    def summary(self) -> dict[str, Any]:
        return {"gap_seconds": None if self.gap_seconds is None else round(self.gap_seconds, 3),
                "left_for_newer": self.leaving and not self.shed, "shed": self.shed, "slot": self.slot,
                "successor": self.successor,
                "leases_taken_over": self.taken_over}


class HeartbeatThread:
    """Calls `handover.beat()` every `interval` seconds until stopped. Stopping waits
    for a renewal in progress at most `join_seconds`: a statement stuck on a lost
    database must not carry the invocation past its deadline margin."""

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
    """Start the successor with an asynchronous Invoke of this very function (its
    name from AWS_LAMBDA_FUNCTION_NAME); the client is built on first use."""
    client: list[Any] = []

    def start(event: dict[str, Any]) -> None:
        import json

        if not client:
            import boto3
            from botocore.config import Config

            client.append(boto3.client("lambda", region_name=region, config=Config(
                connect_timeout=2, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"})))
        client[0].invoke(FunctionName=function_name, InvocationType="Event", Payload=json.dumps(event).encode())

    return start

