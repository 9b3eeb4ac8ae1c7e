"""The real relay handler (functions/relay/app.py), configured for the bench
database and prefix, with its output silenced and its wire traffic counted.

Every invocation goes through the whole Lambda path: the Powertools decorators
(logger context, EMF metrics flush, tracer), `run_relay` (event parsing,
timeout check, lease token, `RelayLoop.run`, the oldest pending age (read by the
outcome write, or by its own query when nothing was recorded),
metrics and the summary log line) and the cached per-container dependencies
of `runtime` (the autocommit engine of `db.create_relay_engine`, the
`RedisStreamsPublisher` with its Lua script).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from outbox_relay import observability as obs
from outbox_relay import runtime
from outbox_tools.lambda_local import LocalContext, environment, load_handler, project_root

from .counting import RoundTripCounter, StatementCounter
from .env import BenchEnv


class _Discard(io.TextIOBase):
    """A text sink: log lines and EMF blobs are formatted (their cost counts) and dropped."""

    def write(self, s: str) -> int:
        return len(s)


def schedule_event(channel: str = "redis") -> dict[str, Any]:
    """The sample schedule event of events/ for `channel`."""
    path = project_root() / "events" / f"relay-{channel}-scheduler.json"
    return json.loads(path.read_text())


@dataclass
class Relay:
    """One container's worth of relay: call `invoke()` for one invocation."""

    handler: Callable[[dict, Any], dict]
    deps: runtime.Dependencies
    statements: StatementCounter
    round_trips: RoundTripCounter | None
    event: dict[str, Any]
    timeout_seconds: float

    def invoke(self) -> dict[str, Any]:
        """One invocation of the real handler with a fresh Lambda-like context."""
        context = LocalContext(timeout_seconds=self.timeout_seconds, function_name="outbox-relay-bench")
        return self.handler(self.event, context)


def bench_environment(env: BenchEnv, batch_size: int, channel: str = "redis",
                      extra: dict[str, str | None] | None = None) -> dict[str, str | None]:
    """Environment variables of a relay function pointed at the bench database."""
    values = probe_environment(env.database_url, env.servers.redis_url, batch_size, channel)
    values.update(extra or {})
    return values


def probe_environment(database_url: str, redis_url: str, batch_size: int,
                      channel: str = "redis") -> dict[str, str | None]:
    """Environment variables of a relay function on the given servers: every
    OUTBOX_ setting of this process unset, then the channel and batch size;
    probe processes (memory, instructions) get the URLs rather than a `BenchEnv`."""
    values: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTBOX_")}
    values.update({
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "DATABASE_SECRET_ARN": None,
        "REDIS_URL_SECRET_ARN": None,
        "OUTBOX_CHANNEL": channel,
        "OUTBOX_BATCH_SIZE": str(batch_size),
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_METRICS_NAMESPACE": "OutboxRelayBench",
    })
    return values


@contextlib.contextmanager
def relay(env: BenchEnv, batch_size: int, *, channel: str = "redis", timeout_seconds: float = 60.0,
          extra_env: dict[str, str | None] | None = None,
          prepare: Callable[[runtime.Dependencies], None] | None = None) -> Iterator[Relay]:
    """A warm relay container for `batch_size`: dependencies built (cold start done,
    connections open, Lua script loaded), counters installed, output silenced.

    `prepare(deps)` runs after the dependencies are built and before the warm-up
    invocation (the SES bench swaps in its moto client there)."""
    sink = _Discard()
    with environment(**bench_environment(env, batch_size, channel, extra_env)):
        runtime.reset()
        handler = load_handler("relay")
        deps = runtime.get_dependencies()
        if prepare is not None:
            prepare(deps)
        statements = StatementCounter(runtime.get_engine(), apart="outbox_poller")
        client = getattr(deps.publisher, "client", None)
        round_trips = RoundTripCounter(client) if channel == "redis" and client is not None else None
        log_handler = obs.logger.registered_handler
        previous = log_handler.setStream(sink)
        try:
            with contextlib.redirect_stdout(sink):
                r = Relay(handler, deps, statements, round_trips, schedule_event(channel), timeout_seconds)
                # Warm up: connect to both servers and load the script, as a warm container has.
                load_script = getattr(deps.publisher, "_script_sha", None)
                if load_script is not None:
                    load_script()
                r.invoke()
                statements.take()
                if round_trips is not None:
                    round_trips.take()
                yield r
        finally:
            log_handler.setStream(previous)
            statements.remove()
            runtime.reset()
