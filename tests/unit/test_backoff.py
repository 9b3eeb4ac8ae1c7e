"""Backoff: the formula of backoff.py's docstring, checked by table and by property."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox_relay.backoff import Backoff


def upper(lo: float, hi: float) -> float:
    return hi


def lower(lo: float, hi: float) -> float:
    return lo


@pytest.mark.parametrize(
    ("attempts", "base", "cap", "expected_ceiling"),
    [
        (1, 1.0, 900.0, 1.0),
        (2, 1.0, 900.0, 2.0),
        (3, 1.0, 900.0, 4.0),
        (10, 1.0, 900.0, 512.0),
        (11, 1.0, 900.0, 900.0),  # capped
        (1, 0.5, 10.0, 0.5),
        (5, 0.5, 10.0, 8.0),
        (6, 0.5, 10.0, 10.0),
        (0, 2.0, 60.0, 2.0),  # attempts below 1 behave like the first retry
        (10_000, 1.0, 900.0, 900.0),  # no overflow
    ],
)
def test_ceiling_follows_capped_exponential(attempts, base, cap, expected_ceiling):
    # Given a backoff whose jitter draw is pinned to the top of its range
    backoff = Backoff(base=base, cap=cap, floor=0.0, uniform=upper)
    # Then the delay equals min(cap, base * 2 ** (n - 1))
    assert backoff.ceiling(attempts) == expected_ceiling
    assert backoff.delay(attempts) == expected_ceiling


def test_floor_applies_when_the_draw_is_zero():
    assert Backoff(base=1, cap=10, floor=0.25, uniform=lower).delay(3) == 0.25


@pytest.mark.parametrize("kwargs", [dict(base=0), dict(base=5, cap=1), dict(floor=-1), dict(cap=2, base=1, floor=3)])
def test_invalid_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        Backoff(**kwargs)


@given(
    attempts=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.001, max_value=100),
    cap_factor=st.floats(min_value=1, max_value=10_000),
    floor_share=st.floats(min_value=0, max_value=1),
)
def test_full_jitter_stays_within_floor_and_ceiling(attempts, base, cap_factor, floor_share):
    cap = base * cap_factor
    backoff = Backoff(base=base, cap=cap, floor=cap * floor_share * 0.01)
    delay = backoff.delay(attempts)
    assert backoff.floor <= delay <= max(backoff.floor, backoff.ceiling(attempts))
    assert backoff.ceiling(attempts) <= cap


def test_jitter_spreads_retries():
    backoff = Backoff(base=1, cap=900, floor=0)
    draws = {round(backoff.delay(8), 3) for _ in range(50)}
    assert len(draws) > 40  # full jitter: retries of one failure wave do not line up
