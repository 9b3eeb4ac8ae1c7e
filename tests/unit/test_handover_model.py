"""The poller handover as a state machine on a fake clock: pollers of one channel
start on a rough schedule (early, late, missing, two at once), beat once a
second, leave when a newer one of their slot polls, start a successor near their
deadline; several pollers per channel, added while the backlog is old and shed when
idle; a registry model with the SQL statements' semantics stands in for PostgreSQL."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from outbox_relay import observability as obs
from outbox_relay.pollers import ADD_COOLDOWN_SECONDS, Handover, Pollers, Renewal
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
    slot: int = 0
    added: float | None = None


@dataclass
class ModelRegistry:
    """The registry statements of sql/relay.sql, on a fake clock."""

    clock: list[float]
    rows: dict[str, Row] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)  # owner -> leased messages
    freed: int = 0
    slots: int = 1
    #: The channel's oldest due message's age, as the renewal reads it.
    age: float = 0.0

    def now(self) -> float:
        return self.clock[0]

    def live(self, r: Row) -> bool:
        return r.left is None and r.expires > self.now()

    def register(self, owner: str, deadline_seconds: float, slot: int | None) -> tuple[float | None, int, int]:
        now = self.now()
        covered = [now if self.live(r) else (r.left if r.left is not None else r.seen) for r in self.rows.values()]
        gap = max(0.0, now - max(covered)) if covered else None
        live = [r for r in self.rows.values() if self.live(r)]
        if slot is None:
            free = [s for s in range(self.slots) if all(r.slot != s for r in live)]
            oldest = sorted((r.started, r.owner, r.slot) for r in live if r.slot < self.slots)
            slot = free[0] if free else oldest[0][2] if oldest else 0
        self.rows[owner] = Row(owner, now, now, now + TTL, gap=gap, slot=slot)
        return gap, len(live), slot

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
            newer=sum(self.live(r) and r.slot == me.slot and (r.started, r.owner) > (me.started, me.owner)
                      for r in others),
            others=sum(self.live(r) for r in others),
            older_unaware=sum(self.live(r) and (r.started, r.owner) < (me.started, me.owner) and ref is not None
                              and r.seen <= ref for r in others),
            expired=sum(r.left is None and not r.taken_over and r.expires <= now for r in others),
            at=str(now), backlog_age=self.age)

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
                         and not any(n.slot == r.slot and n.started > r.requested for n in self.rows.values())
                         for r in self.rows.values() if r.owner != owner and r.slot == me.slot)
        if on_its_way or any(
                self.live(r) and r.slot == me.slot and (r.started, r.owner) > (me.started, me.owner)
                for r in self.rows.values() if r.owner != owner):
            return False
        me.requested = me.requested if me.requested is not None else self.now()
        return True

    def add(self, owner: str, max_slots: int, lead_seconds: float) -> int | None:
        now = self.now()
        free = [s for s in range(max_slots) if not any(self.live(r) and r.slot == s for r in self.rows.values())]
        asked = [r.added for r in self.rows.values() if r.added is not None]
        if not free or self.rows[owner].left is not None or any(
                a > now - ADD_COOLDOWN_SECONDS or (a > now - lead_seconds
                                                   and not any(n.started > a for n in self.rows.values()))
                for a in asked):
            return None
        self.rows[owner].added = now
        return free[0]

    def leave(self, owner: str) -> None:
        if self.rows[owner].left is None:
            self.rows[owner].left = self.rows[owner].seen = self.now()


class Simulation:
    """Pollers on one fake clock, advanced in 0.1 s steps: each beats every second
    and ends at its deadline (timeout − margin) or one step after it saw a newer one."""

    def __init__(self, timeout: float = 150.0, margin: float = 5.0, lead: float = 15.0,
                 cold_start: float = 1.0, successor_fails: bool = False, pollers: Pollers = Pollers()) -> None:
        self.clock = [0.0]
        self.registry = ModelRegistry(self.clock, slots=pollers.count)
        self.pollers = pollers
        #: Whether the pollers' claims find rows (the backlog's age: `registry.age`).
        self.busy = True
        self.timeout, self.margin, self.lead, self.cold_start = timeout, margin, lead, cold_start
        self.successor_fails = successor_fails
        self.running: dict[str, tuple[Handover, float, float]] = {}  # owner -> (handover, ends at, next beat)
        self.pending: list[tuple[float, str, int | None]] = []  # (start at, why, slot)
        self.starts: list[tuple[float, str]] = []
        self.killed: set[str] = set()
        self.polling: list[tuple[float, int]] = []  # (time, pollers claiming)
        self.n = 0

    def schedule(self, at: float, why: str = "schedule", slot: int | None = None) -> None:
        self.pending.append((at, why, slot))

    def _start(self, why: str, slot: int | None = None) -> None:
        self.n += 1
        owner = f"p{self.n:03d}"
        now = self.clock[0]
        ends = now + self.timeout - self.cold_start * (why != "first")

        def start_successor(event: dict) -> None:
            if self.successor_fails:
                raise RuntimeError("TooManyRequestsException")
            assert event["predecessor"] in (owner, None) and event["channel"] == "redis"
            self.schedule(self.clock[0] + self.cold_start, "added" if event["predecessor"] is None else "successor",
                          event["slot"])

        deadline = Deadline(lambda: int(max(0.0, ends - self.clock[0]) * 1000), self.margin)
        handover = Handover(self.registry, owner, Channel.REDIS, deadline, lead_seconds=self.lead,
                            start_successor=start_successor, background=False, slot=slot, pollers=self.pollers)
        handover.start()
        self.running[owner] = (handover, ends, now + BEAT)
        self.starts.append((now, why))

    def kill(self, owner: str, leased: int = 0) -> None:
        self.registry.leases[owner] = leased
        self.killed.add(owner)
        self.running.pop(owner)

    def run(self, until: float) -> None:
        while self.clock[0] < until:
            for at, why, slot in sorted(self.pending, key=lambda p: p[:2]):
                if at <= self.clock[0]:
                    self.pending.remove((at, why, slot))
                    self._start(why, slot)
            for owner, (h, ends, next_beat) in list(self.running.items()):
                h.observe(_Seen(h, self.busy))
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

    def slots(self) -> list[int]:
        return sorted(h.slot for h, _, _ in self.running.values())


class _Seen:
    """What a poller's loop summary shows after one more claim (`Handover.observe`)."""

    def __init__(self, h: Handover, busy: bool) -> None:
        self.polls, self.batches = h._claims + 1, h._found + busy


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


