"""Message ids made in Python are UUIDv7 (RFC 9562, docs/decisions/0060): the
layout, the clock, their order, and every producer call that makes one."""

from __future__ import annotations

import threading
import time
import uuid

from test_enqueue_validation import RecordingConnection

from outbox_relay import ids
from outbox_relay.ids import uuid7
from outbox_relay.producer import (
    enqueue_email,
    enqueue_event,
    enqueue_eventbridge,
    enqueue_events_bulk,
    enqueue_sns,
    enqueue_sqs,
)
from support.uuid_fields import fields


def test_the_layout_is_the_rfc_s_and_the_time_is_the_clock_s():
    before = time.time()
    u = uuid7()
    after = time.time()
    ms, ver, _, var, _ = fields(u)
    assert (ver, var) == (7, 0b10) and (u.version, u.variant) == (7, uuid.RFC_4122)
    assert before - 1 < ms / 1000 < after + 1
    assert u.bytes[:6] == ms.to_bytes(6, "big")  # big-endian, first


def test_ids_made_in_sequence_sort_in_that_order_as_uuids_and_as_text():
    made = [uuid7() for _ in range(20_000)]
    assert len(set(made)) == len(made)
    assert sorted(made) == made
    assert sorted(str(u) for u in made) == [str(u) for u in made]


def test_a_clock_that_stands_still_or_goes_back_still_gives_rising_ids(monkeypatch):
    monkeypatch.setattr(ids, "_last", 0)  # this test's own sequence, left as it was afterwards
    now = [1_767_225_600_123_999_000]  # 2026-01-01, late in its millisecond
    monkeypatch.setattr(ids.time, "time_ns", lambda: now[0])
    first = uuid7()
    assert fields(first)[:3] == (1_767_225_600_123, 7, 999 * 4096 // 1000)
    standing = [uuid7() for _ in range(100)]  # the same clock reading: one step each, into the next ms
    now[0] -= 5_000_000_000  # set back five seconds
    back = [uuid7() for _ in range(10)]
    made = [first, *standing, *back]
    assert sorted(made) == made and len(set(made)) == len(made)
    steps = [fields(u)[0] << 12 | fields(u)[2] for u in made]
    assert steps == list(range(steps[0], steps[0] + len(made)))
    assert fields(made[-1])[0] == 1_767_225_600_124  # carried into the next millisecond, not back in time
    assert len({fields(u)[4] for u in made}) == len(made)  # rand_b is random, not a counter


def test_threads_of_one_process_never_make_the_same_id_and_each_sees_its_own_rising():
    made: dict[int, list[uuid.UUID]] = {}

    def make(i: int) -> None:
        made[i] = [uuid7() for _ in range(3000)]

    threads = [threading.Thread(target=make, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(sorted(m) == m for m in made.values())
    assert len({u for m in made.values() for u in m}) == 4 * 3000


def test_every_producer_call_makes_a_v7_id_and_keeps_a_given_one_as_given():
    given = uuid.uuid4()
    calls = [
        lambda **kw: enqueue_event(conn, stream="orders", type="t", payload={}, **kw),
        lambda **kw: enqueue_email(conn, to=["a@example.com"], subject="s", text="t", **kw),
        lambda **kw: enqueue_sqs(conn, type="t", payload={}, **kw),
        lambda **kw: enqueue_sns(conn, type="t", payload={}, **kw),
        lambda **kw: enqueue_eventbridge(conn, type="t", payload={}, **kw),
    ]
    for call in calls:
        conn = RecordingConnection()
        made = call()
        assert made.version == 7 and conn.calls[0][1]["message_id"] == made
        conn = RecordingConnection()
        assert call(message_id=str(given)) == given and conn.calls[0][1]["message_id"] == given
    conn = RecordingConnection()
    bulk = enqueue_events_bulk(conn, [dict(stream="s", type="t", payload={"n": i}) for i in range(50)]
                               + [dict(stream="s", type="t", payload={}, message_id=given)])
    assert all(u.version == 7 for u in bulk[:-1]) and sorted(bulk[:-1]) == bulk[:-1] and bulk[-1] == given
