"""pg8000's placeholder conversion, done once per statement text.

pg8000 rewrites a statement's `%s` placeholders (SQLAlchemy's `format`
paramstyle for pg8000) into `$1, $2, …` on every execute, with a scanner that
reads the text one character at a time in Python (`pg8000.legacy.convert_paramstyle`).
For the `format` style the result depends on the text only, so it is kept in a
dictionary keyed by the text.
"""

from __future__ import annotations

from typing import Any


def memoize_paramstyle_conversion() -> None:
    """Make pg8000 convert each distinct statement text's placeholders once per process.

    Texts longer than `_PARAMSTYLE_CACHE_MAX_CHARS` are not kept, and once
    `_PARAMSTYLE_CACHE_SIZE` texts are kept the dictionary starts again empty,
    so SQL built at run time (an `IN` list of varying length) cannot grow it;
    the relay's own handful of statements come back on their next use. Other
    paramstyles go straight to pg8000.

    This replaces `pg8000.legacy.convert_paramstyle` for the whole process
    (pg8000 looks it up in that module at each execute). If a pg8000 release
    moves it, this does nothing and statements are converted as before.
    Idempotent.
    """
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
