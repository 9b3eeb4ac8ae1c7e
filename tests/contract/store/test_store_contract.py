"""The store contract: what the relay loop relies on of a `Store`, run against every
implementation (PostgreSQL's `LeaseStore` and the shipped `testing.InMemoryStore`),
judged by the rows each holds. A store, or a change to the claim, is done when it passes.
"""

from __future__ import annotations

from outbox_relay.models import OrderingOnDead, Outcome, OutcomeKind, Status
from outbox_relay.store import DEAD_HOLD_SECONDS, LOCKED_HEAD_CONFIRM_SECONDS, LeaseStore, Store
from outbox_relay.testing import InMemoryStore

from .conftest import HARNESSES

LEASE = 30.0


def seqs(claim) -> list[int]:
    return [m.seq for m in claim.messages]


def delivered(seq: int) -> Outcome:
    return Outcome.delivered(seq, f"ref-{seq}")


def test_every_store_has_a_harness() -> None:
    # A store without a harness would not be held to the contract.
    assert {h.store_class for h in HARNESSES.values()} == set(Store.__subclasses__()) == {LeaseStore, InMemoryStore}


def test_a_claim_leases_due_messages_oldest_first_and_a_lease_holds(harness) -> None:
    store = harness.make()
    a, b, c = harness.add(3)
    first = store.claim("one", 2, LEASE)
    assert seqs(first) == [a, b] and all(m.status is Status.LEASED and m.attempts == 1 for m in first.messages)
    assert seqs(store.claim("two", 10, LEASE)) == [c]
    assert store.claim("three", 10, LEASE).messages == ()
    assert harness.row(a)[:2] == ("leased", 1)


def test_outcomes_are_fenced_on_the_lease(harness) -> None:
    store = harness.make()
    (a,) = harness.add(1)
    store.claim("one", 10, LEASE)
    harness.advance(LEASE + 1)
    assert store.claim("two", 10, LEASE).requeued == 1  # a first expiry: back in the queue
    assert seqs(store.claim("two", 10, LEASE)) == [a]
    lost = store.record("one", [delivered(a)])
    assert (lost.delivered, lost.lease_lost, lost.lost_seqs) == (0, 1, (a,))
    assert harness.row(a)[:2] == ("leased", 2)
    assert store.record("two", [delivered(a)]).delivered == 1 and harness.row(a)[0] == "delivered"


def test_a_second_expiry_is_claimed_alone_as_a_suspect(harness) -> None:
    store = harness.make()
    a, b, c = harness.add(3)
    store.claim("one", 1, LEASE)
    harness.advance(LEASE + 1)
    requeue = store.claim("two", 10, LEASE)
    assert seqs(requeue) == [b, c] and requeue.requeued == 1  # due rows as the statement began
    assert harness.row(a)[2:] == ("lease_expired", True)
    assert seqs(store.claim("two", 10, LEASE)) == [a]
    (d,) = harness.add(1)  # due, and left for the next claim
    harness.advance(LEASE + 1)
    suspect = store.claim("three", 10, LEASE)
    assert suspect.suspect and seqs(suspect) == [a] and suspect.messages[0].attempts == 3
    assert harness.row(d)[:2] == ("pending", 0)
    assert suspect.requeued == 2  # the others expired for the first time


def test_an_expired_lease_with_no_attempts_left_is_dead_on_claim(harness) -> None:
    store = harness.make()
    (a,) = harness.add(1, max_attempts=1)
    store.claim("one", 10, LEASE)
    harness.advance(LEASE + 1)
    claim = store.claim("two", 10, LEASE)
    assert [(m.seq, m.status) for m in claim.messages] == [(a, Status.DEAD)]
    assert harness.row(a)[:3] == ("dead", 1, "lease_expired")


def test_each_outcome_is_recorded_as_its_kind_says(harness) -> None:
    store = harness.make()
    a, b, c, d, e = harness.add(5)
    store.claim("one", 10, LEASE)
    result = store.record("one", [
        delivered(a),
        Outcome(b, OutcomeKind.RETRY, None, "flaky", None, 60.0),
        Outcome(c, OutcomeKind.DEAD, None, "bad", None),
        Outcome(d, OutcomeKind.RELEASE, None, "later", None, 0.0),
        Outcome(e, OutcomeKind.SETTLE, None, "lost answer", None, 60.0),
    ])
    assert (result.delivered, result.retried, result.dead, result.released, result.lease_lost) == (1, 2, 1, 1, 0)
    assert len(result.lags_ms) == 1
    assert [harness.row(s)[:2] for s in (a, b, c, d, e)] == [
        ("delivered", 1), ("pending", 1), ("dead", 1), ("pending", 0), ("pending", 1)]
    assert [harness.row(s)[3] for s in (b, d, e)] == [False, True, False]


def test_a_retry_on_the_last_attempt_is_a_dead_letter(harness) -> None:
    store = harness.make()
    (a,) = harness.add(1, max_attempts=1)
    store.claim("one", 10, LEASE)
    assert store.record("one", [Outcome(a, OutcomeKind.RETRY, None, "flaky", None, 1.0)]).dead == 1
    assert harness.row(a)[0] == "dead"


