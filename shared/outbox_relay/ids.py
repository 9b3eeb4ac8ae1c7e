"""Message ids: UUIDv7, the millisecond's fraction in rand_a (RFC 9562 6.2, method 3), as
SQL's `outbox_uuidv7()` makes them (docs/decisions/0060); sorted in the order made."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last = 0  # the last id's first 60 bits without the version: milliseconds << 12 | fraction


def uuid7() -> uuid.UUID:
    """A new UUIDv7, above every one made before it in this process."""
    global _last
    ns = time.time_ns()
    step = (ns // 1_000_000) << 12 | (ns % 1_000_000) * 4096 // 1_000_000
    with _lock:
        step = _last = max(step, _last + 1)
    rand_b = int.from_bytes(os.urandom(8), "big") >> 2
    return uuid.UUID(int=(step >> 12) << 80 | 7 << 76 | (step & 0xFFF) << 64 | 0b10 << 62 | rand_b)
