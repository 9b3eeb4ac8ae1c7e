"""`outbox demo`: the product end to end on whatever servers are at hand.

A small sample application writes its business rows and their outbox events
in one transaction (one transaction rolls back and leaves no message), a
realistic mix is enqueued, the real relay handler runs until the queue is
drained, and the report shows what reached Redis and what was dead-lettered.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Callable

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from .local import (LocalContext, create_database, drop_database, environment, find_servers,
                    load_handler, with_database)
from .migrate import upgrade
from .producer import enqueue_event

DEMO_DB = "outbox_demo"
PREFIX = "demo."
STREAM_NAMES = ("orders", "payments", "shipments")
BROKEN_NAME = "audit"  # made a plain string key, so XADD fails: a permanent failure


def check_names(database_name: str, prefix: str) -> None:
    """Refuse a database name other than letters, digits and underscores, and a
    Redis prefix that is empty or holds a glob character (the demo deletes the
    keys matching it). Raises ValueError naming the option."""
    if not database_name or not database_name.replace("_", "").isalnum():
        raise ValueError(f"--database-name must be letters, digits and underscores: {database_name!r}")
    if not prefix or any(c in prefix for c in "*?[]{}"):
        raise ValueError(f"--prefix must be non-empty and free of glob characters and braces: {prefix!r}")


def _sample_app(engine, echo: Callable[[str], None], prefix: str) -> int:
    """Place orders: each transaction writes an order row and its events together."""
    with engine.begin() as conn:
        conn.execute(text("""CREATE TABLE IF NOT EXISTS demo_order (
            id uuid PRIMARY KEY, customer text NOT NULL, total numeric(12,2) NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now())"""))
    orders = [
        ("Jiwoo Park", Decimal("42000.00"), {"items": [{"sku": "떡볶이-01", "qty": 2}], "note": "맵게 🌶️"}),
        ("Zoë Müller", Decimal("19.90"), {"items": [{"sku": "crème-brûlée", "qty": 1}], "gift": True}),
        ("Ana Núñez", Decimal("7.50"), {"items": [{"sku": "café", "qty": 3, "options": {"milk": "oat"}}]}),
    ]
    written = 0
    for customer, total, detail in orders:
        with engine.begin() as conn:
            order_id = uuid.uuid4()
            conn.execute(text("INSERT INTO demo_order (id, customer, total) VALUES (:i, :c, :t)"),
                         {"i": order_id, "c": customer, "t": total})
            enqueue_event(conn, stream=prefix + "orders", type="order.placed", key=str(order_id),
                          payload={"order_id": str(order_id), "total": str(total), "detail": detail})
            enqueue_event(conn, stream=prefix + "payments", type="payment.requested", key=str(order_id),
                          payload={"order_id": str(order_id), "amount": {"value": str(total), "currency": "EUR"}})
            written += 2
    # A transaction that fails after writing: neither the order nor its event survive.
    try:
        with engine.begin() as conn:
            order_id = uuid.uuid4()
            conn.execute(text("INSERT INTO demo_order (id, customer, total) VALUES (:i, 'Rolled Back', 1)"),
                         {"i": order_id})
            enqueue_event(conn, stream=prefix + "orders", type="order.placed", payload={"order_id": str(order_id)})
            raise RuntimeError("payment provider said no; the whole transaction rolls back")
    except RuntimeError:
        echo("  one order transaction rolled back: its event was never enqueued")
    # A realistic mix: several streams, nested JSON, Unicode, one permanent failure.
    with engine.begin() as conn:
        for i in range(20):
            enqueue_event(conn, stream=prefix + "shipments", type="shipment.updated", key=f"parcel-{i % 4}",
                          payload={"parcel": f"parcel-{i % 4}", "step": i, "where": {"city": "Zürich", "hub": "北"}})
            written += 1
        enqueue_event(conn, stream=prefix + BROKEN_NAME, type="audit.logged", payload={"who": "demo"})
        written += 1
    return written


def run_demo(*, keep: bool = False, echo: Callable[[str], None] = print,
             database_name: str = DEMO_DB, prefix: str = PREFIX) -> int:
    """Run the demo in the database `database_name` (dropped and created again)
    with every Redis key under `prefix`; returns a process exit code (0 when
    everything went as expected). Raises ValueError for an unusable name."""
    check_names(database_name, prefix)
    streams = tuple(prefix + name for name in STREAM_NAMES)
    servers = find_servers()
    echo(f"PostgreSQL: {servers.database_source}; Redis: {servers.redis_source}")
    import redis as redis_lib

    admin_url = servers.database_url
    db_url = with_database(admin_url, database_name)
    try:
        drop_database(admin_url, database_name)
        create_database(admin_url, database_name)
        engine = create_engine(db_url, poolclass=NullPool)
        upgrade(engine)
        echo("migrated: outbox_message is ready")
        r = redis_lib.Redis.from_url(servers.redis_url, decode_responses=True)
        _clear_redis(r, prefix)
        r.set(prefix + BROKEN_NAME, "not a stream")  # XADD to this key fails with WRONGTYPE

        written = _sample_app(engine, echo, prefix)
        echo(f"enqueued {written} events in application transactions")

        totals = {"claimed": 0, "delivered": 0, "retried": 0, "dead": 0, "released": 0}
        with environment(DATABASE_URL=db_url, REDIS_URL=servers.redis_url, OUTBOX_CHANNEL="redis",
                         OUTBOX_BATCH_SIZE="10", OUTBOX_BACKOFF_BASE_SECONDS="0.05",
                         OUTBOX_BACKOFF_CAP_SECONDS="0.2", OUTBOX_BACKOFF_FLOOR_SECONDS="0",
                         POWERTOOLS_TRACE_DISABLED="true", POWERTOOLS_METRICS_NAMESPACE="OutboxRelayDemo",
                         POWERTOOLS_LOG_LEVEL="WARNING", POWERTOOLS_METRICS_DISABLED="true"):
            from .runtime import reset

            reset()
            handler = load_handler("relay")
            invocations = 0
            while True:
                summary = handler({"source": "outbox.demo", "channel": "redis"}, LocalContext(60))
                invocations += 1
                for k in totals:
                    totals[k] += summary[k]
                if summary["claimed"] == 0:
                    break
            reset()
        echo(f"relay: {invocations} invocations, " + ", ".join(f"{k} {v}" for k, v in totals.items()))

        echo("\nWhat reached Redis:")
        for stream in streams:
            entries = r.xrange(stream)
            echo(f"  {stream}: {len(entries)} entries")
            for entry_id, fields in entries[:2]:
                echo(f"    {entry_id} type={fields['type']} payload={fields['payload'][:90]}")
        with engine.connect() as conn:
            dead = conn.execute(text(
                "SELECT message_id, destination, last_error_class, last_error FROM outbox_message "
                "WHERE status = 'dead' ORDER BY seq")).fetchall()
            left = conn.execute(text(
                "SELECT count(*) FROM outbox_message WHERE status IN ('pending', 'leased')")).scalar_one()
            rolled_back = conn.execute(text(
                "SELECT count(*) FROM demo_order WHERE customer = 'Rolled Back'")).scalar_one()
        echo("\nDead letters:")
        for mid, dest, cls, err in dead:
            echo(f"  {mid} → {dest}: [{cls}] {err}")
        echo(f"\nstill pending: {left}; rolled-back orders in the table: {rolled_back}")
        expected_delivered = written - 1
        ok = totals["delivered"] == expected_delivered and len(dead) == 1 and left == 0 and rolled_back == 0
        from .demo_email import run_email_demo

        ok = run_email_demo(db_url, echo) and ok
        echo("demo OK" if ok else "demo FAILED: the figures above are not what was expected")
        engine.dispose()
        if not keep:
            _clear_redis(r, prefix)
        return 0 if ok else 1
    finally:
        if not keep:
            try:
                drop_database(admin_url, database_name)
            except Exception:
                pass
        servers.close()


def _clear_redis(r, prefix: str) -> None:
    keys = list(r.scan_iter(match=f"{prefix}*")) + list(r.scan_iter(match=f"{{{prefix}*"))
    if keys:
        r.delete(*keys)
