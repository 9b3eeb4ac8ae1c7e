"""The claim uses its partial indexes, checked with EXPLAIN on a realistic table."""

from __future__ import annotations

import json

from sqlalchemy import text

from outbox_relay import sql
from outbox_rows import insert_rows  # tests/outbox_rows.py

SEED = insert_rows(
    """
    SELECT gen_random_uuid() AS message_id, CASE WHEN mod(i, 5) = 0 THEN 'ses' ELSE 'redis' END AS channel,
           's' AS destination, 't' AS type, '{}' AS payload,
           CASE WHEN mod(i, 100) = 0 THEN 'pending' WHEN mod(i, 100) = 1 THEN 'leased' ELSE 'delivered' END
               AS status,
           1 AS attempts,
           CASE WHEN mod(i, 100) > 1 THEN now() END AS delivered_at,
           CASE WHEN mod(i, 100) > 1 THEN '1-0' END AS delivery_ref,
           CASE WHEN mod(i, 100) = 1 THEN 'someone' END AS lease_owner,
           CASE WHEN mod(i, 100) = 1 THEN now() + interval '1 minute' END AS lease_expires_at,
           now() - interval '1 minute' AS available_at
      FROM generate_series(1, :n) AS i
    """,
    ["channel", "destination", "type", "status", "attempts", "delivered_at", "delivery_ref", "lease_owner",
     "lease_expires_at", "available_at"],
)


def plan_nodes(plan: dict) -> list[dict]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


def test_claim_plan_uses_both_partial_indexes(app_engine):
    with app_engine.begin() as conn:
        conn.execute(SEED, {"n": 50_000})
        conn.execute(text("ANALYZE outbox_message"))
    params = {"channel": "redis", "limit": 500, "owner": "x", "lease_seconds": 30.0, "default_max_attempts": 10,
              "max_bytes": 32 * 1024 * 1024}
    with app_engine.begin() as conn:  # EXPLAIN ANALYZE really runs the claim: roll it back
        (raw,) = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.CLAIM.text), params).one()
        conn.rollback()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "outbox_message"]
    indexes = {n.get("Index Name") for n in scans}
    assert {"outbox_message_pending_due_idx", "outbox_message_lease_expiry_idx"} <= indexes
    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], scans
    # Bodies are fetched one by one through their primary key, never scanned
    bodies = [n for n in plan_nodes(plan) if n.get("Relation Name") == "outbox_message_body"]
    assert bodies and {n.get("Index Name") for n in bodies} == {"outbox_message_body_pkey"}, bodies
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in bodies) <= 500
    # The pending branch reads only what it returns, not the delivered bulk of the table
    pending_scan = next(n for n in scans if n.get("Index Name") == "outbox_message_pending_due_idx")
    assert pending_scan["Actual Rows"] <= 500
