"""What the relay records for each delivery result (relay.to_outcome)."""

import uuid

import pytest

from outbox_relay.backoff import Backoff
from outbox_relay.loop import RelayPolicy
from outbox_relay.models import ClaimedMessage, DeliveryResult, ErrorClass, OutcomeKind, Status
from outbox_relay.recording import to_outcome

POLICY = RelayPolicy(batch_size=10, lease_seconds=120,
                     backoff=Backoff(base=1, cap=100, floor=0, uniform=lambda lo, hi: hi),
                     throttle_delay_seconds=3)
MSG = ClaimedMessage(1, str(uuid.uuid4()), Status.LEASED, "s", "t", None, "{}", None, 4, 10, "2026-01-01T00:00:00Z")


@pytest.mark.parametrize(
    ("result", "kind", "delay"),
    [
        (DeliveryResult(1, delivery_ref="1-0"), OutcomeKind.DELIVERED, 0.0),
        (DeliveryResult(1, error_class=ErrorClass.PERMANENT, error="bad"), OutcomeKind.DEAD, 0.0),
        (DeliveryResult(1, error_class=ErrorClass.TRANSIENT, error="net"), OutcomeKind.RETRY, 8.0),  # 1*2^(4-1)
        (DeliveryResult(1, error_class=ErrorClass.TRANSIENT, retry_after_seconds=30), OutcomeKind.RETRY, 30.0),
        (DeliveryResult(1, error_class=ErrorClass.THROTTLED), OutcomeKind.RELEASE, 3.0),
        (DeliveryResult(1, error_class=ErrorClass.THROTTLED, retry_after_seconds=3600), OutcomeKind.RELEASE, 3600.0),
        (DeliveryResult(1, error_class=ErrorClass.DOWNSTREAM_UNAVAILABLE), OutcomeKind.RELEASE, 0.0),
        (DeliveryResult(1, error_class=ErrorClass.CONFIGURATION), OutcomeKind.RELEASE, 0.0),
        (DeliveryResult(1, error_class=ErrorClass.NOT_ATTEMPTED), OutcomeKind.RELEASE, 0.0),
    ],
)
def test_outcome_table(result, kind, delay):
    outcome = to_outcome(result, MSG, POLICY.backoff, POLICY.throttle_delay_seconds)
    assert outcome.kind is kind
    assert outcome.delay_seconds == delay
    assert outcome.error_class is result.error_class


def test_positional_constructors_build_the_same_tuples_as_the_keyword_ones():
    from outbox_relay.models import Outcome

    assert DeliveryResult.delivered(7, "1-0") == DeliveryResult(7, delivery_ref="1-0")
    assert type(DeliveryResult.delivered(7, "1-0")) is DeliveryResult
    assert DeliveryResult.delivered(7, "1-0").ok
    assert Outcome.delivered(7, "1-0") == Outcome(7, OutcomeKind.DELIVERED, delivery_ref="1-0")
    assert type(Outcome.delivered(7, None)) is Outcome
    assert to_outcome(DeliveryResult(7, delivery_ref="9-1"), MSG, POLICY.backoff, POLICY.throttle_delay_seconds) == Outcome.delivered(7, "9-1")
