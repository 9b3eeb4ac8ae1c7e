"""LockedHeads: a key's first message found locked is confirmed only once this
relay has seen it locked by the same transaction for longer than any claim
holds a row, and forgotten once it has not been seen for long."""

from outbox_relay.store import LockedHeads


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_head_is_confirmed_after_the_confirmation_time_and_forgotten_when_not_seen():
    clock = Clock()
    heads = LockedHeads(confirm_seconds=0.5, forget_seconds=60, clock=clock)
    # A head seen once is not confirmed: a concurrent claim may hold it for a few milliseconds
    assert heads.seen(["7:100"]) == ("7:100",) and heads.confirmed() == []
    clock.now += 0.4
    assert heads.seen(["7:100", "9:5"]) == ("7:100", "9:5") and heads.confirmed() == []
    # Seen locked across the confirmation time: confirmed, so its key's rows are moved
    clock.now += 0.2
    assert heads.seen(["7:100"]) == () and heads.confirmed() == ["7:100"]
    # The same row locked by another transaction (two claims, each for a moment) starts over
    assert heads.seen(["7:101"]) == ("7:101",) and heads.confirmed() == ["7:100"]
    # Not seen while its rows are held (at most the longest hold) it stays confirmed
    clock.now += 59
    assert heads.confirmed() == ["7:100", "9:5", "7:101"]
    # Not seen for longer than that: forgotten, and seen again it starts over
    clock.now += 2
    assert heads.seen([]) == () and heads.confirmed() == []
    assert heads.seen(["7:100"]) == ("7:100",)
