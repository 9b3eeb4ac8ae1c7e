"""A transaction whose statement met a row another one moved across partitions is run again,
after a jittered wait that doubles, as several pollers recording at once can move the next rows."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from sqlalchemy.exc import DBAPIError

from outbox_relay.db import MOVED_ROW_ATTEMPTS, MOVED_ROW_WAIT_SECONDS, run_with_retry


class Moved(Exception):
    pass


def moved() -> DBAPIError:
    return DBAPIError("claim", {}, Moved({"C": "40001", "M": "tuple to be locked was already moved to another "
                                                        "partition due to concurrent update"}))


class FakeEngine:
    @contextmanager
    def begin(self):
        yield None


def test_a_moved_row_is_waited_for_then_tried_again_until_it_succeeds():
    failures, waits = [moved() for _ in range(MOVED_ROW_ATTEMPTS - 1)], []

    def work(_conn):
        if failures:
            raise failures.pop()
        return "claimed"

    assert run_with_retry(FakeEngine(), work, sleep=waits.append) == "claimed"
    assert len(waits) == MOVED_ROW_ATTEMPTS - 1
    assert all(0 <= w <= MOVED_ROW_WAIT_SECONDS * 2 ** i for i, w in enumerate(waits)), waits
    assert sum(waits) > 0


def test_after_the_last_attempt_the_error_is_raised_and_other_errors_at_once():
    waits: list[float] = []
    with pytest.raises(DBAPIError):
        run_with_retry(FakeEngine(), lambda _c: (_ for _ in ()).throw(moved()), sleep=waits.append)
    assert len(waits) == MOVED_ROW_ATTEMPTS - 1
    other = DBAPIError("claim", {}, Moved({"C": "23505", "M": "duplicate key"}))
    with pytest.raises(DBAPIError):
        run_with_retry(FakeEngine(), lambda _c: (_ for _ in ()).throw(other), sleep=waits.append)
    assert len(waits) == MOVED_ROW_ATTEMPTS - 1
