"""The claim uses its partial indexes, checked with EXPLAIN on a realistic table:
a history of delivered messages, most with a key, and pending messages in every
state the claim looks at (keys due, behind another relay's lease, behind a retry,
behind a dead letter, expired leases)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from outbox_relay import sql
from outbox_relay.models import OrderingOnDead
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore
from support.plans import declared
from support.rows import insert_rows

# i mod 100: 0-5 pending (3 waiting for a retry), 6 leased by another relay,
# 7 dead, 8 leased and expired (on the SES channel only), the rest delivered;
# seven in ten have one of 997 keys.
SEED = insert_rows(
    """
    SELECT gen_random_uuid() AS message_id,
           CASE WHEN mod(i, 50) = 49 OR mod(i, 100) = 8 THEN 'ses' ELSE 'redis' END AS channel,
           's' AS destination, 't' AS type, '{}' AS payload,
           CASE WHEN mod(i, 10) < 7 THEN 'k' || mod(i, 997) END AS key,
           CASE WHEN mod(i, 100) <= 5 THEN 'pending' WHEN mod(i, 100) IN (6, 8) THEN 'leased'
                WHEN mod(i, 100) = 7 THEN 'dead' ELSE 'delivered' END AS status,
           CASE WHEN mod(i, 100) = 3 THEN 2 ELSE 1 END AS attempts,
           CASE WHEN mod(i, 100) > 8 THEN now() END AS delivered_at,
           CASE WHEN mod(i, 100) > 8 THEN '1-0' END AS delivery_ref,
           CASE WHEN mod(i, 100) IN (6, 8) THEN 'someone' END AS lease_owner,
           CASE WHEN mod(i, 100) = 6 THEN now() + interval '1 minute'
                WHEN mod(i, 100) = 8 THEN now() - interval '1 minute' END AS lease_expires_at,
           CASE WHEN mod(i, 100) = 7 THEN now() END AS dead_at,
           CASE WHEN mod(i, 100) = 3 THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END
               AS available_at
      FROM generate_series(1, :n) AS i
    """,
    ["channel", "destination", "type", "key", "status", "attempts", "delivered_at", "delivery_ref", "lease_owner",
     "lease_expires_at", "dead_at", "available_at"],
)


def plan_nodes(plan: dict) -> list[dict]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


def explain_claim(app_engine, *, block: bool = False, channel: str = "redis", part: tuple[int, int] | None = None,
                  limit: int = 500) -> dict:
    store = LeaseStore(app_engine, Channel(channel), default_max_attempts=10,
                       ordering_on_dead=OrderingOnDead.BLOCK if block else OrderingOnDead.SKIP)
    params = store.claim_parameters("x", limit, 30.0, part=part)
    with app_engine.begin() as conn:  # EXPLAIN ANALYZE really runs the claim: roll it back
        (raw,) = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.relay.claim.text), params).one()
        conn.rollback()
    return declared(app_engine, (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])


def check_plan(app_engine, n: int) -> None:
    with app_engine.begin() as conn:
        conn.execute(SEED, {"n": n})
        conn.execute(text("ANALYZE outbox_message"))
        conn.execute(text("ANALYZE outbox_message_body"))
    # A poller's claim of its part of the keys (decision 0070) walks the same indexes
    for block, part in ((False, None), (True, None), (False, (1, 3))):
        plan = explain_claim(app_engine, block=block, part=part)
        scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "outbox_message"]
        # A bitmap heap scan names its index in the bitmap index scan below it
        indexes = {n.get("Index Name") for s in scans for n in plan_nodes(s)}
        assert {"outbox_message_pending_due_idx", "outbox_message_lease_expiry_idx",
                "outbox_message_key_active_idx"} <= indexes, indexes
        if block:
            assert "outbox_message_key_dead_idx" in indexes
        assert not [n for n in scans if "Seq Scan" in n["Node Type"]], scans
        # Bodies are fetched one by one through their primary key, never scanned
        bodies = [n for n in plan_nodes(plan) if n.get("Relation Name") == "outbox_message_body"]
        assert bodies and {n.get("Index Name") for n in bodies} == {"outbox_message_body_pkey"}, bodies
        assert sum(n["Actual Rows"] * n["Actual Loops"] for n in bodies) <= 500
        # The pending branch reads about what it returns (and the rows of keys behind
        # another relay's lease, which it leaves), not the delivered bulk of the table
        pending_scan = next(n for n in scans if n.get("Index Name") == "outbox_message_pending_due_idx")
        assert 0 < pending_scan["Actual Rows"] <= 1000
    # With expired leases, one is re-claimed alone: the key probe runs on it
    plan = explain_claim(app_engine, block=True, channel="ses")
    scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "outbox_message"]
    assert not [n for n in scans if "Seq Scan" in n["Node Type"]], scans
    expiry = next(n for n in scans if n.get("Index Name") == "outbox_message_lease_expiry_idx")
    assert expiry["Actual Rows"] > 0


def test_claim_plan_uses_the_partial_indexes(app_engine):
    check_plan(app_engine, 50_000)


@pytest.mark.slow
def test_claim_plan_uses_the_partial_indexes_with_a_million_rows_of_history(app_engine):
    check_plan(app_engine, 1_000_000)



# A backlog: every row pending and due, over the keys given (k0 … k249 unless given).
BACKLOG = insert_rows(
    """
    SELECT gen_random_uuid() AS message_id, 'redis' AS channel, 's' AS destination, 't' AS type,
           '{}' AS payload, k.keys[1 + mod(i, cardinality(k.keys))] AS key, 'pending' AS status, 0 AS attempts,
           now() - interval '1 minute' AS available_at
      FROM generate_series(1, :n) AS i,
           (SELECT coalesce(CAST(:keys AS text[]), ARRAY(SELECT 'k' || j FROM generate_series(0, 249) j)) AS keys) k
    """,
    ["channel", "destination", "type", "key", "status", "attempts", "available_at"],
)


def grow_the_due_index(app_engine) -> None:
    """Dead entries in the due index, as a drain's updates leave them between vacuums."""
    for _ in range(4):
        with app_engine.begin() as conn:
            conn.execute(text("UPDATE outbox_message SET available_at = available_at - interval '1 ms' "
                              "WHERE status = 'pending'"))


