"""Two transactions enqueue under one message id at the same time.

The second INSERT waits for the first transaction; once that commits, the row
is not visible to the second statement's snapshot, so the comparison must be
made again by a new statement. A different message under the id is refused
(nothing is dropped silently); the same message is a no-op.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from outbox_relay.errors import InvalidMessageError
from outbox_relay.producer import enqueue_event, enqueue_events_bulk

WAITER = "outbox-race-waiter"


def wait_until_blocked(watcher, timeout: float = 10.0) -> None:
    """Until the waiter's statement waits on a lock (the first transaction's row)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with watcher.connect() as conn:
            if conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a "
                                 "AND wait_event_type = 'Lock'"), {"a": WAITER}).scalar_one():
                return
        time.sleep(0.02)
    raise AssertionError("the second writer never waited for the first")


def race(database_url: str, first, second) -> dict:
    """Run `first(conn)` in a transaction, start `second(conn)` in another one,
    wait until it blocks on the first, then commit the first."""
    one = create_engine(database_url, poolclass=NullPool)
    two = create_engine(database_url, poolclass=NullPool, connect_args={"application_name": WAITER})
    watcher = create_engine(database_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    outcome: dict = {}

    def run_second() -> None:
        try:
            with two.begin() as conn:
                outcome["ids"] = second(conn)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            outcome["error"] = exc

    try:
        with one.begin() as conn:
            first(conn)
            thread = threading.Thread(target=run_second)
            thread.start()
            wait_until_blocked(watcher)
        thread.join(20)
        assert not thread.is_alive()
        with watcher.connect() as conn:
            outcome["rows"] = conn.execute(text(
                "SELECT b.payload FROM outbox_message o JOIN outbox_message_body b ON b.seq = o.seq "
                "ORDER BY o.seq")).scalars().all()
    finally:
        for engine in (one, two, watcher):
            engine.dispose()
    return outcome


@pytest.mark.parametrize("second_payload, refused", [({"v": 2}, True), ({"v": 1}, False)])
def test_enqueue_event_compares_with_a_message_committed_while_it_waited(database_url, redis_prefix,
                                                                         second_payload, refused):
    mid = uuid.uuid4()
    stream = redis_prefix + "orders"
    out = race(database_url,
               lambda c: enqueue_event(c, stream=stream, type="t", payload={"v": 1}, message_id=mid),
               lambda c: enqueue_event(c, stream=stream, type="t", payload=second_payload, message_id=mid))
    if refused:
        assert isinstance(out.get("error"), InvalidMessageError) and out["error"].field == "message_id"
    else:
        assert "error" not in out and out["ids"] == mid
    assert out["rows"] == [{"v": 1}]


@pytest.mark.parametrize("second_payload, refused", [({"v": 2}, True), ({"v": 1}, False)])
def test_enqueue_events_bulk_compares_with_messages_committed_while_it_waited(database_url, redis_prefix,
                                                                              second_payload, refused):
    mid = uuid.uuid4()
    stream = redis_prefix + "orders"
    # with a key: a comparison with a holder it cannot see must not read as "different"
    first = [dict(stream=stream, type="t", payload={"v": 1}, key="k", message_id=mid)]
    second = [dict(stream=stream, type="t", payload={"v": 0}),
              dict(stream=stream, type="t", payload=second_payload, key="k", message_id=mid)]
    out = race(database_url, lambda c: enqueue_events_bulk(c, first), lambda c: enqueue_events_bulk(c, second))
    if refused:
        assert isinstance(out.get("error"), InvalidMessageError) and out["error"].field == "messages[1].message_id"
        assert out["rows"] == [{"v": 1}]  # the refused call's transaction left nothing
    else:
        assert "error" not in out and out["ids"][1] == mid
        assert out["rows"] == [{"v": 1}, {"v": 0}]