def test_several_pollers_each_keep_a_slot_with_their_own_successors() -> None:
    # Given OUTBOX_POLLERS=3, three starts at once, then scheduled runs that come late or not at all
    sim = Simulation(pollers=Pollers(3, 3))
    for _ in range(3):
        sim.schedule(0.0)
    for at in (60 + 59, 240 + 30):
        sim.schedule(at)

    sim.run(until=500)

    # Then three slots were polled all along, each by a chain of its own successors: a
    # successor takes its predecessor's slot, and a scheduled run the oldest poller's
    assert sim.slots() == [0, 1, 2]
    assert all(n >= 3 for t, n in sim.polling if t > 1)
    rows = list(sim.registry.rows.values())
    for r in rows:
        if r.requested is not None:  # its successor: the first later registration of its slot
            after = [n for n in rows if n.slot == r.slot and n.started > r.requested]
            assert after and after[0].started <= r.requested + sim.cold_start + 0.11
    # and the cost stays about one poller per slot, a chain never multiplying
    assert sim.poller_seconds() / 500 < 3 * 1.05 and max(n for _, n in sim.polling) <= 6


def test_a_successor_replaces_its_predecessor_not_a_poller_of_another_slot() -> None:
    sim = Simulation(pollers=Pollers(2, 2))
    sim.schedule(0.0)
    sim.schedule(30.0)
    sim.run(until=140)  # the first one's successor starts near its deadline (130 s)
    (first, second) = ("p001", "p002")
    assert sim.registry.rows[first].slot == 0 and sim.registry.rows[second].slot == 1
    assert sim.registry.rows[first].left is not None  # it left for its own successor
    assert sim.registry.rows[second].left is None  # the other slot's poller polls on
    assert sim.slots() == [0, 1]


def test_a_backlog_adds_pollers_one_at_a_time_up_to_the_maximum_and_idle_ones_are_shed() -> None:
    # Given one poller kept, up to four while the backlog is older than a second
    sim = Simulation(pollers=Pollers(1, 4, add_age_seconds=1.0), cold_start=2.0)
    sim.schedule(0.0)
    sim.run(until=10)
    assert sim.slots() == [0]

    # When the backlog's oldest due message stays 5 s old
    sim.registry.age = 5.0
    sim.run(until=60)

    # Then pollers were added, one add at a time, up to four and no more: a chain that
    # never multiplies (each add asked once per cooldown by the whole channel)
    added = [t for t, why in sim.starts if why == "added"]
    assert sim.slots() == [0, 1, 2, 3] and len(added) == 3
    assert all(b - a >= 5.0 for a, b in zip(added, added[1:])) and added[-1] < 30
    assert max(n for _, n in sim.polling) <= 4

    # When the backlog is gone and the added pollers' claims find nothing
    sim.registry.age, sim.busy = 0.0, False
    sim.run(until=70)

    # Then the added ones left within a couple of heartbeats; the kept one polls on
    assert sim.slots() == [0]
    assert all(sim.registry.rows[o].left is not None for o in sim.registry.rows if sim.registry.rows[o].slot)


def test_an_added_poller_starts_a_successor_only_while_the_backlog_is_old() -> None:
    clock = [0.0]
    registry = ModelRegistry(clock, slots=1)
    started: list[dict] = []
    left = [10_000]
    h = Handover(registry, "added", Channel.REDIS, Deadline(lambda: left[0], 5.0), lead_seconds=15,
                 start_successor=started.append, background=False, slot=1, pollers=Pollers(1, 2))
    h.start()
    h.observe(_Seen(h, True))  # busy, but the backlog is young
    h.beat()  # within the lead
    assert started == [] and h.summary()["successor"] == "not_needed"

    kept = Handover(registry, "kept", Channel.REDIS, Deadline(lambda: left[0], 5.0), lead_seconds=15,
                    start_successor=started.append, background=False, slot=0, pollers=Pollers(1, 2))
    kept.start()
    kept.beat()
    assert [(e["slot"], e["predecessor"]) for e in started] == [(0, "kept")]


def test_an_added_poller_stays_while_the_backlog_is_old_even_when_its_claims_find_nothing() -> None:
    # (a few hot keys: most rows are out of turn behind the other pollers' leases)
    sim = Simulation(pollers=Pollers(1, 2, add_age_seconds=1.0))
    sim.registry.age = 5.0
    sim.schedule(0.0)
    sim.run(until=20)
    assert sim.slots() == [0, 1]
    sim.busy = False
    sim.run(until=30)
    assert sim.slots() == [0, 1] and not any(h.shed for h, _, _ in sim.running.values())
