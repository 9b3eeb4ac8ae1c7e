"""The publisher contract (`publishers/base.py`), run against every channel and the fake
(decision 0043): the same behaviours, judged only by what is observable: the rows in
PostgreSQL and what the downstream received. A new channel is done when it passes."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from outbox_relay.loop import RelayLoop
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.registry import CHANNELS
from support.channel_harnesses import HARNESSES, POLICY, Fault


def rows(engine) -> dict[str, dict[str, Any]]:
    """Every row by message id: status, attempts, last_error_class, delivery_ref, due_in (seconds)."""
    with engine.connect() as conn:
        return {r.message_id: dict(r._mapping) for r in conn.execute(text(
            "SELECT message_id::text AS message_id, seq, status, attempts, last_error_class, delivery_ref, "
            "EXTRACT(EPOCH FROM available_at - now())::float8 AS due_in FROM outbox_message ORDER BY seq"))}


def make_due(engine) -> None:
    """Bring every pending row's retry time to now (instead of waiting out the backoff)."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET available_at = now() WHERE status = 'pending'"))


def invoke(store, publisher, deadline: Deadline, owner: str):
    """One batch-mode invocation, entered as the handler enters it (`begin`, then the loop)."""
    return RelayLoop(store, publisher, POLICY, deadline, owner).run()


def state(row: dict[str, Any]) -> tuple[str, int, str | None]:
    return row["status"], row["attempts"], row["last_error_class"]


def test_every_registered_channel_has_a_harness() -> None:
    # A channel without a harness would skip the suite: its definition of done is passing it.
    missing = {spec.name for spec in CHANNELS} - set(HARNESSES)
    assert not missing, f"channels with no contract harness (tests/support/channel_harnesses.py): {missing}"


def test_delivers_each_message_once_with_a_delivery_ref(harness, store, app_engine, plenty) -> None:
    # Given two messages without a key and one with
    ids = harness.enqueue(2) + harness.enqueue(1, key="k")
    # When one invocation runs
    summary = invoke(store, harness.publisher(), plenty, "owner")
    # Then each was received once and its row is delivered, on its first attempt, saying where it landed
    assert summary.delivered == 3
    assert sorted(harness.received()) == sorted(ids)
    assert {state(r) for r in rows(app_engine).values()} == {("delivered", 1, None)}
    assert all(r["delivery_ref"] for r in rows(app_engine).values())


def test_the_message_id_is_the_dedupe_key(harness, store, app_engine, plenty) -> None:
    # Given a message delivered, and delivered again (its acknowledgement was lost)
    [mid] = harness.enqueue(1)
    claimed = store.claim("owner", 10, 30).messages
    publisher = harness.publisher()
    for _ in range(2):
        publisher.deliver(claimed, plenty, lambda results: None)
    # Then every copy the downstream holds carries the message id, for the consumer to dedupe on;
    # a downstream that deduplicates holds one
    got = harness.received()
    assert got and set(got) == {mid}
    assert len(got) == (1 if harness.dedupes else 2)


def test_a_transient_failure_is_retried_with_backoff_then_dead_lettered(harness, store, app_engine, plenty) -> None:
    # Given a message whose downstream fails transiently, allowed two attempts, beside a healthy one
    [victim] = harness.enqueue(1, target=harness.fault(Fault.TRANSIENT), max_attempts=2)
    [healthy] = harness.enqueue(1)
    # When an invocation runs
    invoke(store, harness.publisher(), plenty, "a")
    # Then it waits for a retry after the backoff, its attempt counted; the healthy one went
    row = rows(app_engine)[victim]
    assert state(row) == ("pending", 1, "transient")
    assert 890 <= row["due_in"] <= 2000
    assert harness.received() == [healthy]
    # When it is due again and fails again
    make_due(app_engine)
    invoke(store, harness.publisher(), plenty, "b")
    # Then its attempts are used up: dead-lettered, never received
    assert state(rows(app_engine)[victim]) == ("dead", 2, "transient")
    assert harness.received() == [healthy]


def test_a_permanent_failure_is_dead_lettered_at_once(harness, store, app_engine, plenty) -> None:
    # Given a message the downstream refuses as bad (three attempts allowed)
    [victim] = harness.enqueue(1, target=harness.fault(Fault.PERMANENT))
    # When an invocation runs
    invoke(store, harness.publisher(), plenty, "a")
    # Then it is dead after one attempt, not retried
    assert state(rows(app_engine)[victim]) == ("dead", 1, "permanent")
    assert harness.received() == []


