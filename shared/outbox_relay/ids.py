"""Message ids: UUIDv7 (RFC 9562, section 5.7), made here and by the SQL function
`outbox_uuidv7()` (migration 0013) to one layout (docs/decisions/0060):

- bits 0-47: the Unix time in milliseconds, big-endian;
- bits 48-51: the version, 7;
- bits 52-63 (rand_a): the fraction of the millisecond in 1/4096 steps
  (RFC 9562 section 6.2, method 3, increased clock precision);
- bits 64-65: the variant, binary 10;
- bits 66-127 (rand_b): random.

An id is never below the one made before it in this process: when the clock has
not moved past it (the same step, or a clock set back) the id takes the last
one's time plus one step, so ids made in sequence sort in that order.
"""

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
