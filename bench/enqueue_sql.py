"""`python -m bench enqueue-sql`: enqueue through the SQL functions (migration 0009)
against the Python producer API, in one run (docs/decisions/0048).

Each way writes one message per transaction, as a business transaction does,
from the same Python process, driver (pg8000 through SQLAlchemy) and connection
kind, so the difference is where the rules run: in Python before one INSERT
statement, or in plpgsql inside the database. The ways alternate in rounds so
the host's load changes touch all of them alike; a rate is the median round's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from outbox_relay.producer import enqueue_email, enqueue_event

from .env import BenchEnv

EVENT_SQL = text("SELECT outbox_enqueue_event_v1(stream => :stream, type => :type, payload => CAST(:payload AS json), "
                 "key => :key)")
EMAIL_SQL = text('SELECT outbox_enqueue_email_v1("to" => CAST(:to AS text[]), subject => :subject, text => :text, '
                 "html => :html, key => :key)")
PAYLOAD = '{"order_id":%d,"customer":"c-42","total":{"amount":"129.90","currency":"EUR"},' \
          '"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]}'


def _ways(stream: str) -> dict[str, Callable[[Any, int], Any]]:
    import json

    def email_args(i: int) -> dict[str, Any]:
        return dict(to=[f"Buyer {i} <buyer{i}@example.com>"], subject=f"Order {i} confirmed",
                    text=f"Thank you for order {i}.", html=f"<p>Thank you for order {i}.</p>", key=f"order-{i}")

    return {
        "event_python": lambda c, i: enqueue_event(c, stream=stream, type="order.placed",
                                                   payload=json.loads(PAYLOAD % i), key=f"order-{i}"),
        "event_sql": lambda c, i: c.execute(EVENT_SQL, dict(stream=stream, type="order.placed", payload=PAYLOAD % i,
                                                            key=f"order-{i}")).scalar_one(),
        "email_python": lambda c, i: enqueue_email(c, **email_args(i)),
        "email_sql": lambda c, i: c.execute(EMAIL_SQL, email_args(i)).scalar_one(),
    }


def run_enqueue_sql(env: BenchEnv, *, n: int, rounds: int = 5) -> dict[str, Any]:
    """Enqueue `n` messages each way (events and emails, Python API and SQL function),
    in `rounds` alternating rounds; rates in messages per second and their ratios."""
    engine = create_engine(env.database_url, poolclass=NullPool)
    ways = _ways(env.prefix + "enqueue")
    per_round = max(1, n // rounds)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    try:
        with engine.connect() as conn:
            for r in range(rounds):
                for name, write in ways.items():
                    started = time.perf_counter()
                    for i in range(per_round):
                        with conn.begin():
                            write(conn, r * per_round + i)
                    seconds[name].append(time.perf_counter() - started)
            written = conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one()
    finally:
        engine.dispose()
    rates = {name: round(per_round / statistics.median(s), 1) for name, s in seconds.items()}
    expected = per_round * rounds * len(ways)
    return {
        "messages_per_way": per_round * rounds, "rounds": rounds, "transaction": "one message per transaction",
        "messages_per_second": rates,
        "sql_vs_python": {"event": round(rates["event_sql"] / rates["event_python"], 2),
                          "email": round(rates["email_sql"] / rates["email_python"], 2)},
        "check": {"ok": written == expected, "written": written, "expected": expected},
    }