def test_a_release_refunds_the_attempt(harness) -> None:
    store = harness.make()
    (a,) = harness.add(1)
    store.claim("one", 10, LEASE)
    assert store.release("one", [a]).released == 1 and harness.row(a)[:2] == ("pending", 0)


def test_a_key_is_claimed_in_its_turn(harness) -> None:
    store = harness.make()
    k1, k2 = harness.add(2, key="k")
    (free,) = harness.add(1)
    assert seqs(store.claim("one", 1, LEASE)) == [k1]
    # Another relay may not pass k1 while it is leased; the holder may (ours in flight)
    assert seqs(store.claim("two", 10, LEASE)) == [free]
    assert seqs(store.claim("one", 10, LEASE)) == [k2]


def test_a_key_waits_behind_its_retry(harness) -> None:
    store = harness.make()
    k1, k2 = harness.add(2, key="k")
    assert seqs(store.claim("one", 1, LEASE)) == [k1]
    store.record("one", [Outcome(k1, OutcomeKind.RETRY, None, "flaky", None, 60.0)])
    moved = store.claim("two", 10, LEASE)
    assert moved.messages == () and moved.scanned == 1  # k2 moved behind its key's retry
    assert harness.row(k2)[3] is False
    harness.advance(61)
    assert seqs(store.claim("two", 10, LEASE)) == [k1, k2]


def test_a_scheduled_message_waits_and_does_not_hold_its_key(harness) -> None:
    store = harness.make()
    (later,) = harness.add(1, key="k", deliver_in=60)
    (now,) = harness.add(1, key="k")
    assert seqs(store.claim("one", 10, LEASE)) == [now]
    harness.advance(61)
    assert seqs(store.claim("one", 10, LEASE)) == [later]


def test_the_byte_budget_cuts_a_claim(harness) -> None:
    store = harness.make()
    big = '{"p": "%s"}' % ("x" * 1000)
    a, b, c = harness.add(3, payload=big)
    claim = store.claim("one", 10, LEASE, max_bytes=1500)
    assert seqs(claim) == [a, b] and claim.cut  # the second starts under the budget
    assert seqs(store.claim("one", 10, LEASE, max_bytes=10)) == [c]  # at least one, always


def test_a_dead_letter_holds_its_key_under_block_until_redriven(harness) -> None:
    store = harness.make(ordering_on_dead=OrderingOnDead.BLOCK)
    k1, k2 = harness.add(2, key="k")
    store.claim("one", 1, LEASE)
    store.record("one", [Outcome(k1, OutcomeKind.DEAD, None, "bad", None)])
    held = store.claim("one", 10, LEASE)
    assert held.messages == () and harness.row(k2)[3] is False
    harness.advance(DEAD_HOLD_SECONDS + 1)
    assert store.claim("one", 10, LEASE).messages == ()  # still dead: moved again
    harness.redrive(k1)
    assert harness.row(k1)[:2] == ("pending", 0)  # fresh attempts
    harness.advance(DEAD_HOLD_SECONDS + 1)
    assert seqs(store.claim("one", 10, LEASE)) == [k1, k2]


def test_a_redrive_brings_back_at_once_what_its_dead_letter_held(harness) -> None:
    store = harness.make(ordering_on_dead=OrderingOnDead.BLOCK)
    k1, k2 = harness.add(2, key="k")
    store.claim("one", 1, LEASE)
    store.record("one", [Outcome(k1, OutcomeKind.DEAD, None, "bad", None)])
    assert store.claim("one", 10, LEASE).messages == () and harness.row(k2)[3] is False  # held
    harness.redrive(k1)
    assert harness.row(k2)[3] is True  # due again, not after the hold
    assert seqs(store.claim("one", 10, LEASE)) == [k1, k2]


def test_a_dead_letter_lets_its_key_go_under_skip(harness) -> None:
    store = harness.make(ordering_on_dead=OrderingOnDead.SKIP)
    k1, k2 = harness.add(2, key="k")
    store.claim("one", 1, LEASE)
    store.record("one", [Outcome(k1, OutcomeKind.DEAD, None, "bad", None)])
    assert seqs(store.claim("one", 10, LEASE)) == [k2]


def test_a_key_behind_a_locked_first_message_is_moved_once_the_lock_lasts(harness) -> None:
    store = harness.make()
    (head,) = harness.add(1, key="hot")
    behind = harness.add(3, key="hot")
    (free,) = harness.add(1)
    with harness.locked(head):
        first = store.claim("one", 10, LEASE)
        assert seqs(first) == [free] and len(first.locked_heads) == 1 and first.unconfirmed == first.locked_heads
        assert all(harness.row(s)[3] for s in behind)  # not yet: a concurrent claim holds a row this long
        harness.wait(LOCKED_HEAD_CONFIRM_SECONDS + 0.2)
        second = store.claim("one", 10, LEASE)
        assert second.messages == () and second.scanned == 3 and second.unconfirmed == ()
        assert not any(harness.row(s)[3] for s in behind)  # moved out of the scan


def test_the_oldest_pending_age_is_the_oldest_due_message(harness) -> None:
    store = harness.make()
    assert store.oldest_pending_age_seconds() == 0
    harness.add(1)
    harness.advance(10)
    assert 9.5 <= store.oldest_pending_age_seconds() <= 60