def test_a_claim_with_few_messages_waiting_among_many_dead_walks_the_due_index(app_engine):
    # Given 20,000 messages, the due index grown with dead entries as a drain leaves it, then all
    # but 1,500 dead-lettered (they stay in the live partition), vacuumed and analyzed
    with app_engine.begin() as conn:
        conn.execute(BACKLOG, {"n": 20_000, "keys": None})
    grow_the_due_index(app_engine)
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET status = 'dead', dead_at = now() "
                          "WHERE status = 'pending' AND seq > 1500"))
    with app_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # VACUUM: no transaction
        conn.execute(text("VACUUM ANALYZE outbox_message"))
    for part in (None, (1, 4)):
        # When a poller claims the whole channel, or its part
        nodes = plan_nodes(explain_claim(app_engine, part=part, limit=1000))
        # Then it walks the due index, never the partition and a sort (a bound LIMIT chose those)
        assert not [n for n in nodes if "Seq Scan" in n["Node Type"]], (part, nodes)
        assert [n for n in nodes if n.get("Index Name") == "outbox_message_pending_due_idx" and n["Actual Rows"]]


def test_a_claim_of_a_part_passes_the_other_parts_rows_in_the_index(app_engine):
    # Given a backlog of 20,000 over 100 keys, every one of them in part 0 of 4, and the due
    # index grown with dead entries as a drain leaves it between vacuums, analyzed
    from outbox_relay.store import part_of

    keys = [k for k in (f"k{i}" for i in range(2000)) if part_of(k, 4) == 0][:100]
    with app_engine.begin() as conn:
        conn.execute(BACKLOG, {"n": 20_000, "keys": "{" + ",".join(keys) + "}"})
    grow_the_due_index(app_engine)
    with app_engine.begin() as conn:
        conn.execute(text("ANALYZE outbox_message"))
    for part in ((1, 4), (0, 4)):
        # When the poller of part 1, then that of part 0, claims
        nodes = plan_nodes(explain_claim(app_engine, part=part, limit=1000))
        # Then each walks the due index, never the partition and a sort
        assert not [n for n in nodes if "Seq Scan" in n["Node Type"]], (part, nodes)
        due = next(n for n in nodes if n.get("Index Name") == "outbox_message_pending_due_idx")
        assert "md5" in due["Index Cond"] and not due.get("Rows Removed by Filter"), due
        if part == (1, 4):
            # and part 1's claims nothing: the index's condition passed every row of part 0, none
            # read from the table to be filtered out, none probed for its key's turn
            assert due["Actual Rows"] == 0
            assert not [n for n in nodes if n.get("Index Name") == "outbox_message_key_active_idx"
                        and n["Actual Loops"]]
        else:
            assert due["Actual Rows"] >= 1000


