"""Deadlines for tests that run the relay in process, as a Lambda context gives them."""

from __future__ import annotations

import threading
import time
from typing import Callable

from outbox_relay.publishers.base import Deadline


def countdown(seconds: float, margin: float = 0.5) -> Deadline:
    """A deadline `seconds` from now by the monotonic clock, `margin` seconds kept in reserve."""
    end = time.monotonic() + seconds + margin
    return Deadline(lambda: max(0, int((end - time.monotonic()) * 1000)), margin_seconds=margin)


def until(event: threading.Event, seconds: float = 1.0, margin: float = 0.2, bound: float = 120.0) -> Deadline:
    """A deadline that comes `seconds` after `event` is set (as a Lambda's nears its end),
    or after `bound` seconds: the test, not the machine's speed, says how long a run lasts."""
    end = [time.monotonic() + bound]

    def remaining_ms() -> int:
        if event.is_set() and end[0] > time.monotonic() + seconds + margin:
            end[0] = time.monotonic() + seconds + margin
        return max(0, int((end[0] - time.monotonic()) * 1000))

    return Deadline(remaining_ms, margin_seconds=margin)


def wait_for(condition, seconds: float = 60.0, what: str = "the condition") -> None:
    """Wait until `condition()` is true, failing after `seconds` (generous: a loaded machine)."""
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, f"{what}: not within {seconds} s"
        time.sleep(0.02)


def until_idle(idle: float = 1.5, margin: float = 0.5, bound: float = 120.0) -> tuple[Deadline, Callable]:
    """A latency invocation's deadline `idle` seconds after its last claim that found
    messages (pass the second value as `on_progress`), within `bound` seconds: it runs as
    long as the work takes, however loaded the machine, then as long idle."""
    start = time.monotonic()
    last, claimed = [start], [0]

    def on_progress(summary) -> None:
        # By the count claimed: with the gate closed no claim runs, and the last one's finding stays.
        if summary.claimed > claimed[0]:
            last[0], claimed[0] = time.monotonic(), summary.claimed

    def remaining_ms() -> int:
        end = min(last[0] + idle, start + bound) + margin
        return max(0, int((end - time.monotonic()) * 1000))

    return Deadline(remaining_ms, margin_seconds=margin), on_progress
