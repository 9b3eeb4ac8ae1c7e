"""The poller handover as a state machine on a fake clock: pollers of one channel
start on a rough schedule (early, late, missing, two at once), beat once a
second, leave when a newer one polls, start a successor near their deadline; a
registry model with the SQL statements' semantics stands in for PostgreSQL."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from outbox_relay import observability as obs
from outbox_relay.pollers import Handover, Renewal
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.registry import Channel

TTL = 5.0
BEAT = 1.0


@dataclass
class Row:
    owner: str
    started: float
    seen: float
    expires: float
    left: float | None = None
    requested: float | None = None
    gap: float | None = None
    taken_over: bool = False


@dataclass
class ModelRegistry:
    """The registry statements of sql/relay.sql, on a fake clock."""

    clock: list[float]
    rows: dict[str, Row] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)  # owner -> leased messages
    freed: int = 0

    def now(self) -> float:
        return self.clock[0]

    def live(self, r: Row) -> bool:
        return r.left is None and r.expires > self.now()

    def register(self, owner: str, deadline_seconds: float) -> tuple[float | None, int]:
        now = self.now()
        covered = [now if self.live(r) else (r.left if r.left is not None else r.seen) for r in self.rows.values()]
        gap = max(0.0, now - max(covered)) if covered else None
        live = sum(self.live(r) for r in self.rows.values())
        self.rows[owner] = Row(owner, now, now, now + TTL, gap=gap)
        return gap, live

    def renew(self, owner: str, aware_after: str | None) -> Renewal:
        me = self.rows.get(owner)
        now = self.now()
        if me is None:
            return Renewal(registered=False, at=str(now))
        me.seen, me.expires = now, now + TTL
        others = [r for r in self.rows.values() if r.owner != owner]
        ref = float(aware_after) if aware_after is not None else None
        return Renewal(
            True,
            newer=sum(self.live(r) and (r.started, r.owner) > (me.started, me.owner) for r in others),
            others=sum(self.live(r) for r in others),
            older_unaware=sum(self.live(r) and (r.started, r.owner) < (me.started, me.owner) and ref is not None
                              and r.seen <= ref for r in others),
            expired=sum(r.left is None and not r.taken_over and r.expires <= now for r in others),
            at=str(now))

    def take_over(self) -> tuple[int, int]:
        dead = [r for r in self.rows.values() if r.left is None and not r.taken_over and r.expires <= self.now()]
        messages = 0
        for r in dead:
            r.taken_over = True
            messages += self.leases.pop(r.owner, 0)
        self.freed += messages
        return len(dead), messages

    def request_successor(self, owner: str, lead_seconds: float) -> bool:
        me = self.rows[owner]
        now = self.now()
        on_its_way = any(self.live(r) and r.requested is not None and r.requested > now - lead_seconds
                         and not any(n.started > r.requested for n in self.rows.values())
                         for r in self.rows.values() if r.owner != owner)
        if on_its_way or any(
                self.live(r) and (r.started, r.owner) > (me.started, me.owner)
                for r in self.rows.values() if r.owner != owner):
            return False
        me.requested = me.requested if me.requested is not None else self.now()
        return True

    def leave(self, owner: str) -> None:
        if self.rows[owner].left is None:
            self.rows[owner].left = self.rows[owner].seen = self.now()


class Simulation:
    """Pollers on one fake clock, advanced in 0.1 s steps: each beats every second
    and ends at its deadline (timeout − margin) or one step after it saw a newer one."""

    def __init__(self, timeout: float = 150.0, margin: float = 5.0, lead: float = 15.0,
                 cold_start: float = 1.0, successor_fails: bool = False) -> None:
        self.clock = [0.0]
        self.registry = ModelRegistry(self.clock)
        self.timeout, self.margin, self.lead, self.cold_start = timeout, margin, lead, cold_start
        self.successor_fails = successor_fails
        self.running: dict[str, tuple[Handover, float, float]] = {}  # owner -> (handover, ends at, next beat)
        self.pending: list[tuple[float, str]] = []  # (start at, why)
        self.starts: list[tuple[float, str]] = []
        self.killed: set[str] = set()
        self.polling: list[tuple[float, int]] = []  # (time, pollers claiming)
        self.n = 0

    def schedule(self, at: float, why: str = "schedule") -> None:
        self.pending.append((at, why))

    def _start(self, why: str) -> None:
        self.n += 1
        owner = f"p{self.n:03d}"
        now = self.clock[0]
        ends = now + self.timeout - self.cold_start * (why != "first")

        def start_successor(event: dict) -> None:
            if self.successor_fails:
                raise RuntimeError("TooManyRequestsException")
            assert event["predecessor"] == owner and event["channel"] == "redis"
            self.schedule(self.clock[0] + self.cold_start, "successor")

        deadline = Deadline(lambda: int(max(0.0, ends - self.clock[0]) * 1000), self.margin)
        handover = Handover(self.registry, owner, Channel.REDIS, deadline, lead_seconds=self.lead,
                            start_successor=start_successor, background=False)
        handover.start()
        self.running[owner] = (handover, ends, now + BEAT)
        self.starts.append((now, why))

    def kill(self, owner: str, leased: int = 0) -> None:
        self.registry.leases[owner] = leased
        self.killed.add(owner)
        self.running.pop(owner)

    def run(self, until: float) -> None:
        while self.clock[0] < until:
            for at, why in sorted(self.pending):
                if at <= self.clock[0]:
                    self.pending.remove((at, why))
                    self._start(why)
            for owner, (h, ends, next_beat) in list(self.running.items()):
                if self.clock[0] >= next_beat:
                    h.beat()
                    self.running[owner] = (h, ends, next_beat + BEAT)
                if h.deadline().passed():
                    h.finish(failed=False)
                    del self.running[owner]
            self.polling.append((self.clock[0], len(self.running)))
            self.clock[0] = round(self.clock[0] + 0.1, 3)

    def seconds_without_poller(self, since: float = 0.0) -> float:
        return round(sum(0.1 for t, n in self.polling if t >= since and n == 0), 1)

    def poller_seconds(self) -> float:
        return sum(0.1 * n for _, n in self.polling)


def test_late_and_early_starts_leave_no_window_and_cost_about_one_poller() -> None:
    # Given starts anywhere within their minute: +0 then +59 (the worst pair), then early ones
    sim = Simulation()
    for at in (0.0, 60 + 59, 120 + 1, 180 + 30, 240 + 58, 300 + 0):
        sim.schedule(at)

    sim.run(until=400)

    # Then there was always a poller, the older one left within a beat or two of the
    # newer one, and the cost stays about one poller at a time
    assert sim.seconds_without_poller() == 0.0
    assert max(n for _, n in sim.polling) <= 2
    assert sim.poller_seconds() / 400 < 1.05
    assert [why for _, why in sim.starts].count("successor") <= 1


def test_missed_runs_are_covered_by_a_successor_the_poller_starts_itself() -> None:
    # Given one start, then three scheduled runs that never come
    sim = Simulation()
    sim.schedule(0.0)

    sim.run(until=500)

    # Then each poller started its successor before its deadline: no window without one
    assert sim.seconds_without_poller() == 0.0
    whys = [why for _, why in sim.starts]
    assert whys[0] == "schedule" and set(whys[1:]) == {"successor"} and len(whys) >= 4
    # and each asked once: a chain never multiplies
    assert all(r.requested is not None for r in list(sim.registry.rows.values())[:-1])
    assert max(n for _, n in sim.polling) <= 2


def test_two_starts_at_once_end_with_one_poller() -> None:
    sim = Simulation()
    sim.schedule(0.0)
    sim.schedule(0.0)
    sim.run(until=5)
    assert len(sim.running) == 1
    assert sim.starts[0][0] == sim.starts[1][0]


def test_a_killed_poller_costs_seconds_and_its_leases_are_taken_over() -> None:
    # Given two pollers, the newer killed -9 holding 40 leases, and the next start 20 s later
    sim = Simulation()
    sim.schedule(0.0)
    sim.schedule(10.0)
    sim.run(until=12)
    newer = max(sim.running)
    sim.kill(newer, leased=40)
    sim.schedule(32.0)

    sim.run(until=40)

    # Then the older had left for it, so nothing polled until the next start, which
    # measured the window from the registry and took the leases over at once
    gap = sim.registry.rows["p003"].gap
    assert gap == pytest.approx(32.0 - sim.registry.rows[newer].seen, abs=0.01)
    assert sim.registry.freed == 40
    assert sim.running["p003"][0].taken_over == 40


def test_a_successor_that_fails_to_start_is_said_and_the_poller_goes_on(monkeypatch) -> None:
    emitted = []
    monkeypatch.setattr(obs, "emit", lambda name, value: emitted.append((name, value)))
    sim = Simulation(successor_fails=True)
    sim.schedule(0.0)

    sim.run(until=160)

    # It asked once, could not start it, said so, and polled to its deadline
    assert [why for _, why in sim.starts] == ["schedule"]
    h = sim.registry.rows["p001"]
    assert h.requested is not None and h.left == pytest.approx(144.0, abs=0.2)  # 150 s less the cold start and margin
    # (the metrics are emitted from the invocation's thread)
    assert emitted == []
    assert sim.seconds_without_poller(since=146) > 10


def test_a_failed_successor_start_is_emitted_as_a_metric(monkeypatch) -> None:
    emitted = []
    monkeypatch.setattr(obs, "emit", lambda name, value: emitted.append((name, value)))
    clock = [0.0]
    registry = ModelRegistry(clock)

    def fail(event: dict) -> None:
        raise RuntimeError("AccessDeniedException")

    handover = Handover(registry, "a", Channel.REDIS, Deadline(lambda: 10_000, 5.0), lead_seconds=15,
                        start_successor=fail)
    handover.start()
    handover.finish(failed=False)
    handover.emit_metrics()
    assert (obs.SUCCESSOR_NOT_STARTED, 1) in emitted
    assert handover.summary()["successor"] == "not_started"


def test_an_early_end_starts_a_successor_only_after_polling_for_the_lead() -> None:
    clock = [0.0]
    registry = ModelRegistry(clock)
    started: list[dict] = []
    left = [100_000]
    deadline = Deadline(lambda: left[0], 5.0)

    def poller(owner: str) -> Handover:
        h = Handover(registry, owner, Channel.REDIS, deadline, lead_seconds=15, start_successor=started.append)
        h.start()
        return h

    # A poller that fails at once (the database went away) starts none: no chain of failures
    quick = poller("quick")
    quick.finish(failed=True)
    assert started == []
    # One that polled for longer than the lead hands over before it returns
    slow = poller("slow")
    left[0] -= 20_000
    clock[0] += 20
    slow.finish(failed=True)
    assert [e["reason"] for e in started] == ["error"] and started[0]["predecessor"] == "slow"


def test_a_rate_shared_newcomer_waits_until_older_pollers_have_seen_it() -> None:
    clock = [0.0]
    registry = ModelRegistry(clock)
    deadline = Deadline(lambda: 100_000, 5.0)
    old = Handover(registry, "old", Channel.SES, deadline, lead_seconds=15, start_successor=None, rate_shared=True)
    old.start()
    clock[0] = 1.0
    new = Handover(registry, "new", Channel.SES, deadline, lead_seconds=15, start_successor=None, rate_shared=True)
    new.start()
    assert not new.may_claim() and new.rate_share() == 0.5
    clock[0] = 1.5
    old.beat()  # it sees the newer one: it leaves, and stops starting sends
    assert old.leaving and old.deadline().passed()
    clock[0] = 2.0
    new.beat()
    assert new.may_claim()
    old.finish(failed=False)
    clock[0] = 3.0
    new.beat()
    assert new.rate_share() == 1.0


def test_a_cold_start_longer_than_the_lead_does_not_chain_successors() -> None:
    # Given successors that take 20 s to start, longer than the 15 s lead, and no scheduled run
    sim = Simulation(cold_start=20.0, timeout=40.0, lead=15.0)
    sim.schedule(0.0)

    sim.run(until=200)

    # Then a successor on its way is not doubled by the next poller: never more than two at once
    assert max(n for _, n in sim.polling) <= 2
    whys = [why for _, why in sim.starts]
    assert whys.count("successor") <= 200 / (40 - 20 - 5) + 1


def test_what_counts_as_the_database_being_unreachable() -> None:
    import ssl

    import pg8000.exceptions

    from outbox_relay.db import database_unreachable

    def pg_error(code: str) -> Exception:
        return pg8000.exceptions.DatabaseError({"C": code, "M": "x"})

    # A lost server, a restart, a failover's symptoms: wait for it
    for exc in (ConnectionRefusedError(), pg8000.exceptions.InterfaceError("Can't create a connection to host"),
                pg_error("08006"), pg_error("57P01"), pg_error("57P03"), pg_error("53300"), pg_error("25006")):
        assert database_unreachable(exc), exc
    # A statement refused, or a TLS / authentication setting: an error, not an outage
    for exc in (pg_error("23505"), pg_error("42P01"), ssl.SSLCertVerificationError("certificate verify failed"),
                pg8000.exceptions.InterfaceError("Server refuses SSL"), ValueError("bug")):
        assert not database_unreachable(exc), exc


def test_after_a_claim_lost_with_the_database_the_poller_claims_under_a_new_token() -> None:
    from sqlalchemy.exc import OperationalError

    from outbox_relay.backoff import Backoff
    from outbox_relay.loop import RelayLoop, RelayPolicy
    from outbox_relay.models import Mode
    from support.deadline import countdown
    from support.fakes import FakePublisher, FakeStore

    # Given a store whose second claim is lost with the connection (it may have committed)
    store = FakeStore(3)
    claim, calls = store.claim, []

    def flaky(owner, *args, **kwargs):
        calls.append(owner)
        if len(calls) == 2:
            raise OperationalError("claim", {}, ConnectionResetError(), connection_invalidated=True)
        return claim(owner, *args, **kwargs)

    store.claim = flaky
    policy = RelayPolicy(batch_size=10, lease_seconds=30, backoff=Backoff(), mode=Mode.LATENCY,
                         poll_interval_seconds=0.02, poll_max_interval_seconds=0.02)

    # When a latency-mode invocation runs through it
    summary = RelayLoop(store, FakePublisher(), policy, countdown(0.5, margin=0.1), "tok").run()

    # Then every claim after the lost one used a token of its own, derived from the invocation's
    assert calls[:2] == ["tok", "tok"] and set(calls[2:]) == {"tok/1"} and summary.delivered == 3
    assert summary.database_unreachable_seconds > 0
