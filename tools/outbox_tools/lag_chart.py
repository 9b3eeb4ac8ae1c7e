"""The delivery lag of `outbox stats --chart` as a small terminal chart: one
column per slice of the window, its height the slice's largest lag, drawn in
Unicode block characters (eighths of a row), no colour; fits 80 columns."""

from __future__ import annotations

from typing import Sequence

from .durations import format_duration, format_seconds

#: A cell filled to 0/8 … 8/8 of its height.
EIGHTHS = " ▁▂▃▄▅▆▇█"
#: Width of the labels left of the chart's axis.
LABEL_WIDTH = 8


def render(channel: str, max_ms: Sequence[float | None], delivered: Sequence[int], *, window_seconds: float,
           height: int = 6) -> list[str]:
    """The chart's lines: a title, `height` rows of columns (a slice with nothing
    delivered stays blank; any delivery shows at least an eighth), the axis, and
    the window's start and end under it."""
    width = len(max_ms)
    top = max((v for v in max_ms if v is not None), default=0.0)
    eighths = [None if v is None else (max(1, round(v / top * height * 8)) if top > 0 else 1) for v in max_ms]
    bucket = window_seconds / width if width else window_seconds
    lines = [f"{channel}: largest delivery lag per {format_duration(bucket)} of the last "
             f"{format_seconds(window_seconds)} ({sum(delivered):,} delivered)"]
    for row in range(height, 0, -1):
        label = (format_duration(top / 1000) if row == height
                 else format_duration(top / 2000) if row == (height + 1) // 2 else "")
        cells = "".join(" " if e is None else EIGHTHS[min(8, max(0, e - (row - 1) * 8))] for e in eighths)
        lines.append(f"{label:>{LABEL_WIDTH}} ┤{cells}".rstrip())
    lines.append(f"{'0':>{LABEL_WIDTH}} └{'─' * width}")
    start = f"-{format_seconds(window_seconds)}"
    lines.append(" " * (LABEL_WIDTH + 2) + start + "now".rjust(width - len(start)))
    return lines
