"""Purge of 200,000 delivered rows in bounded batches while a relay keeps
claiming: the relay is never held up for more than MAX_CLAIM_SECONDS.

The bound is the one stated in docs/operating.md, "`outbox purge`: retention": a claim
or an outcome write during a purge takes under 1 second. On this kind of
machine (2 cores, local PostgreSQL) they take tens of milliseconds; the bound
is generous so a busy CI runner does not make the test flaky, and tight
enough to catch a purge that holds a lock for the length of a table-wide
delete.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from outbox_relay.models import Outcome, OutcomeKind
from outbox_relay.operations import purge as purge_module
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore
from support.rows import insert_rows

DELIVERED = 200_000
PENDING = 20_000
BATCH = 5_000
MAX_CLAIM_SECONDS = 1.0

# Sequential message ids (not UUID v4, so never equal to a producer's) keep the
# unique index's inserts at its right edge: the seed takes half the time.
SEED_DELIVERED = insert_rows(
    """
    SELECT lpad(to_hex(g), 32, '0')::uuid AS message_id,
           CASE WHEN mod(g, 4) = 0 THEN 'ses' ELSE 'redis' END AS channel,
           'orders' AS destination, 'order.placed' AS type, '{"n": 1}' AS payload, 'delivered' AS status,
           1 AS attempts, now() - interval '10 days' + g * interval '1 millisecond' AS delivered_at,
           g || '-0' AS delivery_ref, now() - interval '11 days' AS created_at,
           now() - interval '11 days' AS available_at
      FROM generate_series(1, :n) AS g
    """,
    ["channel", "destination", "type", "status", "attempts", "delivered_at", "delivery_ref", "created_at",
     "available_at"],
)

SEED_PENDING = insert_rows(
    """
    SELECT gen_random_uuid() AS message_id, 'redis' AS channel, 'orders' AS destination,
           'order.placed' AS type, json_build_object('n', g) AS payload
      FROM generate_series(1, :n) AS g
    """,
    ["channel", "destination", "type"],
)


@pytest.mark.slow
def test_purge_of_200k_delivered_rows_in_batches_never_blocks_the_relay(app_engine, relay_engine):
    # Given 200,000 delivered rows past retention and a backlog the relay is working through
    with app_engine.begin() as conn:
        conn.execute(SEED_DELIVERED, {"n": DELIVERED})
        conn.execute(SEED_PENDING, {"n": PENDING})
        conn.execute(text("ANALYZE outbox_message"))
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=5)

    batches: list[tuple[str, int]] = []
    outcome: dict = {}
    errors: list[BaseException] = []

    def purge() -> None:
        try:
            outcome["result"] = purge_module.purge(relay_engine, delivered_older_than_seconds=7 * 86400,
                                                   batch_size=BATCH, on_batch=lambda kind, n: batches.append((kind, n)))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    # When the purge runs in a thread while the relay claims and records in a loop
    purger = threading.Thread(target=purge)
    waits: list[float] = []
    delivered_by_relay = 0
    purger.start()
    while purger.is_alive():
        started = time.perf_counter()
        claimed = store.claim("relay-during-purge", 50, 30).messages
        waits.append(time.perf_counter() - started)
        if claimed:
            started = time.perf_counter()
            result = store.record("relay-during-purge", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1-0")
                                                         for m in claimed])
            waits.append(time.perf_counter() - started)
            delivered_by_relay += result.delivered
    purger.join()
    assert not errors, errors

    # Then all 200,000 went, in batches of at most 5,000, each its own statement
    result = outcome["result"]
    assert (result.delivered, result.dead, result.complete) == (DELIVERED, 0, True)
    assert result.by_channel == {"redis": DELIVERED * 3 // 4, "ses": DELIVERED // 4}
    assert len(batches) == DELIVERED // BATCH and {n for _, n in batches} == {BATCH}
    # And the relay kept claiming throughout, never waiting longer than the bound
    claims = len(waits)
    assert claims >= 20, f"the relay claimed only {claims} times during the purge"
    assert max(waits) < MAX_CLAIM_SECONDS, f"slowest claim/record {max(waits):.3f}s of {claims}"
    # And what the relay delivered meanwhile is still there (delivered just now: inside retention)
    with app_engine.connect() as conn:
        left = dict(conn.execute(text("SELECT status, count(*) FROM outbox_message GROUP BY status")).fetchall())
    assert left.get("delivered", 0) == delivered_by_relay > 0
    assert left.get("pending", 0) == PENDING - delivered_by_relay
