"""`outbox demo`: the product end to end on whatever servers are at hand.

A small sample application writes its business rows and their outbox events
in one transaction (one transaction rolls back and leaves no message), a
realistic mix is enqueued, the real relay handler runs until the queue is
drained, and the report shows what reached Redis and what was dead-lettered.

It works only in what it creates: a database of its own (a fresh name unless
`--database-name`, and never one that exists) and keys under a prefix no key
uses yet (a fresh one unless `--prefix`). At the end, however it ends (Ctrl-C
included), it drops that database and deletes those keys, unless `--keep`,
and stops the embedded servers it started.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import uuid
from decimal import Decimal
from typing import Callable, Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from outbox_migrations import upgrade
from outbox_relay import runtime
from outbox_relay.producer import enqueue_event

from ..lambda_local import LocalContext, environment, load_handler, log_level
from ..servers import DatabaseExists, create_new_database, drop_database, find_servers, glob_escape, with_database
from .emails import run_email_demo

DEMO_DB = "outbox_demo"
PREFIX = "demo."
STREAM_NAMES = ("orders", "payments", "shipments")
BROKEN_NAME = "audit"  # made a plain string key, so XADD fails: a permanent failure
STAGED_EVENT = ("staged: the demo made {key} a plain string key, so XADD to it fails with WRONGTYPE, "
                "the message's own fault (permanent): dead-lettered at once while the rest is delivered")


class DemoRefused(ValueError):
    """The demo will not run with this option's value; nothing was created."""

    def __init__(self, option: str, problem: str) -> None:
        self.option, self.problem = option, problem
        super().__init__(f"{option}: {problem}")


def default_names() -> tuple[str, str]:
    """A database name and a key prefix of this run's own, so two demos at once never share them."""
    run = uuid.uuid4().hex[:8]
    return f"{DEMO_DB}_{run}", f"{PREFIX}{run}."


def check_names(database_name: str, prefix: str) -> None:
    """Refuse a database name other than letters, digits and underscores, and a
    Redis prefix that is empty or holds braces (stream names take braces only as
    a hash tag). Raises `DemoRefused` naming the option."""
    if not database_name or not database_name.replace("_", "").isalnum() or len(database_name) > 63:
        raise DemoRefused("--database-name", f"must be 1-63 letters, digits and underscores: {database_name[:70]!r}")
    if not prefix or any(c in prefix for c in "{}\x00"):
        raise DemoRefused("--prefix", f"must be non-empty, without braces: {prefix[:70]!r}")


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM off while cleaning up, so a second one cannot leave half of it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


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
             database_name: str | None = None, prefix: str | None = None) -> int:
    """Run the demo in a database it creates, `database_name` (default: a fresh
    name), with every Redis key under `prefix` (default: a fresh one); returns a
    process exit code (0 when everything went as expected).

    Raises `DemoRefused` before creating anything for an unusable name, a
    database that exists or a prefix some key already uses: the demo drops and
    deletes what it used, so it uses only what it created."""
    fresh_db, fresh_prefix = default_names()
    database_name = fresh_db if database_name is None else database_name
    prefix = fresh_prefix if prefix is None else prefix
    check_names(database_name, prefix)
    # A Ctrl-C cuts a connection mid-statement, and closing it then fails: the pool
    # logs that with a traceback, though the demo still removes everything it created.
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    streams = tuple(prefix + name for name in STREAM_NAMES)
    import redis as redis_lib

    created = False
    r = None
    servers = find_servers()
    try:
        r = redis_lib.Redis.from_url(servers.redis_url, decode_responses=True)
        if _demo_keys(r, prefix):
            raise DemoRefused("--prefix", f"keys under {prefix!r} exist already; the demo deletes the keys under "
                                          "its prefix, so it takes one no key uses")
        admin_url = servers.database_url
        db_url = with_database(admin_url, database_name)
        try:
            create_new_database(admin_url, database_name)
        except DatabaseExists:
            raise DemoRefused("--database-name", f"database {database_name} exists already; the demo drops its "
                                                 "database at the end, so it uses only one it creates") from None
        created = True
        echo(f"PostgreSQL: {servers.database_source}; Redis: {servers.redis_source}")
        echo(f"database {database_name} and keys under {prefix} are the demo's own"
             + ("" if keep else "; both are removed at the end"))
        return _run(echo, r, db_url, servers.redis_url, prefix, streams)
    finally:
        with _uninterrupted():
            runtime.reset()
            if not keep:
                if created:
                    with contextlib.suppress(Exception):
                        drop_database(servers.database_url, database_name)
                if r is not None and created:
                    with contextlib.suppress(Exception):
                        _delete_demo_keys(r, prefix)
            if r is not None:
                r.close()
            servers.close()


