"""Message ids: UUIDv7, the millisecond's fraction in rand_a (RFC 9562 6.2, method 3), as
SQL's `outbox_uuidv7()` makes them (docs/decisions/0060); sorted in the order made."""

from __future__ import annotations

import os
import threading
import time
import uuid
from datetime import datetime, timedelta

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


#: How far ahead of the clock an id's time may be: a day is opened before its ids are accepted,
#: so an id further ahead could land in day 0 and later in its own day (docs/decisions/0066).
AHEAD_LIMIT = timedelta(days=1)


def check_not_ahead(message_id: uuid.UUID, now: datetime) -> uuid.UUID:
    """`message_id`, refused (ValueError) when it is a UUIDv7 more than `AHEAD_LIMIT` ahead of `now`."""
    if message_id.version == 7 and message_id.int >> 80 > (now + AHEAD_LIMIT).timestamp() * 1000:
        raise ValueError("is a UUIDv7 more than a day ahead of the clock")
    return message_id
