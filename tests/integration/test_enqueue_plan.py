"""A bulk enqueue's plan is costed for its chunk, whatever the tables hold: PostgreSQL compiles a
plan costed above `jit_above_cost` with JIT before running it, which took longer than the insert
itself (decision 0073). Producers enqueue on their own sessions, JIT on or off."""

from __future__ import annotations

import json
import uuid

from sqlalchemy import text

from outbox_relay import sql
from outbox_relay.store import array_literal
from support.rows import insert_rows

# A backlog: every row pending and due, over 250 keys.
BACKLOG = insert_rows(
    """
    SELECT gen_random_uuid() AS message_id, 'redis' AS channel, 's' AS destination, 't' AS type,
           '{}' AS payload, 'k' || mod(i, 250) AS key, 'pending' AS status, 0 AS attempts,
           now() - interval '1 minute' AS available_at
      FROM generate_series(1, :n) AS i
    """,
    ["channel", "destination", "type", "key", "status", "attempts", "available_at"],
)


def test_a_bulk_enqueue_is_costed_for_its_chunk_not_for_the_tables(app_engine):
    chunk = json.dumps([{"i": i, "message_id": str(uuid.uuid4()), "channel": "redis", "destination": "s",
                         "type": "t", "key": f"k{i}", "payload": "{}", "headers": "{}", "max_attempts": None,
                         "deliver_at": None} for i in range(100)])
    statements = {"insert": (sql.producer.insert_messages_bulk, {"messages": chunk}),
                  # the second look at a chunk that found every id held
                  "held": (sql.producer.same_messages, {"messages": chunk, "positions": array_literal(range(100))})}
    costs = []
    for n in (5_000, 45_000):
        with app_engine.begin() as conn:
            conn.execute(BACKLOG, {"n": n})
            conn.execute(text("ANALYZE outbox_message"))
            conn.execute(text("ANALYZE outbox_message_body"))
            explained = {name: conn.execute(text("EXPLAIN (FORMAT JSON) " + statement.text), params).scalar_one()
                         for name, (statement, params) in statements.items()}
        costs.append({name: (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]["Total Cost"]
                      for name, raw in explained.items()})
    # Ten times the rows stored: the same estimate for the insert, and for the second look one
    # lookup per held id (while the tables are small, the planner hashes them instead: cheaper)
    small, large = costs
    assert large["insert"] < 1.2 * small["insert"], costs
    assert large["held"] < 10_000, costs
