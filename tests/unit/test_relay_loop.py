"""The relay loop's branches (`loop.RelayLoop`), on fakes of the store and the
publisher: no sockets, every branch of docs/design.md's lifecycle."""

from __future__ import annotations

import pytest

from outbox_relay.backoff import Backoff
from outbox_relay.errors import StopBatch
from outbox_relay.loop import RelayLoop, RelayPolicy
from outbox_relay.models import DeliveryResult, ErrorClass, Status
from outbox_relay.publishers.base import Deadline
from support.fakes import FakePublisher, FakeStore, unavailable

POLICY = RelayPolicy(batch_size=10, lease_seconds=120, backoff=Backoff(base=4, cap=60, floor=0,
                                                                        uniform=lambda lo, hi: hi),
                     throttle_delay_seconds=2)
PLENTY = Deadline(lambda: 60_000, margin_seconds=5)


def test_a_closed_gate_claims_nothing():
    # Given five due messages and a downstream that refuses its PING
    store = FakeStore(5)

    # When one invocation runs
    summary = RelayLoop(store, FakePublisher(gate="redis unavailable (ConnectionError)"), POLICY, PLENTY, "me").run()

    # Then nothing was claimed and the summary says why
    assert store.claims == []
    assert (summary.claimed, summary.skipped, summary.gate_closed) == (0, "redis unavailable (ConnectionError)",
                                                                       True)


def test_no_time_left_claims_nothing():
    store = FakeStore(5)
    summary = RelayLoop(store, FakePublisher(), POLICY, Deadline(lambda: 4_000, margin_seconds=5), "me").run()
    assert store.claims == [] and summary.skipped == "not enough time left before the deadline"


def test_the_claim_is_bounded_by_the_publishers_limit_and_the_lease():
    # Given a publisher that can send three before the deadline
    store = FakeStore(10)
    RelayLoop(store, FakePublisher(limit=3), POLICY, PLENTY, "me").run()
    assert store.claims == [("me", 3)]
    assert sorted(s for s, (status, _) in store.status_of().items() if status == "delivered") == [1, 2, 3]


def test_every_result_becomes_its_outcome_in_one_write():
    # Given four messages whose deliveries end four ways
    store = FakeStore(4)
    answers = {1: DeliveryResult.delivered(1, "1-0"),
               2: DeliveryResult(2, error_class=ErrorClass.PERMANENT, error="WRONGTYPE"),
               3: DeliveryResult(3, error_class=ErrorClass.TRANSIENT, error="reset"),
               4: DeliveryResult(4, error_class=ErrorClass.THROTTLED, error="slow down")}

    # When one invocation runs
    summary = RelayLoop(store, FakePublisher(lambda m: answers[m.seq]), POLICY, PLENTY, "me").run()

    # Then one outcome write recorded them all: delivered; dead now; retried after the backoff
    # (attempt kept); released after the throttle delay (attempt refunded)
    assert len(store.records) == 1
    assert store.status_of() == {1: ("delivered", 1), 2: ("dead", 1), 3: ("pending", 1), 4: ("pending", 0)}
    assert store.rows[3].available_at == store.now + 4 and store.rows[4].available_at == store.now + 2
    assert (summary.delivered, summary.dead, summary.retried, summary.released, summary.throttled) == (1, 1, 1, 1, 1)
    assert summary.error_classes == {"permanent": 1, "transient": 1, "throttled": 1}


def test_a_lease_expired_with_no_attempts_left_is_counted_dead_on_claim():
    # Given a message whose holder died holding its last attempt
    store = FakeStore(1, attempts=3, max_attempts=3, status=Status.LEASED, lease_owner="dead",
                      lease_expires_at=0.0)

    summary = RelayLoop(store, FakePublisher(), POLICY, PLENTY, "me").run()

    assert store.status_of() == {1: ("dead", 3)}
    assert (summary.claimed, summary.dead, summary.error_classes) == (1, 1, {"lease_expired": 1})


@pytest.mark.parametrize(("failure", "stopped", "error_class"), [
    (unavailable(), "downstream_unavailable", ErrorClass.DOWNSTREAM_UNAVAILABLE),
    (StopBatch("ses MessageRejected: the configured sender is not verified"), "stop_batch", ErrorClass.CONFIGURATION),
])
def test_a_batch_stopped_mid_way_records_what_completed_and_refunds_the_rest(failure, stopped, error_class):
    # Given five messages, and a downstream lost after two were delivered
    store = FakeStore(5)
    publisher = FakePublisher(raise_after=failure, report_first=2)

    summary = RelayLoop(store, publisher, POLICY, PLENTY, "me").run()

    # Then the two are delivered, the other three pending again with their attempt refunded
    assert store.status_of() == {1: ("delivered", 1), 2: ("delivered", 1), 3: ("pending", 0), 4: ("pending", 0),
                                 5: ("pending", 0)}
    assert {store.rows[s].last_error_class for s in (3, 4, 5)} == {error_class.value}
    assert summary.stopped == stopped and summary.released == 3
    assert summary.error_classes == {error_class.value: 3}


def test_an_unexpected_error_releases_what_was_not_recorded_and_propagates():
    # Given a publisher with a bug that raises after one result
    store = FakeStore(3)
    publisher = FakePublisher(raise_after=KeyError("a bug"), report_first=1)

    with pytest.raises(KeyError):
        RelayLoop(store, publisher, POLICY, PLENTY, "me").run()

    # Then the completed one is recorded and the rest released, attempts refunded, saying why
    assert store.status_of() == {1: ("delivered", 1), 2: ("pending", 0), 3: ("pending", 0)}
    assert store.rows[2].last_error == "not recorded: the relay raised KeyError"
    assert store.rows[2].last_error_class == "not_attempted"


def test_messages_the_publisher_never_reported_are_released_not_attempted():
    # Given a publisher that ran out of time after the first two
    store = FakeStore(4)
    summary = RelayLoop(store, FakePublisher(lambda m: DeliveryResult.delivered(m.seq, "x") if m.seq <= 2 else None),
                        POLICY, PLENTY, "me").run()
    assert store.status_of() == {1: ("delivered", 1), 2: ("delivered", 1), 3: ("pending", 0), 4: ("pending", 0)}
    assert summary.error_classes == {"not_attempted": 2}
    assert store.rows[3].last_error == "not attempted before the deadline"


def test_a_deadline_passed_after_the_claim_delivers_nothing():
    # Given a clock that runs out between the claim and the delivery
    store = FakeStore(2)
    calls = iter([60_000] + [0] * 10)
    publisher = FakePublisher()

    RelayLoop(store, publisher, POLICY, Deadline(lambda: next(calls), margin_seconds=5), "me").run()

    assert publisher.delivered == [] and store.status_of() == {1: ("pending", 0), 2: ("pending", 0)}


def test_an_outcome_for_a_lease_lost_overwrites_nothing_and_is_counted():
    # Given a batch of which one message's lease was taken over by another holder
    store = FakeStore(3)
    store.steal = {2}

    summary = RelayLoop(store, FakePublisher(), POLICY, PLENTY, "me").run()

    assert summary.lease_lost == 1 and summary.delivered == 2
    assert store.status_of()[2] == ("leased", 1)


def test_results_for_messages_not_in_the_batch_are_ignored():
    store = FakeStore(1)
    publisher = FakePublisher(lambda m: DeliveryResult.delivered(m.seq + 100, "x"))
    summary = RelayLoop(store, publisher, POLICY, PLENTY, "me").run()
    # the stray result is dropped; the real message is released as not reported
    assert summary.delivered == 0 and store.status_of() == {1: ("pending", 0)}
