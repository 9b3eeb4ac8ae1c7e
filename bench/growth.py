"""Cost as the table grows: claim latency with 10,000 and 1,000,000 rows present
(almost all delivered, as in a table nobody purged yet) and with 100,000 pending.

Each case seeds the table in SQL (payloads cycled from the ~1 KB generator),
runs VACUUM ANALYZE (what autovacuum does on a maintained server), checks the
claim's plan with EXPLAIN, runs a CHECKPOINT (seeding a million rows writes
enough WAL to set one off, which would land in the middle of that case only),
then, after a tenth as many untimed warm-up claims, times `LeaseStore.claim` many times on the
relay's own engine. Between claims, untimed, the claimed rows are recorded
delivered (`LeaseStore.record`) and as many new messages are inserted, so the
table keeps its shape the way a live outbox does (rows move from pending to
delivered while new ones arrive).
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import text

from outbox_relay import sql
from outbox_relay.config import load_settings
from outbox_relay.db import create_relay_engine
from outbox_relay.models import Outcome, OutcomeKind
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore

from . import payloads
from .drain import checkpoint
from .env import BenchEnv, percentile

TEMPLATES = 1000

# A side table of the bench database holding the payload templates.
CREATE_TEMPLATES = text("CREATE TABLE IF NOT EXISTS bench_payload (i int PRIMARY KEY, payload json NOT NULL, key text)")

# Rows with status `delivered` (or `pending`), payloads cycled from the templates,
# created in the past so that pending rows are due. Bodies and states in one
# statement, as the producer API writes them (see sql.producer.insert_messages_bulk).
SEED_ROWS = text(
    """
    WITH src AS MATERIALIZED (
        SELECT gen_random_uuid() AS message_id, t.key, t.payload, g
          FROM generate_series(1, :n) AS g
          JOIN bench_payload t ON t.i = mod(g, :templates)
    ), body AS (
        INSERT INTO outbox_message_body (message_id, payload)
        SELECT message_id, payload FROM src ORDER BY g
        RETURNING seq, message_id
    )
    INSERT INTO outbox_message (seq, message_id, channel, destination, type, key, payload_bytes, status, attempts,
                                available_at, created_at, delivered_at, delivery_ref)
    SELECT body.seq, src.message_id, 'redis', :stream, 'order.placed', src.key, octet_length(src.payload::text),
           :status,
           CASE WHEN :status = 'delivered' THEN 1 ELSE 0 END,
           now() - interval '1 hour', now() - interval '1 hour',
           CASE WHEN :status = 'delivered' THEN now() - interval '30 minutes' END,
           CASE WHEN :status = 'delivered' THEN '1700000000000-' || src.g END
      FROM src JOIN body ON body.message_id = src.message_id
    """
)


def _plan_nodes(plan: dict) -> list[dict]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _plan_nodes(child)
    return nodes


def claim_plan(env: BenchEnv, limit: int) -> dict[str, Any]:
    """EXPLAIN (not executed) of the claim: indexes used per scan, and no Seq Scan of the outbox."""
    params = LeaseStore(env.engine, Channel.REDIS, default_max_attempts=10).claim_parameters("explain", limit, 120.0)
    with env.engine.connect() as conn:
        (raw,) = conn.execute(text("EXPLAIN (FORMAT JSON) " + sql.relay.claim.text), params).one()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    scans = [n for n in _plan_nodes(plan) if n.get("Relation Name") == "outbox_message"]
    indexes = sorted({n.get("Index Name") for n in scans if n.get("Index Name")})
    seq_scans = [n for n in scans if n["Node Type"] == "Seq Scan"]
    needed = {"outbox_message_pending_due_idx", "outbox_message_lease_expiry_idx"}
    return {"scans": [f"{n['Node Type']} {n.get('Index Name') or ''}".strip() for n in scans],
            "indexes": indexes, "ok": needed <= set(indexes) and not seq_scans}


def _templates(conn: Any) -> None:
    conn.execute(CREATE_TEMPLATES)
    if not conn.execute(text("SELECT count(*) FROM bench_payload")).scalar_one():
        rows = [{"i": i, "payload": json.dumps(e["payload"]), "key": e["key"]}
                for i, e in enumerate(payloads.events(TEMPLATES, seed=61))]
        conn.execute(text("INSERT INTO bench_payload VALUES (:i, CAST(:payload AS json), :key)"), rows)


def _seed(env: BenchEnv, *, delivered: int, pending: int, stream: str) -> float:
    started = time.perf_counter()
    env.reset_table()
    with env.engine.begin() as conn:
        _templates(conn)
        step = 200_000
        for status, total in (("delivered", delivered), ("pending", pending)):
            done = 0
            while done < total:
                k = min(step, total - done)
                conn.execute(SEED_ROWS, {"stream": stream, "status": status, "n": k, "templates": TEMPLATES})
                done += k
    env.vacuum_analyze()
    return time.perf_counter() - started


def _more_pending(env: BenchEnv, pending: int) -> float:
    """Turn delivered rows back into pending ones until `pending` rows are pending."""
    started = time.perf_counter()
    with env.engine.begin() as conn:
        have = conn.execute(text("SELECT count(*) FROM outbox_message WHERE status = 'pending'")).scalar_one()
        conn.execute(text(
            "UPDATE outbox_message SET status = 'pending', attempts = 0, delivered_at = NULL, delivery_ref = NULL "
            "WHERE seq IN (SELECT seq FROM outbox_message WHERE status = 'delivered' ORDER BY seq LIMIT :k)"),
            {"k": max(0, pending - have)})
    env.vacuum_analyze()
    return time.perf_counter() - started


REFILL = text(SEED_ROWS.text.replace("now() - interval '1 hour', now() - interval '1 hour'", "now(), now()"))


def _refill(env: BenchEnv, n: int, stream: str) -> None:
    with env.engine.begin() as conn:
        conn.execute(REFILL, {"stream": stream, "status": "pending", "n": n, "templates": TEMPLATES})


def measure_case(env: BenchEnv, name: str, *, rows: int, pending: int, claims: int, claim_batch: int,
                 stream: str, reseed: bool = True) -> dict[str, Any]:
    warmup = max(1, claims // 10)  # untimed first claims: connection and caches warm, as in a live relay
    if reseed:
        seed_seconds = _seed(env, delivered=rows - pending, pending=pending, stream=stream)
    else:
        seed_seconds = _more_pending(env, pending)
    plan = claim_plan(env, claim_batch)
    checkpoint(env)  # every case starts right after a checkpoint, not in one the seeding set off
    with env.engine.connect() as conn:
        present = conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one()
    settings = load_settings(database_url=env.database_url, redis_url=env.servers.redis_url)
    engine = create_relay_engine(settings)
    store = LeaseStore(engine, Channel.REDIS, default_max_attempts=settings.max_attempts)
    latencies: list[float] = []
    try:
        store.oldest_pending_age_seconds()  # connect before timing
        for i in range(warmup + claims):
            owner = f"bench-growth-{i}"
            started = time.perf_counter()
            claimed = store.claim(owner, claim_batch, 120.0).messages
            if i >= warmup:
                latencies.append((time.perf_counter() - started) * 1000.0)
            if not claimed:
                raise RuntimeError(f"{name}: claim {i} found nothing to claim")
            store.record(owner, [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1-0") for m in claimed])
            _refill(env, len(claimed), stream)
    finally:
        engine.dispose()
    return {
        "case": name, "rows": present, "pending": pending, "seed_seconds": round(seed_seconds, 1),
        "median_ms": round(percentile(latencies, 50), 3), "p99_ms": round(percentile(latencies, 99), 3),
        "max_ms": round(max(latencies), 3), "plan": plan,
    }


def run_growth(env: BenchEnv, *, small: int, large: int, pending_small: int, pending_large: int,
               many_pending: int, claims: int, claim_batch: int) -> dict[str, Any]:
    """The three cases: `small` rows, `large` rows (both mostly delivered), and
    `large` rows of which `many_pending` pending."""
    stream = env.prefix + "growth"
    cases = [
        measure_case(env, f"{small:,} rows", rows=small, pending=pending_small, claims=claims,
                     claim_batch=claim_batch, stream=stream),
        measure_case(env, f"{large:,} rows", rows=large, pending=pending_large, claims=claims,
                     claim_batch=claim_batch, stream=stream),
        measure_case(env, f"{many_pending:,} pending", rows=large, pending=many_pending, claims=claims,
                     claim_batch=claim_batch, stream=stream, reseed=False),
    ]
    env.reset_table()
    with env.engine.connect() as conn:
        conn.execute(text("DROP TABLE IF EXISTS bench_payload"))
    return {
        "claims": claims, "claim_batch": claim_batch, "cases": cases,
        "p99_ratio_1m_vs_10k": round(cases[1]["p99_ms"] / cases[0]["p99_ms"], 2),
        "median_ratio_1m_vs_10k": round(cases[1]["median_ms"] / cases[0]["median_ms"], 2),
        "plans_ok": all(c["plan"]["ok"] for c in cases),
    }
