"""pg8000's placeholder conversion, done once per statement text (db.memoize_paramstyle_conversion).

The memoized conversion must give exactly what pg8000 gives, for any text,
and the relay's statements must still get their own parameters each time.
"""

from __future__ import annotations

import re

import pg8000
import pg8000.legacy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from outbox_relay import sql
from outbox_relay.config import load_settings
from outbox_relay.db import create_relay_engine, memoize_paramstyle_conversion

# Pieces of SQL text that drive pg8000's scanner into each of its states.
_PIECES = st.sampled_from([
    "SELECT ", "%s", "%%", ", ", "'a%sb'", "E'x\\'%s'", '"col%s"', "$$ %s $$", "-- note %s\n",
    "x", " ", "\n", "::int", "(", ")", "'it''s'", "%(name)s", ":name",
])


def _memoized():
    memoize_paramstyle_conversion()
    convert = pg8000.legacy.convert_paramstyle
    assert convert.outbox_memoized
    return convert


@pytest.fixture(autouse=True)
def _empty_cache():
    """The cache is process-wide: each test starts and ends with it empty."""
    _memoized().cache.clear()
    yield
    pg8000.legacy.convert_paramstyle.cache.clear()


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=30).map("".join), st.lists(st.integers(), max_size=5).map(tuple))
def test_memoized_conversion_is_pg8000s_own_first_and_second_time(query: str, args: tuple) -> None:
    convert = _memoized()
    try:
        expected = convert.original("format", query, args)
    except pg8000.InterfaceError as refused:  # e.g. "%(name)s" in the format style
        for _ in range(2):
            with pytest.raises(type(refused), match=re.escape(str(refused))):
                convert("format", query, args)
        assert query not in convert.cache
        return
    assert convert("format", query, args) == expected
    assert convert("format", query, args) == expected  # now from the cache
    other = tuple(a + 1 for a in args)
    assert convert("format", query, other) == (expected[0], other)


def test_other_paramstyles_are_not_cached() -> None:
    convert = _memoized()
    query = "SELECT :a, :b, :a -- memo test named"
    assert convert("named", query, {"a": 1, "b": 2}) == convert.original("named", query, {"a": 1, "b": 2})
    assert convert("named", query, {"a": 3, "b": 4})[1] == (3, 4)
    assert query not in convert.cache


def test_the_cache_stays_bounded_and_starts_again_when_full() -> None:
    from outbox_relay import db

    convert = _memoized()
    for i in range(db._PARAMSTYLE_CACHE_SIZE * 3):
        assert convert("format", f"SELECT %s + {i}", (1,)) == (f"SELECT $1 + {i}", (1,))
        assert len(convert.cache) <= db._PARAMSTYLE_CACHE_SIZE
    long = "SELECT %s" + " " * db._PARAMSTYLE_CACHE_MAX_CHARS
    assert convert("format", long, (1,)) == ("SELECT $1" + " " * db._PARAMSTYLE_CACHE_MAX_CHARS, (1,))
    assert long not in convert.cache
    # the relay's statements fit
    for statement in (sql.relay.claim, sql.relay.record_outcomes):
        assert len(str(statement.compile(dialect=_pg8000_dialect()))) <= db._PARAMSTYLE_CACHE_MAX_CHARS


def _pg8000_dialect():
    from sqlalchemy.dialects.postgresql import pg8000 as dialect

    return dialect.dialect()


def test_install_is_idempotent() -> None:
    first = _memoized()
    memoize_paramstyle_conversion()
    assert pg8000.legacy.convert_paramstyle is first


def test_relay_engine_converts_each_statement_once_and_binds_fresh_parameters(database_url) -> None:
    engine = create_relay_engine(load_settings(database_url=database_url, database_tls="disable",
                                               channel="redis", redis_url="redis://unused"))
    convert = pg8000.legacy.convert_paramstyle
    statement = text("SELECT CAST(:a AS int) * 10 + CAST(:b AS int) AS v /* memo test */")
    try:
        with engine.connect() as conn:
            assert conn.execute(statement, {"a": 1, "b": 2}).scalar_one() == 12
            assert conn.execute(statement, {"a": 7, "b": 5}).scalar_one() == 75
            # the relay's own statements go through it too
            assert conn.execute(sql.relay.oldest_pending_age, {"channel": "redis"}).scalar_one() == 0
            assert conn.execute(sql.relay.oldest_pending_age, {"channel": "ses"}).scalar_one() == 0
        cached = {q: out for q, out in convert.cache.items() if "memo test" in q}
        assert list(cached.values()) == ["SELECT CAST($1 AS int) * 10 + CAST($2 AS int) AS v /* memo test */"]
    finally:
        engine.dispose()
