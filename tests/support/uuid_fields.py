"""A UUID's fields as RFC 9562 section 5.7 lays out a UUIDv7, to check the ids against."""

from __future__ import annotations

import uuid


def fields(u: uuid.UUID) -> tuple[int, int, int, int, int]:
    """(unix_ts_ms, ver, rand_a, var, rand_b)."""
    n = u.int
    return n >> 80, (n >> 76) & 0xF, (n >> 64) & 0xFFF, (n >> 62) & 0b11, n & ((1 << 62) - 1)
