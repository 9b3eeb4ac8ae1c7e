"""A message's history (outbox_message_history): every attempt that did not
deliver and every later change, written by the statement that changed the
message, fenced with it, read back in order by `outbox show` with the delivery
from the row, and purged with the message."""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import text

from outbox_relay import sql
from outbox_relay.models import ErrorClass, Outcome, OutcomeKind
from outbox_relay.operations.dead import discard, get_message, history_of
from outbox_relay.operations.purge import purge
from outbox_relay.operations.redrive import RedriveSelection, redrive
from outbox_tools.cli import main
from support.plans import declared


def story(app_engine, seq: int) -> list[tuple]:
    return [(h.event, h.attempt, h.error_class, h.error, h.ref, h.actor, h.next_at is not None)
            for h in history_of(app_engine, get_message(app_engine, _id(app_engine, seq)))]


def stored_lines(app_engine) -> list[tuple]:
    with app_engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT seq, event FROM outbox_message_history ORDER BY seq, id"))]


def make_due(app_engine) -> None:
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET available_at = now() WHERE status = 'pending'"))


def test_each_outcome_is_a_line_with_its_attempt_error_reference_and_owner(enqueue, store, app_engine, rows):
    enqueue(1)
    # Attempt 1 fails and is retried
    (m,) = store.claim("poller-a", 10, 30).messages
    store.record("poller-a", [Outcome(m.seq, OutcomeKind.RETRY, ErrorClass.TRANSIENT, "timeout talking to redis",
                                      None, 5.0)])
    make_due(app_engine)
    # Attempt 2 finds the downstream unavailable: released, the attempt refunded
    (m,) = store.claim("poller-b", 10, 30).messages
    store.release("poller-b", [m.seq], delay_seconds=1.0, error_class=ErrorClass.DOWNSTREAM_UNAVAILABLE,
                  error="circuit open")
    make_due(app_engine)
    # Attempt 2 again, delivered
    (m,) = store.claim("poller-c", 10, 30).messages
    store.record("poller-c", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1700000000000-0")])

    assert story(app_engine, m.seq) == [
        ("retry", 1, "transient", "timeout talking to redis", None, "poller-a", True),
        ("released", 2, "downstream_unavailable", "circuit open", None, "poller-b", True),
        ("delivered", 2, None, None, "1700000000000-0", None, False),
    ]
    # the delivery is the row itself: no line stored for it
    assert stored_lines(app_engine) == [(m.seq, "retry"), (m.seq, "released")]
    assert rows()[0]["attempts"] == 2
    times = [h.at for h in history_of(app_engine, get_message(app_engine, _id(app_engine, m.seq)))]
    assert times == sorted(times)


def test_a_message_delivered_at_once_costs_no_line(enqueue, store, app_engine):
    enqueue(3)
    ms = store.claim("p", 10, 30).messages
    store.record("p", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref=f"1-{m.seq}") for m in ms])
    assert stored_lines(app_engine) == []
    assert story(app_engine, ms[0].seq) == [("delivered", 1, None, None, f"1-{ms[0].seq}", None, False)]


def test_the_last_retry_is_recorded_as_dead_and_a_dead_letter_as_dead(enqueue, store, app_engine):
    enqueue(2, max_attempts=1)
    a, b = store.claim("p", 10, 30).messages
    store.record("p", [Outcome(a.seq, OutcomeKind.RETRY, ErrorClass.TRANSIENT, "reset", None, 1.0),
                       Outcome(b.seq, OutcomeKind.DEAD, ErrorClass.PERMANENT, "stream is not a stream")])
    assert story(app_engine, a.seq) == [("dead", 1, "transient", "reset", None, "p", False)]
    assert story(app_engine, b.seq) == [("dead", 1, "permanent", "stream is not a stream", None, "p", False)]


def test_an_outcome_whose_lease_was_lost_writes_no_line(enqueue, store, app_engine, expire_leases):
    enqueue(1)
    (m,) = store.claim("owner-a", 10, 30).messages
    expire_leases()
    store.claim("owner-b", 10, 30).messages  # the first expiry: back in the queue, marked
    (taken,) = store.claim("owner-b", 10, 30).messages
    store.record("owner-a", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="late")])
    store.record("owner-b", [Outcome(taken.seq, OutcomeKind.DELIVERED, delivery_ref="1-1")])
    assert [(e, a, c, actor) for e, a, c, _, _, actor, _ in story(app_engine, m.seq)] == [
        ("lease_expired", 1, "lease_expired", "owner-a"),
        ("delivered", 2, None, None),
    ]


