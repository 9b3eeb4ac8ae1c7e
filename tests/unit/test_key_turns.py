"""The pieces of per-key ordering that need no server: what the invocation remembers
across batches (KeyTurns), how the Redis publisher splits a batch into script calls,
and how a failed call is reported per key."""

from __future__ import annotations

from outbox_relay.key_turns import KeyTurns
from outbox_relay.models import ClaimedMessage, ErrorClass, Status
from outbox_relay.publishers.redis import script as redis_script


def msg(seq: int, key: str | None, destination: str = "s") -> ClaimedMessage:
    return ClaimedMessage(seq, f"id-{seq}", Status.LEASED, destination, "t", key, "{}", None, 1, 3, "now")


def test_a_key_not_delivered_holds_back_its_later_messages_until_it_is():
    turns = KeyTurns()
    assert turns.held([msg(1, "a")]) == set()
    turns.note(msg(1, "a"), delivered=False)
    turns.note(msg(2, "b"), delivered=True)
    # Later messages of a are held back; b and messages without a key are not; nor is a on another stream
    assert turns.held([msg(3, "a"), msg(4, "a"), msg(5, "b"), msg(6, None), msg(7, "a", "other")]) == {("s", "a")}
    # The failed message itself, retried later with its followers, is not held back
    assert turns.held([msg(1, "a"), msg(3, "a")]) == set()
    # A later failure raises the bar; delivering an earlier message does not lower it
    turns.note(msg(3, "a"), delivered=False)
    turns.note(msg(1, "a"), delivered=True)
    assert turns.held([msg(2, "a")]) == set() and turns.held([msg(4, "a")]) == {("s", "a")}
    # Once the highest one not delivered is delivered, the key is free again
    turns.note(msg(3, "a"), delivered=True)
    assert turns.held([msg(4, "a")]) == set()


def test_a_message_given_back_untried_still_waits_for_the_earlier_failure():
    # Given a batch where 66 failed and 67, behind it, was given back untried
    turns = KeyTurns()
    turns.note(msg(66, "a"), delivered=False)
    turns.note(msg(67, "a"), delivered=False)
    # When 67 is claimed again (66 waiting for its retry, or failing again), it is held back
    assert turns.held([msg(67, "a")]) == {("s", "a")}
    turns.note(msg(66, "a"), delivered=False)
    assert turns.held([msg(67, "a")]) == {("s", "a")}
    # And once 66 is delivered it may go
    turns.note(msg(66, "a"), delivered=True)
    assert turns.held([msg(67, "a")]) == set()


def test_a_failure_holds_only_batches_claimed_before_its_write_committed():
    turns = KeyTurns()
    epoch_before = turns.committed
    write = turns.next_write()
    turns.note(msg(1, "a"), delivered=False, write=write)
    # A batch claimed ahead, before the write committed, did not see the failure: held
    assert turns.held([msg(2, "a")], epoch_before) == {("s", "a")}
    turns.write_committed(write)
    # Claimed after it committed: the claim saw the failure and kept the order itself
    # (another invocation may since have delivered the failed message)
    assert turns.held([msg(2, "a")], turns.committed) == set()
    # Forgotten for good: claims come in order, so no later batch needs it
    assert turns.held([msg(3, "a")]) == set()
    # Writes commit in order: a later failure, its write not committed, still holds
    later = turns.next_write()
    turns.note(msg(4, "a"), delivered=False, write=later)
    assert turns.held([msg(5, "a")], turns.committed) == {("s", "a")}
    assert turns.held([msg(5, "a")]) == {("s", "a")}  # epoch unknown: every failure holds


def test_a_keys_messages_stay_in_one_script_call(monkeypatch):
    monkeypatch.setattr(redis_script, "SCRIPT_CHUNK", 4)
    group = [msg(i, "a" if i % 3 == 0 else None) for i in range(1, 13)]
    chunks = redis_script.script_calls(group)
    assert [m.seq for c in chunks for m in c if m.key == "a"] == [3, 6, 9, 12]
    assert sum(1 for c in chunks if any(m.key == "a" for m in c)) == 1
    assert sorted(m.seq for c in chunks for m in c) == list(range(1, 13))
    assert all(len(c) <= 4 for c in chunks if not any(m.key == "a" for m in c))
    # Each call keeps the batch's order
    assert all([m.seq for m in c] == sorted(m.seq for m in c) for c in chunks)


def test_a_failed_call_fails_the_first_of_each_key_and_gives_the_rest_back():
    batch = [msg(1, "a"), msg(2, "a"), msg(3, None), msg(4, "b"), msg(5, None)]
    results = redis_script.all_failed(batch, ErrorClass.DOWNSTREAM_UNAVAILABLE, "redis: OOM")
    assert [r.error_class for r in results] == [
        ErrorClass.DOWNSTREAM_UNAVAILABLE, ErrorClass.NOT_ATTEMPTED, ErrorClass.DOWNSTREAM_UNAVAILABLE,
        ErrorClass.DOWNSTREAM_UNAVAILABLE, ErrorClass.DOWNSTREAM_UNAVAILABLE]


def test_a_dead_letter_holds_its_key_back_under_block_only():
    # Under skip the claim lets a dead head's successors go: holding them here would
    # give them back on every claim until the deadline
    skip, block = KeyTurns(skip_dead=True), KeyTurns(skip_dead=False)
    for turns in (skip, block):
        turns.note(msg(1, "a"), delivered=False, dead=True)
        turns.note(msg(2, "a"), delivered=False)  # given back untried behind it
    assert skip.held([msg(2, "a"), msg(3, "a")]) == set()
    assert block.held([msg(2, "a"), msg(3, "a")]) == {("s", "a")}
