"""The invocation modes (`modes.run_invocation`) on fakes of the store and the
publisher: how many batches each mode claims, when it stops, what it gives back."""

from __future__ import annotations

import pytest

from outbox_relay.backoff import Backoff
from outbox_relay.errors import StopBatch
from outbox_relay.loop import RelayLoop, RelayPolicy
from outbox_relay.models import DeliveryResult, Mode
from support.fakes import FakeClock, FakePublisher, FakeStore, unavailable


def policy(mode: Mode, batch_size: int = 10, **kw) -> RelayPolicy:
    return RelayPolicy(batch_size=batch_size, lease_seconds=120, backoff=Backoff(base=4, cap=60, floor=0), mode=mode,
                       **kw)


def delivered(store: FakeStore) -> list[int]:
    return sorted(s for s, (status, _) in store.status_of().items() if status == "delivered")


@pytest.mark.parametrize("pipelined", [False, True])
def test_drain_claims_while_batches_come_back_full(pipelined):
    # Given 25 due messages and a batch of 10
    store, clock = FakeStore(25), FakeClock()

    # When one drain invocation runs
    summary = RelayLoop(store, FakePublisher(pipelined=pipelined), policy(Mode.DRAIN), clock.deadline, "me",
                             sleep=clock.sleep).run()

    # Then it claimed 10, 10 and 5 and stopped after the batch that was not full
    assert [limit for _, limit in store.claims] == [10, 10, 10]
    assert delivered(store) == list(range(1, 26))
    assert (summary.mode, summary.batches, summary.claimed, summary.delivered) == ("drain", 3, 25, 25)
    assert clock.sleeps == []


def test_drain_stops_at_an_empty_claim_after_a_full_batch():
    store, clock = FakeStore(20), FakeClock()
    summary = RelayLoop(store, FakePublisher(pipelined=True), policy(Mode.DRAIN), clock.deadline, "me",
                             sleep=clock.sleep).run()
    assert len(store.claims) == 3 and summary.delivered == 20 and summary.polls == 3


def test_batch_mode_is_one_batch():
    store, clock = FakeStore(25), FakeClock()
    summary = RelayLoop(store, FakePublisher(), policy(Mode.BATCH), clock.deadline, "me", sleep=clock.sleep).run()
    assert len(store.claims) == 1 and summary.delivered == 10 and summary.mode == "batch"


def test_latency_polls_until_the_deadline_and_takes_what_arrives():
    # Given an empty table and messages that arrive while the invocation waits
    store, clock = FakeStore(), FakeClock(seconds=2.0, margin=0.5)
    arrivals = {0.3: 3, 0.9: 4}

    def arrive(now: float) -> None:
        store.now = 1000.0 + now
        for at in [a for a in arrivals if a <= now + 1e-9]:
            for _ in range(arrivals.pop(at)):
                store.add(available_at=store.now)

    clock.on_sleep = arrive

    # When one latency invocation runs
    summary = RelayLoop(store, FakePublisher(pipelined=True), policy(Mode.LATENCY), clock.deadline, "me",
                             sleep=clock.sleep).run()

    # Then every message that arrived was delivered, it waited at most the poll interval
    # between empty claims (the interval once idle), and it stopped at the deadline's margin
    assert delivered(store) == list(range(1, 8))
    assert summary.delivered == 7 and summary.batches == 2
    assert max(clock.sleeps) == 0.1 and clock.sleeps.count(0.1) >= 5
    assert clock.now == pytest.approx(1.5, abs=0.01)
    assert summary.skipped is None


