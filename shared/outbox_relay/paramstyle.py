"""pg8000's placeholder conversion, done once per statement text: pg8000 rescans each
statement in Python on every execute, and for the `format` style the result depends
on the text only."""

from __future__ import annotations

from typing import Any


def memoize_paramstyle_conversion() -> None:
    """Idempotent; the cache empties when full, so SQL built at run time cannot grow it."""
    try:
        import pg8000.legacy as legacy
    except ImportError:  # pragma: no cover - pg8000 is a dependency
        return
    original = getattr(legacy, "convert_paramstyle", None)
    if original is None or getattr(original, "outbox_memoized", False):
        return
    cache: dict[str, str] = {}

    def convert_paramstyle(style: str, query: str, args: Any) -> tuple[str, Any]:
        if style != "format":
            return original(style, query, args)
        statement = cache.get(query)
        if statement is None:
            statement, vals = original(style, query, args)
            if len(query) <= _PARAMSTYLE_CACHE_MAX_CHARS:
                if len(cache) >= _PARAMSTYLE_CACHE_SIZE:
                    cache.clear()
                cache[query] = statement
            return statement, vals
        return statement, args

    convert_paramstyle.outbox_memoized = True  # type: ignore[attr-defined]
    convert_paramstyle.original = original  # type: ignore[attr-defined]
    convert_paramstyle.cache = cache  # type: ignore[attr-defined]
    legacy.convert_paramstyle = convert_paramstyle


_PARAMSTYLE_CACHE_SIZE = 64
_PARAMSTYLE_CACHE_MAX_CHARS = 16_000