def test_throttling_refunds_the_attempt_and_defers(harness, store, app_engine, plenty) -> None:
    # Given a message the downstream asks us to slow down for, beside a healthy one
    [victim] = harness.enqueue(1, target=harness.fault(Fault.THROTTLED))
    [healthy] = harness.enqueue(1)
    # When an invocation runs
    invoke(store, harness.publisher(), plenty, "a")
    # Then it is pending with its attempt refunded, due after the throttle delay, not the backoff
    row = rows(app_engine)[victim]
    assert state(row) == ("pending", 0, "throttled")
    assert 250 <= row["due_in"] <= 300.5
    assert harness.received() == [healthy]
    # And once the downstream takes it, it goes
    harness.heal()
    make_due(app_engine)
    invoke(store, harness.publisher(), plenty, "b")
    assert state(rows(app_engine)[victim])[:2] == ("delivered", 1)


def test_the_gate_closes_while_the_downstream_is_unavailable(harness, store, app_engine, plenty) -> None:
    # Given a publisher that delivered, then its downstream became unavailable
    publisher = harness.publisher()
    harness.enqueue(1)
    assert invoke(store, publisher, plenty, "a").delivered == 1
    harness.cut()
    ids = harness.enqueue(2)
    # When an invocation runs
    summary = invoke(store, publisher, plenty, "b")
    # Then the gate gives a reason and nothing is claimed: no attempt is spent
    assert publisher.gate()
    assert summary.gate_closed and summary.claimed == 0
    assert [state(rows(app_engine)[i]) for i in ids] == [("pending", 0, None)] * 2
    assert len(harness.received()) == 1


def test_a_poisoned_key_holds_back_only_itself_and_keys_keep_their_order(harness, store, app_engine,
                                                                        plenty) -> None:
    # Given a key whose first message fails transiently, a healthy key, and messages without a key
    poisoned = harness.enqueue(3, key="poisoned", target=harness.fault(Fault.TRANSIENT))
    healthy = harness.enqueue(3, key="healthy")
    loose = harness.enqueue(2)
    # When an invocation runs
    invoke(store, harness.publisher(), plenty, "a")
    # Then the healthy key went in its order and the unkeyed messages went
    got = harness.received()
    assert [m for m in got if m in healthy] == healthy
    assert sorted(m for m in got if m in loose) == sorted(loose)
    # And the poisoned key's head waits for its retry; the rest of the key was not attempted
    by_id = rows(app_engine)
    assert state(by_id[poisoned[0]]) == ("pending", 1, "transient")
    assert [by_id[m]["attempts"] for m in poisoned[1:]] == [0, 0]
    assert not set(got) & set(poisoned)
    # When the downstream heals and the head is due, the key goes, in its order
    harness.heal()
    make_due(app_engine)
    invoke(store, harness.publisher(), plenty, "b")
    assert [m for m in harness.received() if m in poisoned] == poisoned
    assert {rows(app_engine)[m]["status"] for m in poisoned} == {"delivered"}


def test_the_deadline_is_respected(harness, store, app_engine) -> None:
    # Given messages, and a deadline within the margin (4 s left, 5 s kept in reserve)
    ids = harness.enqueue(2)
    passed = Deadline(lambda: 4_000, margin_seconds=5)
    publisher = harness.publisher()
    # When an invocation runs: nothing is claimed
    summary = invoke(store, publisher, passed, "a")
    assert summary.claimed == 0
    assert [state(rows(app_engine)[i]) for i in ids] == [("pending", 0, None)] * 2
    # When messages claimed earlier are handed to the publisher past the deadline
    results: list = []
    publisher.deliver(store.claim("b", 10, 30).messages, passed, results.extend)
    # Then it starts no delivery, and reports none delivered
    assert harness.received() == []
    assert not [r for r in results if r.error_class is None]


def test_a_partial_batch_failure_is_classified_per_entry(harness, store, app_engine, plenty) -> None:
    # Given one batch: two healthy messages and one for each fault
    healthy = harness.enqueue(2)
    victims = {kind: harness.enqueue(1, target=harness.fault(kind))[0] for kind in Fault}
    # When one invocation delivers it in one claim
    summary = invoke(store, harness.publisher(), plenty, "a")
    assert summary.claimed == 5
    # Then each entry has its own outcome
    by_id = rows(app_engine)
    assert [state(by_id[m]) for m in healthy] == [("delivered", 1, None)] * 2
    assert state(by_id[victims[Fault.TRANSIENT]]) == ("pending", 1, "transient")
    assert state(by_id[victims[Fault.PERMANENT]]) == ("dead", 1, "permanent")
    assert state(by_id[victims[Fault.THROTTLED]]) == ("pending", 0, "throttled")
    assert sorted(harness.received()) == sorted(healthy)