def test_latency_backs_off_while_idle_and_comes_back_at_once():
    # Given a poll interval of 0.1 s that may grow to 0.4 s, and one message arriving after a quiet spell
    store, clock = FakeStore(), FakeClock(seconds=3.0, margin=0.5)

    def arrive(now: float) -> None:
        store.now = 1000.0 + now
        if 1.4 < now < 1.6 and len(store.rows) == 0:
            store.add(available_at=store.now)

    clock.on_sleep = arrive
    RelayLoop(store, FakePublisher(pipelined=True),
                   policy(Mode.LATENCY, poll_interval_seconds=0.1, poll_max_interval_seconds=0.4),
                   clock.deadline, "me", sleep=clock.sleep).run()

    # Then the idle wait doubled from an eighth of the interval to 0.4 s, and after the claim
    # that found the message it started again from an eighth of the interval
    found = next(i for i, t in enumerate(clock.sleeps) if sum(clock.sleeps[:i + 1]) > 1.4)
    assert clock.sleeps[:7] == [0.0125, 0.025, 0.05, 0.1, 0.2, 0.4, 0.4]
    assert clock.sleeps[found + 1] == 0.0125
    assert delivered(store) == [1]


def test_latency_keeps_polling_through_a_closed_gate_and_drain_stops():
    store, clock = FakeStore(5), FakeClock(seconds=1.0, margin=0.5)
    publisher = FakePublisher(gate="redis unavailable (ConnectionError)", pipelined=True)
    summary = RelayLoop(store, publisher, policy(Mode.LATENCY), clock.deadline, "me", sleep=clock.sleep).run()
    assert store.claims == [] and summary.gate_closed
    assert publisher.gates == len(clock.sleeps) == 8  # 0.0125 + 0.025 + 0.05 + 0.1 … until no time is left
    assert summary.skipped is None or summary.skipped.startswith("not enough time")

    store, clock = FakeStore(5), FakeClock()
    publisher = FakePublisher(gate="redis unavailable (ConnectionError)", pipelined=True)
    summary = RelayLoop(store, publisher, policy(Mode.DRAIN), clock.deadline, "me", sleep=clock.sleep).run()
    assert publisher.gates == 1 and summary.skipped == "redis unavailable (ConnectionError)"


def test_the_gate_is_checked_before_every_claim():
    store, clock = FakeStore(35), FakeClock()
    publisher = FakePublisher(pipelined=True)
    summary = RelayLoop(store, publisher, policy(Mode.DRAIN), clock.deadline, "me", sleep=clock.sleep).run()
    assert publisher.gates == len(store.claims) == summary.polls == 4


@pytest.mark.parametrize("mode", [Mode.DRAIN, Mode.LATENCY])
def test_a_downstream_lost_mid_batch_refunds_it_and_what_was_claimed_ahead(mode):
    # Given 30 messages, a batch of 10, and a downstream that goes away during the first batch
    store, clock = FakeStore(30), FakeClock(seconds=1.0, margin=0.5)
    calls = []

    class Flaky(FakePublisher):
        def deliver(self, messages, deadline, record):
            calls.append([m.seq for m in messages])
            if len(calls) == 1:
                raise unavailable()
            super().deliver(messages, deadline, record)

    summary = RelayLoop(store, Flaky(pipelined=True), policy(mode), clock.deadline, "me", sleep=clock.sleep).run()

    # Then the first batch and the one claimed ahead are pending again with their attempts refunded
    assert calls[0] == list(range(1, 11))
    assert summary.stopped == "downstream_unavailable"
    if mode is Mode.DRAIN:
        assert delivered(store) == []
        assert store.status_of() == {s: ("pending", 0) for s in range(1, 31) if s <= 20} | \
               {s: ("pending", 0) for s in range(21, 31)}
    else:  # latency goes on after an idle wait, and delivers them all
        assert delivered(store) == list(range(1, 31))
        assert all(attempts == 1 for _, attempts in store.status_of().values())


def test_a_stop_batch_ends_a_latency_invocation():
    store, clock = FakeStore(30), FakeClock(seconds=5.0, margin=0.5)
    publisher = FakePublisher(raise_after=StopBatch("ses: the configured sender is not verified"), report_first=0,
                              pipelined=True)
    summary = RelayLoop(store, publisher, policy(Mode.LATENCY), clock.deadline, "me", sleep=clock.sleep).run()
    assert summary.stopped == "stop_batch" and len(publisher.delivered) == 1 and clock.sleeps == []
    assert all(v == ("pending", 0) for v in store.status_of().values())