def _run(echo: Callable[[str], None], r, db_url: str, redis_url: str, prefix: str,  # noqa: ANN001
         streams: tuple[str, ...]) -> int:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        upgrade(engine)
        echo("migrated: outbox_message is ready")
        broken = prefix + BROKEN_NAME
        r.set(broken, "not a stream")  # XADD to this key fails with WRONGTYPE

        written = _sample_app(engine, echo, prefix)
        echo(f"enqueued {written} events in application transactions")

        totals = {"claimed": 0, "delivered": 0, "retried": 0, "dead": 0, "released": 0}
        # The handler's warnings are the staged dead letters, which the report explains:
        # only an error is printed between the demo's own lines.
        with environment(DATABASE_URL=db_url, REDIS_URL=redis_url, OUTBOX_CHANNEL="redis",
                         OUTBOX_BATCH_SIZE="10", OUTBOX_BACKOFF_BASE_SECONDS="0.05",
                         OUTBOX_BACKOFF_CAP_SECONDS="0.2", OUTBOX_BACKOFF_FLOOR_SECONDS="0",
                         POWERTOOLS_TRACE_DISABLED="true", POWERTOOLS_METRICS_NAMESPACE="OutboxRelayDemo",
                         POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true"), log_level("ERROR"):
            runtime.reset()
            handler = load_handler("relay")
            invocations = 0
            while True:
                summary = handler({"source": "outbox.demo", "channel": "redis"}, LocalContext(60))
                invocations += 1
                for k in totals:
                    totals[k] += summary[k]
                if summary["claimed"] == 0:
                    break
            runtime.reset()
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
        echo("\nDead letters (one is staged on purpose, see below):")
        for mid, dest, cls, err in dead:
            echo(f"  {mid} → {dest}: [{cls}] {err}")
            if dest == broken:
                echo("    " + STAGED_EVENT.format(key=broken))
        echo(f"\nstill pending: {left}; rolled-back orders in the table: {rolled_back}")
        expected_delivered = written - 1
        ok = (totals["delivered"] == expected_delivered and [d[1] for d in dead] == [broken] and left == 0
              and rolled_back == 0)
        ok = run_email_demo(db_url, echo) and ok
        echo("demo OK: everything was delivered except the two failures staged on purpose, which are dead "
             "letters as they should be" if ok else
             "demo FAILED: the figures above are not what was expected")
        return 0 if ok else 1
    finally:
        engine.dispose()


def _patterns(prefix: str) -> tuple[str, str]:
    """SCAN patterns of the demo's keys: its streams and their dedupe keys (`{stream}:…`)."""
    return f"{glob_escape(prefix)}*", f"{{{glob_escape(prefix)}*"


def _demo_keys(r, prefix: str) -> list[str]:  # noqa: ANN001
    return [k for pattern in _patterns(prefix) for k in r.scan_iter(match=pattern, count=1000)]


def _delete_demo_keys(r, prefix: str) -> None:  # noqa: ANN001
    keys = _demo_keys(r, prefix)
    for i in range(0, len(keys), 500):
        r.delete(*keys[i:i + 500])
