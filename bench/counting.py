"""Counting what crosses the wire: database statements (SQLAlchemy event hook)
and Redis round trips (a connection class that counts each packed send; a
pipeline is one send, whatever it holds)."""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Engine, event


class StatementCounter:
    """Counts statements executed on an engine (`before_cursor_execute`).

    `take()` returns the count since the last `take()` and starts again. With
    `apart`, statements whose text contains it are counted apart (`take_apart()`)
    and not by `take()`.
    """

    def __init__(self, engine: Engine, apart: str | None = None) -> None:
        self.engine = engine
        self.apart = apart
        self.count = self.apart_count = 0
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._on_execute)

    def _on_execute(self, conn: Any, cursor: Any, statement: str, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            if self.apart is not None and self.apart in statement:
                self.apart_count += 1
            else:
                self.count += 1

    def take(self) -> int:
        with self._lock:
            n, self.count = self.count, 0
        return n

    def take_apart(self) -> int:
        with self._lock:
            n, self.apart_count = self.apart_count, 0
        return n

    def remove(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._on_execute)


class RoundTripCounter:
    """Counts Redis round trips of a client: one per packed send on the wire
    (a command, or a whole pipeline). Install before the client connects."""

    def __init__(self, client: Any) -> None:
        self.count = 0
        if hasattr(client, "get_nodes"):  # a RedisCluster: every node's own client, as known now
            pools = [client.get_redis_connection(node).connection_pool for node in client.get_nodes()]
        else:
            pools = [client.connection_pool]
        for pool in pools:
            self._install(pool)

    def _install(self, pool: Any) -> None:
        counter = self
        base = pool.connection_class

        class CountingConnection(base):  # type: ignore[misc, valid-type]
            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                counter.count += 1
                return super().send_packed_command(command, check_health)

        CountingConnection.__name__ = f"Counting{base.__name__}"
        pool.disconnect()
        pool.connection_class = CountingConnection
        # A pool keeps its disconnected connection objects for reuse (of the old class):
        # drop them, so that every later connection counts.
        pool.reset()

    def take(self) -> int:
        n, self.count = self.count, 0
        return n