def test_a_batch_claimed_ahead_and_not_delivered_goes_back():
    # Given a latency invocation whose deadline passes while a batch claimed ahead waits
    store, clock = FakeStore(30), FakeClock(seconds=10.0, margin=1.0)

    class Slow(FakePublisher):
        def deliver(self, messages, deadline, record):
            super().deliver(messages, deadline, record)
            clock.now = 9.5  # the batch takes until past the deadline's margin

    summary = RelayLoop(store, Slow(pipelined=True), policy(Mode.LATENCY), clock.deadline, "me",
                             sleep=clock.sleep).run()

    # Then only the first batch was delivered; the second, claimed while it was published, was released
    assert delivered(store) == list(range(1, 11))
    assert {s: store.status_of()[s] for s in range(11, 21)} == {s: ("pending", 0) for s in range(11, 21)}
    assert summary.error_classes.get("not_attempted") == 10


def test_pipelined_claims_take_half_the_byte_budget_each():
    store, clock = FakeStore(5), FakeClock()
    RelayLoop(store, FakePublisher(pipelined=True), policy(Mode.DRAIN, batch_max_bytes=1000), clock.deadline,
                   "me", sleep=clock.sleep).run()
    assert store.claim_bytes == [500]
    store, clock = FakeStore(5), FakeClock()
    RelayLoop(store, FakePublisher(pipelined=False), policy(Mode.DRAIN, batch_max_bytes=1000), clock.deadline,
                   "me", sleep=clock.sleep).run()
    assert store.claim_bytes == [1000]


def test_a_failed_outcome_write_propagates_and_stops_claiming():
    store, clock = FakeStore(30), FakeClock()
    store.fail_record = ConnectionError("database went away")
    with pytest.raises(ConnectionError):
        RelayLoop(store, FakePublisher(pipelined=True), policy(Mode.DRAIN), clock.deadline, "me",
                       sleep=clock.sleep).run()
    assert len(store.claims) <= 3


def test_results_are_recorded_per_message_whatever_the_mode():
    store, clock = FakeStore(12), FakeClock()
    answers = {s: DeliveryResult.delivered(s, f"{s}-0") for s in range(1, 13)}
    summary = RelayLoop(store, FakePublisher(lambda m: answers[m.seq], pipelined=True),
                             policy(Mode.DRAIN, batch_size=5), clock.deadline, "me", sleep=clock.sleep).run()
    assert summary.delivered == 12 and [store.rows[s].delivery_ref for s in (1, 12)] == ["1-0", "12-0"]
    assert summary.as_dict()["delivery_lag_ms"]["count"] == 12


def test_nothing_is_claimed_ahead_of_a_suspect_even_when_its_claim_requeued_leases():
    # Given a claim that re-claimed a suspect alone and also requeued expired leases (it counts as full)
    from dataclasses import replace

    class SuspectFirst(FakeStore):
        def __init__(self) -> None:
            super().__init__(5)
            self.recorded_when_claimed: list[int] = []

        def claim(self, owner, limit, lease_seconds, max_bytes=1 << 30, part=None):
            self.recorded_when_claimed.append(len(self.records))
            if len(self.claims) == 0:
                return replace(super().claim(owner, 1, lease_seconds, max_bytes), suspect=True, requeued=3, scanned=0)
            return super().claim(owner, limit, lease_seconds, max_bytes)

    store, clock = SuspectFirst(), FakeClock()
    # When a pipelined drain invocation runs
    RelayLoop(store, FakePublisher(pipelined=True), policy(Mode.DRAIN), clock.deadline, "me", sleep=clock.sleep).run()
    # Then the next claim began only once the suspect's outcome was written (it may crash the process)
    assert store.recorded_when_claimed[:2] == [0, 1] and delivered(store) == [1, 2, 3, 4, 5]


