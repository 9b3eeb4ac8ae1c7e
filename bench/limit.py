"""The physical reference every other figure is compared with: a minimal loop
with no framework, doing only what delivering a backlog exactly needs.

Per batch: one statement claims up to 1,000 due rows (`UPDATE … FROM (SELECT …
FOR UPDATE SKIP LOCKED) … RETURNING`, the body's payload with each row), one
pipelined round trip XADDs them to their streams with the relay's entry fields,
one `UPDATE` marks them delivered. pg8000's native API in autocommit and a
redis-py pipeline, on the same table, indexes, payloads and servers as the
relay; no dedupe key, no fencing, no error handling, no outcome per message.
It runs as one process and as two draining one backlog together.
"""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import unquote, urlparse

from .concurrency import delivery_check, run_together
from .env import BenchEnv

CLAIM = """
    WITH picked AS (
        SELECT seq FROM outbox_message
         WHERE status = 'pending' AND channel = 'redis' AND available_at <= now()
         ORDER BY available_at, seq
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
    )
    UPDATE outbox_message o
       SET status = 'leased', attempts = o.attempts + 1, lease_owner = :owner,
           lease_expires_at = now() + interval '2 minutes'
     WHERE o.seq = ANY (ARRAY(SELECT seq FROM picked))
    RETURNING o.seq, o.message_id::text, o.destination, o.type, o.key,
              (SELECT b.payload::text FROM outbox_message_body b WHERE b.seq = o.seq),
              to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
"""
DONE = """
    UPDATE outbox_message
       SET status = 'delivered', delivered_at = now(), lease_owner = NULL, lease_expires_at = NULL
     WHERE seq = ANY (CAST(:seqs AS bigint[]))
"""


def _connect(database_url: str) -> Any:
    """A pg8000 native connection (autocommit: every statement its own transaction)."""
    import pg8000.native

    u = urlparse(database_url.replace("postgresql+pg8000://", "postgresql://", 1))
    query = dict(p.split("=", 1) for p in u.query.split("&") if "=" in p)
    kw: dict[str, Any] = {"user": unquote(u.username or "postgres"), "database": u.path.lstrip("/") or "postgres",
                          "application_name": "bench-limit"}
    if u.password:
        kw["password"] = unquote(u.password)
    if "unix_sock" in query:
        kw["unix_sock"] = query["unix_sock"]
    else:
        kw["host"], kw["port"] = u.hostname or "127.0.0.1", u.port or 5432
    return pg8000.native.Connection(**kw)


def drain_minimal(database_url: str, redis_url: str, batch_size: int) -> int:
    """Run the minimal loop until a claim returns nothing; returns the messages delivered."""
    import redis

    con = _connect(database_url)
    client = redis.Redis.from_url(redis_url)
    owner = f"limit:{uuid.uuid4().hex[:8]}"
    delivered = 0
    try:
        while True:
            rows = con.run(CLAIM, limit=batch_size, owner=owner)
            if not rows:
                return delivered
            pipe = client.pipeline(transaction=False)
            for _, message_id, stream, type_, key, payload, created_at in rows:
                fields = {"id": message_id, "type": type_, "payload": payload, "created_at": created_at}
                if key is not None:
                    fields["key"] = key
                pipe.xadd(stream, fields)
            pipe.execute()
            con.run(DONE, seqs=[r[0] for r in rows])
            delivered += len(rows)
    finally:
        con.close()
        client.close()


def _worker(ready: Any, go: Any, out: Any, database_url: str, redis_url: str, batch_size: int) -> None:
    try:
        _connect(database_url).close()  # imports and a first connection, before the clock starts
        ready.release()
        go.wait()
        started = time.perf_counter()
        n = drain_minimal(database_url, redis_url, batch_size)
        out.put({"delivered": n, "seconds": time.perf_counter() - started, "error": None})
    except BaseException as exc:  # report, never hang the parent
        ready.release()
        out.put({"delivered": 0, "seconds": 0.0, "error": f"{type(exc).__name__}: {exc}"})


def run_limit(env: BenchEnv, *, n: int, batch_size: int = 1000, processes: tuple[int, ...] = (1, 2),
              streams: tuple[str, ...]) -> dict[str, Any]:
    """Drain `n` messages with the minimal loop in each process count of `processes`."""
    runs = []
    for k in processes:
        reports, wall = run_together(env, k, _worker, (env.database_url, env.servers.redis_url, batch_size),
                                     n=n, streams=streams, what="minimal-loop")
        delivered = sum(r["delivered"] for r in reports)
        runs.append({
            "processes": k,
            "wall_seconds": round(wall, 3),
            "messages_per_second": round(delivered / wall, 1) if wall else None,
            "delivered": delivered,
            "check": delivery_check(env, n, delivered),
        })
    return {"messages": n, "batch_size": batch_size, "runs": runs}