def test_leases_that_expire_are_lines_requeued_then_reclaimed_alone_then_dead(enqueue, store, app_engine,
                                                                              expire_leases):
    enqueue(1, max_attempts=3)
    (m,) = store.claim("a", 10, 30).messages
    expire_leases()
    assert store.claim("b", 10, 30).requeued == 1
    store.claim("b", 10, 30).messages  # attempt 2
    expire_leases()
    assert [x.seq for x in store.claim("c", 10, 30).messages] == [m.seq]  # expired again: re-claimed alone, attempt 3
    expire_leases()
    store.claim("d", 10, 30).messages  # no attempts left: dead
    lines = story(app_engine, m.seq)
    assert [(e, a, actor, due) for e, a, _, _, _, actor, due in lines] == [
        ("lease_expired", 1, "a", True),  # back in the queue, due when it was
        ("lease_expired", 2, "b", False),  # re-claimed alone at once
        ("dead", 3, "c", False),
    ]
    assert "back in the queue" in lines[0][3] and "re-claimed alone" in lines[1][3]
    assert lines[2][3] == get_message(app_engine, _id(app_engine, m.seq)).last_error  # the row's own text
    assert get_message(app_engine, _id(app_engine, m.seq)).status.value == "dead"


def test_redrive_and_discard_are_operator_lines(enqueue, store, app_engine):
    enqueue(2, max_attempts=1)
    a, b = store.claim("p", 10, 30).messages
    store.record("p", [Outcome(m.seq, OutcomeKind.DEAD, ErrorClass.PERMANENT, "no") for m in (a, b)])
    ida, idb = _id(app_engine, a.seq), _id(app_engine, b.seq)
    assert redrive(app_engine, RedriveSelection(message_ids=(ida,))).moved == 1
    assert discard(app_engine, [idb]).discarded == (str(idb),)
    assert [(e, at, actor, due) for e, at, _, _, _, actor, due in story(app_engine, a.seq)] == [
        ("dead", 1, "p", False), ("redriven", None, "operator", True)]
    assert [(e, at, actor) for e, at, _, _, _, actor, _ in story(app_engine, b.seq)] == [
        ("dead", 1, "p"), ("discarded", None, "operator")]


def test_history_is_purged_with_its_message_and_kept_for_the_others(enqueue, store, app_engine):
    enqueue(2)
    a, b = store.claim("p", 10, 30).messages
    store.record("p", [Outcome(a.seq, OutcomeKind.RETRY, ErrorClass.TRANSIENT, "x", None, 0.0),
                       Outcome(b.seq, OutcomeKind.RETRY, ErrorClass.TRANSIENT, "x", None, 600.0)])
    (a,) = store.claim("p", 10, 30).messages
    store.record("p", [Outcome(a.seq, OutcomeKind.DELIVERED, delivery_ref="1-1")])
    assert stored_lines(app_engine) == [(a.seq, "retry"), (b.seq, "retry")]
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET delivered_at = now() - interval '2 days' WHERE seq = :s"),
                     {"s": a.seq})
    assert purge(app_engine, delivered_older_than_seconds=86_400).delivered == 1
    assert stored_lines(app_engine) == [(b.seq, "retry")]


def test_outbox_show_tells_the_attempts_in_order(enqueue, store, app_engine, database_url):
    enqueue(1)
    (m,) = store.claim("poller-a", 10, 30).messages
    store.record("poller-a", [Outcome(m.seq, OutcomeKind.RETRY, ErrorClass.TRANSIENT, "timeout", None, 0.0)])
    make_due(app_engine)
    (m,) = store.claim("poller-b", 10, 30).messages
    store.record("poller-b", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1700000000000-3")])
    mid = str(_id(app_engine, m.seq))
    env = {"DATABASE_URL": database_url}
    data = json.loads(CliRunner().invoke(main, ["show", mid, "--json"], env=env, catch_exceptions=False).output)
    assert [(h["event"], h["attempt"], h["error_class"], h["ref"], h["actor"]) for h in data["history"]] == [
        ("retry", 1, "transient", None, "poller-a"), ("delivered", 2, None, "1700000000000-3", None)]
    human = CliRunner().invoke(main, ["show", mid], env=env, catch_exceptions=False).output
    lines = human[human.index("history:"):].splitlines()
    assert "#1" in lines[1] and "retry" in lines[1] and "[transient] timeout" in lines[1] and "poller-a" in lines[1]
    assert "#2" in lines[2] and "delivered" in lines[2] and "ref 1700000000000-3" in lines[2]


def test_reading_a_history_uses_the_primary_key(app_engine):
    with app_engine.begin() as conn:  # 10,000 messages of 3 lines each
        conn.execute(text("INSERT INTO outbox_message_history (seq, event, attempt) "
                          "SELECT i / 3, 'retry', 1 FROM generate_series(1, 30000) AS i"))
        conn.execute(text("ANALYZE outbox_message_history"))
        (raw,) = conn.execute(text("EXPLAIN (FORMAT JSON) " + sql.operations.history_of.text), {"seq": 700}).one()
    plan = json.dumps(declared(app_engine, (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
    # Through the primary key of the day holding the lines (a sort of one message's lines at most)
    assert "outbox_message_history_pkey" in plan and "Seq Scan" not in plan, plan


def _id(app_engine, seq: int):
    with app_engine.connect() as conn:
        return conn.execute(text("SELECT message_id FROM outbox_message WHERE seq = :s"), {"s": seq}).scalar_one()