def test_a_poller_whose_part_has_nothing_claims_any_key_at_once_then_its_part_again():
    # Given a poller of part 0 of 2 and a backlog only of keys in part 1 (their poller died)
    from outbox_relay.store import part_of

    other = next(k for k in (f"k{i}" for i in range(20)) if part_of(k, 2) == 1)
    store, clock = FakeStore(0), FakeClock(seconds=2.0, margin=0.5)
    for _ in range(3):
        store.add(key=other)

    claims_at_sleep: list[int] = []
    clock.on_sleep = lambda now: claims_at_sleep.append(len(store.parts))

    # When it polls in latency mode
    RelayLoop(store, FakePublisher(pipelined=True), policy(Mode.LATENCY), clock.deadline, "me",
              sleep=clock.sleep, part=lambda: (0, 2)).run()

    # Then its empty claim of its part is followed, without a wait, by one of any key, which takes
    # the other part's messages in order; each claim after a claim of any key is of its part again
    assert store.parts[:4] == [(0, 2), None, (0, 2), None] and claims_at_sleep[0] == 4
    assert delivered(store) == [1, 2, 3]
    assert all(a is not None for a, b in zip(store.parts, store.parts[1:]) if b is None)
    assert clock.sleeps.count(0.1) >= 5  # idle: a pair of claims per poll interval, not a tight loop


def poll_with_slow_claims_of_any_key(store, clock, seconds) -> list[float]:
    """Run a latency-mode poller of part 0 of 2 whose n-th claim of any key takes seconds(n);
    the times those claims began."""
    any_key_at: list[float] = []
    claim = store.claim

    def timed(*args, **kwargs):
        if args[4] is None:
            any_key_at.append(clock.now)
            clock.now += seconds(len(any_key_at))
        return claim(*args, **kwargs)

    store.claim = timed
    RelayLoop(store, FakePublisher(pipelined=True), policy(Mode.LATENCY), clock.deadline, "me",
              sleep=clock.sleep, part=lambda: (0, 2)).run()
    return any_key_at


def test_a_claim_of_any_key_that_found_nothing_waits_ten_times_its_duration_before_the_next():
    # Given a poller of part 0 of 2 whose claims of any key take 0.2 s each and find nothing (a deep
    # backlog that another poller holds), its own part empty
    from outbox_relay.loop import ANYWHERE_BACKOFF

    store, clock = FakeStore(0), FakeClock(seconds=12.0, margin=0.5)
    # When it polls in latency mode
    any_key_at = poll_with_slow_claims_of_any_key(store, clock, lambda n: 0.2)
    # Then its claims of any key come at least ten times their 0.2 s apart, its part's every poll interval
    gaps = [b - a for a, b in zip(any_key_at, any_key_at[1:])]
    assert len(any_key_at) >= 3 and min(gaps) >= 0.2 + ANYWHERE_BACKOFF * 0.2 - 0.01, any_key_at
    assert store.parts.count((0, 2)) >= 40


def test_the_wait_after_a_claim_of_any_key_that_found_nothing_is_bounded():
    # Given a poller of part 0 of 2 whose first claim of any key took 10 s (a reconnect, a lock)
    from outbox_relay.loop import ANYWHERE_BACKOFF_MAX_SECONDS

    store, clock = FakeStore(0), FakeClock(seconds=90.0, margin=0.5)
    any_key_at = poll_with_slow_claims_of_any_key(store, clock, lambda n: 10.0 if n == 1 else 0.0)
    # Then the next claim of any key came after the most, not ten times 10 s
    assert 10.0 + ANYWHERE_BACKOFF_MAX_SECONDS <= any_key_at[1] <= 10.0 + ANYWHERE_BACKOFF_MAX_SECONDS + 0.5
