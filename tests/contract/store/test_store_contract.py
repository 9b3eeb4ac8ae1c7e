"""The store contract: what the relay loop relies on of a `Store`, run against every
implementation (PostgreSQL's `LeaseStore` and the shipped `testing.InMemoryStore`),
judged by the rows each holds. A store, or a change to the claim, is done when it passes.
"""

from __future__ import annotations

import pytest

from outbox_relay.models import OrderingOnDead, Outcome, OutcomeKind, Status
from outbox_relay.store import DEAD_HOLD_SECONDS, LOCKED_HEAD_CONFIRM_SECONDS, LeaseStore, Store, part_of
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


def _keyed_backlog(harness) -> dict[int, str | None]:
    """Five keys' messages interleaved in seq order, four each, and a few without a key."""
    key_of: dict[int, str | None] = {}
    for _ in range(4):
        for k in ("a", "b", "c", "d", "e"):
            key_of.update(dict.fromkeys(harness.add(1, key=k), k))
    key_of.update(dict.fromkeys(harness.add(5), None))
    return key_of


def _in_turn(key_of: dict[int, str | None], got: list[int], done: list[int], own: list[int]) -> bool:
    """Whether each claimed message's earlier ones of its key were all recorded, are
    the poller's own in flight, or come before it in the same claim."""
    passed = set(done) | set(own)
    for s in got:
        if key_of[s] is not None and any(e < s and e not in passed for e, k in key_of.items() if k == key_of[s]):
            return False
        passed.add(s)
    return True


def _in_key_order(key_of: dict[int, str | None], delivered_seqs: list[int]) -> bool:
    by_key: dict[str, list[int]] = {}
    for s in delivered_seqs:
        if key_of[s] is not None:
            by_key.setdefault(key_of[s], []).append(s)
    return all(order == sorted(order) for order in by_key.values())


def test_several_pollers_claiming_in_turn_never_share_a_lease_and_keep_each_keys_order(harness) -> None:
    # Given a keyed backlog and three pollers, each claiming, holding, then recording or
    # giving back what it holds, in an order drawn at random
    import random

    store = harness.make()
    key_of = _keyed_backlog(harness)
    rng = random.Random(34)
    held: dict[str, list[int]] = {"p0": [], "p1": [], "p2": []}
    leased: dict[int, str] = {}
    done: list[int] = []
    for _ in range(400):
        if len(done) == len(key_of):
            break
        owner = rng.choice(sorted(held))
        if held[owner] and rng.random() < 0.5:
            if rng.random() < 0.2:  # it gives all it holds back (a deadline, a stopped batch)
                store.release(owner, held[owner])
            else:
                assert store.record(owner, [delivered(s) for s in held[owner]]).delivered == len(held[owner])
                done += held[owner]
            for s in held[owner]:
                del leased[s]
            held[owner] = []
            continue
        got = seqs(store.claim(owner, 3, LEASE))
        # Then a key's message is claimed only in its turn
        assert _in_turn(key_of, got, done, held[owner]), (owner, got)
        for s in got:
            # and no message is leased to two pollers at once
            assert s not in leased, (s, owner, leased[s])
            leased[s] = owner
            held[owner].append(s)

    # and every message is delivered once, each key's in seq order
    assert sorted(done) == sorted(key_of) and _in_key_order(key_of, done)


@pytest.mark.parametrize("parted", [False, True], ids=["whole", "parts"])
def test_several_pollers_claiming_at_once_never_share_a_lease_and_keep_each_keys_order(harness, parted) -> None:
    # Given a keyed backlog and four threads claiming at once (the in-memory store is one
    # transaction at a time: its calls are serialised, interleaved by the threads); with
    # parts, each claims its part of the keys, and any key once when its part had nothing
    import threading

    store = harness.make()
    key_of = _keyed_backlog(harness)
    serial = threading.Lock() if harness.name == "memory" else None
    guard = threading.Lock()
    leased: dict[int, str] = {}
    done: list[int] = []
    errors: list[BaseException] = []

    def call(f, *args):
        if serial is None:
            return f(*args)
        with serial:
            return f(*args)

    def poller(owner: str) -> None:
        try:
            idle, anywhere = 0, False
            while idle < 20:
                part = (int(owner[1:]), 4) if parted and not anywhere else None
                got = seqs(call(store.claim, owner, 2, LEASE, 1 << 30, part))
                anywhere = part is not None and not got
                idle = 0 if got else idle + 1
                with guard:
                    assert not set(got) & set(leased), (owner, got, leased)
                    assert _in_turn(key_of, got, done, []), (owner, got)
                    leased.update(dict.fromkeys(got, owner))
                if got:
                    # Recorded before this poller's next claim (a key's turn passes on only then),
                    # and noted before any claim that may have seen the record is checked
                    with guard:
                        assert call(store.record, owner, [delivered(s) for s in got]).delivered == len(got)
                        done.extend(got)
                        for s in got:
                            del leased[s]
                else:
                    threading.Event().wait(0.01)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=poller, args=(f"p{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)

    # Then no message was leased twice at once, each went once, each key's in seq order
    assert not errors, errors
    assert sorted(done) == sorted(key_of) and _in_key_order(key_of, done)


def test_a_claim_with_a_part_takes_only_its_parts_keys_and_any_claim_takes_the_rest(harness) -> None:
    # Given keys of both parts of two, interleaved, and messages without a key in both
    store = harness.make()
    keys = [f"k{i}" for i in range(12)]
    assert {part_of(k, 2) for k in keys} == {0, 1}
    rows = {k: [] for k in keys}
    for _ in range(2):
        for k in keys:
            rows[k] += harness.add(1, key=k)
    keyless = harness.add(6)
    assert {part_of(s, 2) for s in keyless} == {0, 1}

    # When the pollers of parts 0 and 1 claim
    mine = seqs(store.claim("p0", 100, LEASE, 1 << 30, (0, 2)))
    theirs = seqs(store.claim("p1", 1, LEASE, 1 << 30, (1, 2)))

    # Then each takes its part's keys in turn (and the keyless rows of its part, by their seq),
    # never the other's
    assert mine == sorted([s for k in keys if part_of(k, 2) == 0 for s in rows[k]]
                          + [s for s in keyless if part_of(s, 2) == 0])
    assert theirs == [min([s for k in keys if part_of(k, 2) == 1 for s in rows[k]]
                          + [s for s in keyless if part_of(s, 2) == 1])]
    # and a claim without a part takes the keys no poller holds, whatever their part
    rest = [s for k in keys if part_of(k, 2) == 1 and theirs[0] not in rows[k] for s in rows[k]] + [
        s for s in keyless if part_of(s, 2) == 1 and s != theirs[0]]
    assert seqs(store.claim("p0", 100, LEASE)) == sorted(rest)