def test_one_key_everywhere_is_still_probed_through_the_key_index(app_engine, relay_engine):
    # Given a burst of one key, analyzed while all of it was pending (the statistics say
    # the key and the pending status are everywhere), then partly delivered, a batch in flight
    from outbox_relay.models import Outcome, OutcomeKind
    from outbox_relay.producer import enqueue_events_bulk

    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream="s", type="t", payload={"i": i}, key="k") for i in range(5000)])
    with app_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # VACUUM: no transaction
        conn.execute(text("VACUUM ANALYZE outbox_message"))
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=10)
    for _ in range(2):
        batch = store.claim("me", 1000, 60).messages
        store.record("me", [Outcome(m.seq, OutcomeKind.DELIVERED, None, None, "1-0", 0) for m in batch])
    assert len(store.claim("me", 1000, 60).messages) == 1000  # in flight
    # When the same relay claims the next batch
    params = store.claim_parameters("me", 1000, 60.0)
    with app_engine.begin() as conn:
        (raw,) = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.relay.claim.text), params).one()
        conn.rollback()
    plan = declared(app_engine, (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
    # Then it claims the key's next thousand, and every probe of the key's rows went through
    # the key index: the primary key only serves lookups by seq, never a walk through the history
    assert plan["Actual Rows"] == 1000
    scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "outbox_message"]
    assert "outbox_message_key_active_idx" in {n.get("Index Name") for n in scans}
    walks = [n for n in scans if n.get("Index Name") == "outbox_message_pkey" and "ANY" not in n.get("Index Cond", "")]
    assert not walks and not [n for n in scans if "Seq Scan" in n["Node Type"]], scans


def test_a_claim_behind_other_pollers_keys_probes_each_key_once(app_engine, relay_engine):
    # Given a backlog of 20 keys, 250 messages each, analyzed, whose every key another
    # poller holds (its batch took each key's first messages)
    from outbox_relay.producer import enqueue_events_bulk

    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream="s", type="t", payload={"i": i}, key=f"k{i % 20}")
                                   for i in range(5000)])
    with app_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # VACUUM: no transaction
        conn.execute(text("VACUUM ANALYZE outbox_message"))
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=10)
    assert len({m.key for m in store.claim("other", 1000, 60).messages}) == 20
    # When another poller claims
    params = store.claim_parameters("me", 1000, 60.0)
    with app_engine.begin() as conn:
        (raw,) = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.relay.claim.text), params).one()
        conn.rollback()
    nodes = plan_nodes((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
    # Then it passes every waiting row and claims none, probing the key index once per key,
    # not once per row it passes
    due = next(n for n in nodes if n.get("Index Name") == "outbox_message_pending_due_idx")
    assert due["Actual Rows"] == 4000
    probes = [n for n in nodes if n.get("Index Name") == "outbox_message_key_active_idx"]
    assert probes and sum(n["Actual Loops"] for n in probes) <= 40, probes


def test_the_poller_registry_statements_use_their_indexes(app_engine):
    # Given a realistic outbox and a week of registrations (one a minute, some dead ones now)
    with app_engine.begin() as conn:
        conn.execute(SEED, {"n": 50_000})
        conn.execute(text(
            "INSERT INTO outbox_poller (owner, channel, started_at, seen_at, expires_at, deadline_at, left_at) "
            "SELECT 'p' || i, CASE WHEN mod(i, 2) = 0 THEN 'redis' ELSE 'ses' END, now() - i * interval '30 s', "
            "now() - i * interval '30 s', now() - i * interval '30 s' + interval '5 s', now(), "
            "CASE WHEN i > 4 THEN now() - i * interval '30 s' + interval '60 s' END "
            "FROM generate_series(1, 20000) AS i"))
        for table in ("outbox_message", "outbox_poller"):
            conn.execute(text(f"ANALYZE {table}"))

    def explain(name: str, params: dict) -> list[dict]:
        with app_engine.begin() as conn:  # EXPLAIN ANALYZE runs the statement: roll it back
            (raw,) = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.statement_text(name)), params).one()
            conn.rollback()
        return plan_nodes(declared(app_engine, (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))

    common = {"channel": "redis", "ttl_seconds": 5.0}
    for name, params in (("register_poller", common | {"owner": "new", "deadline_seconds": 60.0, "slot": None,
                                                       "slots": 3}),
                         ("renew_poller", common | {"owner": "p2", "aware_after": None}),
                         ("add_poller", common | {"owner": "p2", "max_slots": 4, "lead_seconds": 15.0,
                                                  "cooldown_seconds": 5.0}),
                         ("take_over_pollers", {"channel": "redis"})):
        nodes = explain(name, params)
        # Then no table is read whole: the registry by channel and start, the outbox's leased rows by expiry
        assert not [n for n in nodes if "Seq Scan" in n["Node Type"]], (name, nodes)
        indexes = {n.get("Index Name") for n in nodes}
        if name == "take_over_pollers":
            assert "outbox_message_lease_expiry_idx" in indexes, indexes
        else:
            assert "outbox_poller_channel_started_idx" in indexes, (name, indexes)


def test_an_outcome_write_reads_its_values_once_when_most_rows_are_leased(app_engine, relay_engine):
    # Given the state a fleet-wide crash leaves, analyzed: every message leased by an
    # invocation that died, each lease run out (the statistics say nearly all rows are leased)
    from outbox_relay.producer import enqueue_events_bulk

    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream="s", type="t", payload={"i": i}) for i in range(20_000)])
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=10)
    dead = 0
    while store.claim(f"dead-{dead}", 1000, 60).messages:
        dead += 1
    with app_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # VACUUM: no transaction
        conn.execute(text("UPDATE outbox_message SET lease_expires_at = now() - interval '1 second'"))
        conn.execute(text("VACUUM ANALYZE outbox_message"))
    # When a relay requeues them, claims a batch and records it delivered
    assert not store.claim("me", 1000, 60).messages and len(batch := store.claim("me", 1000, 60).messages) == 1000
    _assert_the_outcome_write_reads_its_values_once(app_engine, store, batch)


