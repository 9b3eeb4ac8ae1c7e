"""The hot-path changes made for the benchmark keep their guarantees.

- Outcome arrays travel as array literals: every text survives exactly
  (quotes, backslashes, braces, commas, a text "null", UTF-8), NULL stays NULL.
- One outcome statement records every kind and reports lost leases.
- The claim reaches its rows through the primary key, also on a table with
  statistics and a large batch (it once chose a hash join over a sequential scan).
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from outbox_relay import sql
from outbox_relay.models import ErrorClass, Outcome, OutcomeKind
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore, array_literal, text_array_literal
from support.plans import declared
from support.rows import insert_rows

AWKWARD = [
    'null', 'NULL', '"quoted"', "back\\slash", "{braces}", "a,b", "trailing \\", "tab\there",
    "multi\nline", "ünïcödé – ✓", "   ", "", "'single'",
]


def test_text_array_literal_quotes_every_element():
    assert text_array_literal([None, None]) is None
    assert text_array_literal(["a", None]) == '{"a",NULL}'
    assert text_array_literal(['x"y\\z']) == '{"x\\"y\\\\z"}'
    assert text_array_literal(["nul\x00byte"]) == '{"nulbyte"}'
    assert array_literal([1, 2, 3]) == "{1,2,3}"
    assert array_literal([0.5, 2.0]) == "{0.5,2.0}"


def test_error_texts_and_refs_round_trip_exactly(enqueue, store, rows):
    enqueue(len(AWKWARD) + 1)
    claimed = store.claim("w", 100, 30).messages
    outcomes = [Outcome(m.seq, OutcomeKind.DEAD, ErrorClass.PERMANENT, err) for m, err in zip(claimed, AWKWARD)]
    last = claimed[len(AWKWARD)]
    outcomes.append(Outcome(last.seq, OutcomeKind.DELIVERED, delivery_ref='1-0 "ref" null'))
    result = store.record("w", outcomes)
    assert (result.dead, result.delivered, result.lease_lost) == (len(AWKWARD), 1, 0)
    by_seq = {r["seq"]: r for r in rows()}
    assert [by_seq[m.seq]["last_error"] for m in claimed[:len(AWKWARD)]] == AWKWARD
    assert all(by_seq[m.seq]["last_error_class"] == "permanent" for m in claimed[:len(AWKWARD)])
    assert by_seq[last.seq]["delivery_ref"] == '1-0 "ref" null'
    assert by_seq[last.seq]["last_error"] is None


def test_one_statement_records_every_kind_and_counts_lost_leases(enqueue, store, rows, app_engine):
    enqueue(6, max_attempts=1)
    a, b, c, d, e, f = store.claim("w", 10, 30).messages
    with app_engine.begin() as conn:  # f's lease is taken over by someone else
        conn.execute(text("UPDATE outbox_message SET lease_owner = 'thief' WHERE seq = :s"), {"s": f.seq})
    result = store.record("w", [
        Outcome(a.seq, OutcomeKind.DELIVERED, delivery_ref="1-1"),
        Outcome(b.seq, OutcomeKind.RETRY, ErrorClass.TRANSIENT, "timeout", None, 5.0),  # attempts used up: dead
        Outcome(c.seq, OutcomeKind.DEAD, ErrorClass.PERMANENT, "bad"),
        Outcome(d.seq, OutcomeKind.RELEASE, ErrorClass.THROTTLED, "slow down", None, 7.5),
        Outcome(e.seq, OutcomeKind.RELEASE, ErrorClass.NOT_ATTEMPTED, None),
        Outcome(f.seq, OutcomeKind.DELIVERED, delivery_ref="1-2"),
    ])
    assert (result.delivered, result.retried, result.dead, result.released, result.lease_lost) == (1, 0, 2, 2, 1)
    assert result.lost_seqs == (f.seq,)
    r = {x["seq"]: x for x in rows()}
    assert r[a.seq]["status"] == "delivered" and r[a.seq]["delivery_ref"] == "1-1"
    assert r[b.seq]["status"] == "dead" and r[b.seq]["dead_at"] is not None
    assert r[d.seq]["status"] == "pending" and r[d.seq]["attempts"] == 0 and 6 < r[d.seq]["due_in"] <= 7.5
    assert r[e.seq]["status"] == "pending" and r[e.seq]["attempts"] == 0 and r[e.seq]["due"]
    assert r[f.seq]["status"] == "leased" and r[f.seq]["lease_owner"] == "thief"


def _plan_nodes(plan: dict) -> list[dict]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _plan_nodes(child)
    return nodes


@pytest.mark.parametrize("limit", [10, 5000])
def test_claim_reaches_rows_by_primary_key_on_an_analyzed_table(app_engine, limit):
    with app_engine.begin() as conn:
        conn.execute(insert_rows(
            "SELECT gen_random_uuid() AS message_id, 'redis' AS channel, 's' AS destination, 't' AS type, "
            "json_build_object('n', i) AS payload FROM generate_series(1, 20000) AS i",
            ["channel", "destination", "type"]))
        conn.execute(text("ANALYZE outbox_message"))
        conn.execute(text("ANALYZE outbox_message_body"))
    params = LeaseStore(app_engine, Channel.REDIS, default_max_attempts=10).claim_parameters("x", limit, 30.0)
    with app_engine.connect() as conn:
        (raw,) = conn.execute(text("EXPLAIN (FORMAT JSON) " + sql.relay.claim.text), params).one()
    plan = declared(app_engine, (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
    nodes = _plan_nodes(plan)
    seq_scans = [n for n in nodes if n["Node Type"] == "Seq Scan"
                 and n.get("Relation Name") in ("outbox_message", "outbox_message_body")]
    assert not seq_scans, seq_scans
    # the picked rows through the primary key (an index or bitmap index scan), each body through its own
    indexes = {n.get("Index Name") for n in nodes}
    assert {"outbox_message_pkey", "outbox_message_body_pkey"} <= indexes, indexes


def test_each_relay_statement_is_a_transaction_of_five_round_trips(relay_engine, enqueue, monkeypatch):
    import pg8000.core

    # Count the round trips of the relay's engine: pg8000 waits for ReadyForQuery after each,
    # which also says whether the connection is inside a transaction block (T) or not (I)
    statuses: list[bytes] = []
    original = pg8000.core.CoreConnection.handle_READY_FOR_QUERY

    def counted(self, data, context):  # noqa: ANN001
        statuses.append(bytes(data))
        return original(self, data, context)

    monkeypatch.setattr(pg8000.core.CoreConnection, "handle_READY_FOR_QUERY", counted)
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=3)
    store.oldest_pending_age_seconds()  # the connection and its checks, outside the count
    enqueue(3)

    statuses.clear()
    claimed = store.claim("w", 10, 30).messages
    claim_trips = list(statuses)
    statuses.clear()
    store.record("w", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1-1") for m in claimed])

    # The claim and the outcome write: BEGIN, then pg8000's parse, describe, and bind and
    # execute, each ended by Sync inside the transaction block (a transaction pooler keeps
    # them on one server connection), then COMMIT as one simple query
    assert len(claimed) == 3
    assert claim_trips == statuses == [b"T", b"T", b"T", b"T", b"I"]
