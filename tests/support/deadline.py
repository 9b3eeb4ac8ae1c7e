"""Deadlines for tests that run the relay in process, as a Lambda context gives them."""

from __future__ import annotations

import time

from outbox_relay.publishers.base import Deadline


def countdown(seconds: float, margin: float = 0.5) -> Deadline:
    """A deadline `seconds` from now by the monotonic clock, `margin` seconds kept in reserve."""
    end = time.monotonic() + seconds + margin
    return Deadline(lambda: max(0, int((end - time.monotonic()) * 1000)), margin_seconds=margin)