def test_an_outcome_write_reads_its_values_once_when_the_statistics_saw_no_lease(app_engine, relay_engine):
    # Given a backlog analyzed before any claim: the statistics say no row is leased
    from outbox_relay.producer import enqueue_events_bulk

    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream="s", type="t", payload={"i": i}) for i in range(20_000)])
    with app_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE outbox_message"))
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=10)
    # When a relay claims a batch and records it delivered (its rows move to their day)
    assert len(batch := store.claim("me", 1000, 60).messages) == 1000
    _assert_the_outcome_write_reads_its_values_once(app_engine, store, batch)


def _assert_the_outcome_write_reads_its_values_once(app_engine, store, batch) -> None:
    from outbox_relay.models import Outcome, OutcomeKind

    params = {"owner": "me", "channel": "redis", "default_max_attempts": 10,
              "seqs": "{" + ",".join(str(m.seq) for m in batch) + "}", "kinds": "{" + ",".join(["delivered"] * 1000)
              + "}", "error_classes": None, "errors": None, "refs": "{" + ",".join(['"1-0"'] * 1000) + "}",
              "delays": None}
    with app_engine.begin() as conn:  # EXPLAIN ANALYZE runs the write: roll it back
        (raw,) = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.relay.record_outcomes.text),
                              params).one()
        conn.rollback()
    nodes = plan_nodes(declared(app_engine, (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
    # Then the write records all of them and reads its values once, not once per row
    # (a nested loop over the values, chosen for a misestimated single row, made it quadratic)
    (update,) = [n for n in nodes if n["Node Type"] == "ModifyTable" and n["Operation"] == "Update"]
    assert update["Actual Rows"] == 1000
    # and a batch delivered whole adds no line to the history
    (history,) = [n for n in nodes if n["Node Type"] == "ModifyTable" and n["Operation"] == "Insert"]
    assert history["Relation Name"] == "outbox_message_history" and history["Actual Rows"] == 0
    values = [n for n in nodes if n["Node Type"] == "CTE Scan" and n.get("CTE Name") == "v"]
    assert values and all(n["Actual Loops"] == 1 for n in values), values
    assert store.record("me", [Outcome(m.seq, OutcomeKind.DELIVERED, None, None, "1-0", 0) for m in batch]).delivered \
        == 1000
