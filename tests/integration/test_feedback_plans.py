"""The feedback statements reach their rows through indexes, checked with EXPLAIN
on a table of 50,000 messages (SES ones delivered with an SES message id) and
as many events: the message by the tag (the body's message_id key) or the SES
id (outbox_message_ses_ref_idx), the suppression check by its primary key (on a list of 200,000: a small one is
read whole, which the planner rightly finds cheaper), a
message's events by outbox_email_event_message_idx."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import text

from outbox_relay import sql
from support.plans import declared
from support.rows import insert_rows

SEED = insert_rows(
    """
    SELECT gen_random_uuid() AS message_id, CASE WHEN mod(i, 2) = 0 THEN 'ses' ELSE 'redis' END AS channel,
           's' AS destination, 't' AS type, '{}' AS payload, 'delivered' AS status, 1 AS attempts,
           now() AS delivered_at, 'ses-' || i AS delivery_ref
      FROM generate_series(1, :n) AS i
    """,
    ["channel", "destination", "type", "status", "attempts", "delivered_at", "delivery_ref"],
)


def _plan(app_engine, statement, params) -> list[dict]:
    with app_engine.begin() as conn:  # EXPLAIN ANALYZE runs it: roll it back
        (raw,) = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + statement.text), params).one()
        conn.rollback()
    plan = declared(app_engine, (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
    nodes, todo = [], [plan]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo += node.get("Plans", [])
    return nodes


@pytest.mark.slow  # 250,000 rows written
def test_the_feedback_statements_use_their_indexes(app_engine):
    with app_engine.begin() as conn:
        conn.execute(SEED, {"n": 50_000})
        conn.execute(text("""
            INSERT INTO outbox_email_event (message_id, ses_message_id, event_type, event_at, event_key)
            SELECT message_id, delivery_ref, 'delivery', now(), 'k' FROM outbox_message WHERE channel = 'ses'"""))
        conn.execute(text("INSERT INTO outbox_suppression (address_hash, reason) "
                          "SELECT encode(sha256(i::text::bytea), 'hex'), 'manual' FROM generate_series(1, 200000) i"))
        # and a backlog of other channels' messages waiting, so that the live partition is not empty
        conn.execute(text("UPDATE outbox_message SET status = 'pending', delivered_at = NULL, delivery_ref = NULL "
                          "WHERE channel = 'redis' AND seq % 5 = 0"))
        conn.execute(text("ANALYZE outbox_message; ANALYZE outbox_message_body; ANALYZE outbox_email_event; "
                          "ANALYZE outbox_suppression"))
        tagged = str(conn.execute(text("SELECT message_id FROM outbox_message WHERE channel = 'ses' LIMIT 1"))
                     .scalar_one())
    base = {"ses_id": "ses-1000", "event_type": "bounce", "event_at": "2026-12-02T00:00:00+00:00",
            "subtype": "Permanent/General", "recipients": None, "configuration_set": "tx", "event_key": "f",
            "suppress": "{" + "a" * 64 + "}", "suppress_reason": "bounce"}
    for tag in (tagged, None):
        nodes = _plan(app_engine, sql.feedback.record_email_event, {**base, "tag_id": tag})
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], \
            [(n.get("Relation Name"), n.get("Alias")) for n in nodes if n["Node Type"] == "Seq Scan"]
        used = {n.get("Index Name") for n in nodes}
        assert "outbox_message_ses_ref_idx" in used
        assert tag is None or "outbox_message_body_message_id_key" in used, used
    hashes = "{" + ",".join(uuid.uuid4().hex * 2 for _ in range(500)) + "}"
    nodes = _plan(app_engine, sql.feedback.suppressed_among, {"hashes": hashes})
    assert {n.get("Index Name") for n in nodes} >= {"outbox_suppression_pkey"}, nodes
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"]
    nodes = _plan(app_engine, sql.feedback.email_events_of, {"message_id": tagged})
    assert "outbox_email_event_message_idx" in {n.get("Index Name") for n in nodes}
