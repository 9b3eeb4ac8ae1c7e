"""Durations as operators type them (`7d`, `1h30m`, `3600`, `P7D`) and as
the command line prints them (`5m 3s`). Values travel as seconds."""

from __future__ import annotations

import re
from datetime import timedelta

from pydantic import TypeAdapter, ValidationError

_UNIT_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_FRIENDLY = re.compile(r"(\d+(?:\.\d+)?)([wdhms])", re.IGNORECASE)
_TIMEDELTA = TypeAdapter(timedelta)
#: Longest duration accepted: 100 years. Every window is subtracted from the
#: database's now(), and far longer ones leave PostgreSQL's timestamp range.
MAX_DURATION_SECONDS = 36_525 * 86400


def parse_duration(value: str) -> float:
    """Parse a duration and return it in seconds (float, > 0).

    Accepted forms:
    - friendly: a number and a unit, repeatable: ``7d``, ``12h``, ``30m``,
      ``90s``, ``2w``, ``1h30m`` or ``1h 30m`` (w weeks, d days, h hours, m minutes, s seconds);
    - plain seconds: ``3600``;
    - ISO 8601 durations as pydantic parses them: ``P7D``, ``PT12H``, ``P1DT6H``.

    At most `MAX_DURATION_SECONDS` (100 years). Raises `ValueError` saying which
    forms are accepted.
    """
    raw = re.sub(r"\s+", "", value)
    seconds: float | None = None
    if re.fullmatch(r"(?:\d+(?:\.\d+)?[wdhms])+", raw, re.IGNORECASE):
        seconds = sum(float(n) * _UNIT_SECONDS[u.lower()] for n, u in _FRIENDLY.findall(raw))
    elif re.fullmatch(r"\d+(?:\.\d+)?", raw):
        seconds = float(raw)
    elif raw[:1] in ("P", "p"):
        try:
            seconds = _TIMEDELTA.validate_python(raw.upper()).total_seconds()
        except (ValidationError, OverflowError):
            seconds = None
    if seconds is None:
        raise ValueError(f"{value[:40]!r} is not a duration; use e.g. 7d, 12h, 30m, 90s, 1h30m, "
                         "plain seconds, or ISO 8601 (P7D, PT12H)")
    if seconds <= 0:
        raise ValueError(f"{value[:40]!r}: a duration must be longer than zero")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{value[:40]!r}: a duration must be at most 100 years (36525d)")
    return seconds


def format_seconds(seconds: float) -> str:
    """A short human form of a duration in seconds: ``42s``, ``5m 3s``, ``2h 10m``, ``3d 4h``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def format_duration(seconds: float) -> str:
    """Every duration of a table in one convention, down to milliseconds:
    ``0s``, ``12ms``, ``7.4s``, ``48s``, then as `format_seconds` (``5m 3s``)."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 9950:
        return f"{ms / 1000:.1f}s"
    return format_seconds(seconds)
