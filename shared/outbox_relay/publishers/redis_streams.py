"""Redis Streams publisher: idempotent XADD through one Lua script, one pipeline per batch.

Entry fields (DESIGN.md): `id` (message id), `type`, `key` (omitted when none),
`payload` (JSON text), `created_at` (ISO 8601 UTC), `headers` (JSON, when any).

Idempotency: the script checks a dedupe key, then XADDs and stores the new
entry id under that key with a TTL, atomically (a Lua script runs as one unit:
Redis docs, "Scripting with Lua", atomicity). Re-publishing a message id whose
first XADD succeeded but whose ack was lost returns the first entry id and adds
nothing. The dedupe key lives in the stream's hash slot (Redis docs, "Redis
cluster specification", hash tags): `{stream}:outbox-dedupe:<id>`, or
`stream:outbox-dedupe:<id>` when the stream name already carries a hash tag.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import DownstreamUnavailable
from ..models import Channel, ClaimedMessage, DeliveryResult, ErrorClass
from .base import Deadline, RecordResults
from ..observability import logger as log


# KEYS[1] = stream; KEYS[1 + i] = dedupe key of message i.
# ARGV[1] = MAXLEN (0: no trimming), ARGV[2] = dedupe TTL in milliseconds,
# ARGV[2 + i] = message i's fields joined by NUL: id, type, key ('' = none),
# payload, created_at, headers ('' = none). One argument per message rather
# than six: the client packs every argument in Python (bench/: 5.9 -> 2.2 µs
# per message) and none of the fields can hold NUL (they come from PostgreSQL
# text, which cannot).
# Reply: one line per message, joined with "\n" into one string: "<entry id>"
# (added), "=<entry id>" (already published: nothing added), or "!<error>"
# (this message failed; others go on). One string rather than an array: the
# client parses a 250-element array reply line by line in Python, which cost
# about 10% of an invocation's client CPU (bench/).
PUBLISH_SCRIPT = """
local stream = KEYS[1]
local maxlen = ARGV[1]
local trim = tonumber(maxlen) > 0
local ttl = ARGV[2]
local find, sub, pcall = string.find, string.sub, redis.pcall
local out = {}
for i = 1, #KEYS - 1 do
  local dedupe = KEYS[i + 1]
  local prior = pcall('GET', dedupe)
  if type(prior) == 'string' then
    out[i] = '=' .. prior
  else
    local f = ARGV[i + 2]
    local a = find(f, '\\0', 1, true)
    local b = find(f, '\\0', a + 1, true)
    local c = find(f, '\\0', b + 1, true)
    local d = find(f, '\\0', c + 1, true)
    local e = find(f, '\\0', d + 1, true)
    local t = {'id', sub(f, 1, a - 1), 'type', sub(f, a + 1, b - 1)}
    if c > b + 1 then t[5] = 'key'; t[6] = sub(f, b + 1, c - 1) end
    t[#t + 1] = 'payload'; t[#t + 1] = sub(f, c + 1, d - 1)
    t[#t + 1] = 'created_at'; t[#t + 1] = sub(f, d + 1, e - 1)
    if e < #f then t[#t + 1] = 'headers'; t[#t + 1] = sub(f, e + 1) end
    local res
    if trim then
      res = pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', unpack(t))
    else
      res = pcall('XADD', stream, '*', unpack(t))
    end
    if type(res) == 'table' and res.err then
      out[i] = '!' .. string.gsub(res.err, '[\\r\\n]', ' ')
    else
      redis.call('SET', dedupe, res, 'PX', ttl)
      out[i] = res
    end
  end
end
return table.concat(out, '\\n')
"""

#: Messages per script call: bounds how long one call holds Redis (scripts block the server).
SCRIPT_CHUNK = 250

# Error replies that mean "Redis cannot take writes now", not "this message is bad".
_UNAVAILABLE_PREFIXES = ("OOM", "BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")
# redis-py exception classes whose reply code it strips from the text (older
# redis-py versions have no `status_code` attribute to recover it from).
_CODE_OF_CLASS = tuple(
    (code, getattr(redis.exceptions, name))
    for code, name in (("OOM", "OutOfMemoryError"), ("READONLY", "ReadOnlyError"), ("LOADING", "BusyLoadingError"),
                       ("TRYAGAIN", "TryAgainError"), ("CLUSTERDOWN", "ClusterDownError"),
                       ("MASTERDOWN", "MasterDownError"))
    if hasattr(redis.exceptions, name)
)
# Error replies that are this message's fault (e.g. the stream key holds another type).
_PERMANENT_PREFIXES = ("WRONGTYPE",)


def dedupe_key(stream: str, message_id: str) -> str:
    """The dedupe key of `message_id` on `stream`, in the stream's hash slot."""
    return dedupe_prefix(stream) + message_id


def dedupe_prefix(stream: str) -> str:
    """What every dedupe key of `stream` starts with: `{stream}:outbox-dedupe:`,
    or `stream:outbox-dedupe:` when the name already carries a hash tag."""
    start = stream.find("{")
    if start != -1 and stream.find("}", start + 2) != -1:
        return f"{stream}:outbox-dedupe:"
    return f"{{{stream}}}:outbox-dedupe:"


def classify_reply_error(text: str) -> ErrorClass:
    """Map a Redis error reply (e.g. ``"WRONGTYPE Operation against a key …"``) to an error class."""
    upper = text.lstrip().upper()
    if upper.startswith(_PERMANENT_PREFIXES):
        return ErrorClass.PERMANENT
    if upper.startswith(_UNAVAILABLE_PREFIXES):
        return ErrorClass.DOWNSTREAM_UNAVAILABLE
    return ErrorClass.TRANSIENT


def reply_error_text(exc: Exception) -> str:
    """The error reply as Redis sent it, code first (``"OOM command not allowed …"``).

    redis-py strips the code of replies it maps to its own exception classes
    (OutOfMemoryError, ReadOnlyError, BusyLoadingError, …) and keeps it in
    `status_code`; put it back so classification sees what the server said.
    """
    text = str(exc)
    code = getattr(exc, "status_code", None)
    if not code:
        code = next((c for c, cls in _CODE_OF_CLASS if isinstance(exc, cls)), None)
    if code and not text.upper().startswith(code):
        return f"{code} {text}"
    return text


def create_redis_client(url: str, *, socket_timeout_seconds: float = 5.0) -> redis.Redis:
    """A client for `redis://` or `rediss://` (TLS, certificate verified) URLs,
    with AUTH from the URL, as ElastiCache in-transit encryption needs.

    A failed command is retried once on a new connection after 0.1 s (a
    connection that died while the container was frozen); re-sending the
    publish script is safe because it is idempotent. `socket_timeout_seconds`
    bounds connect and each reply, in seconds.
    """
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout_seconds,
        socket_connect_timeout=socket_timeout_seconds,
        # No idle health check: on a schedule every invocation finds the pooled
        # connection idle for longer than any sensible interval, so redis-py
        # would send an extra PING round trip before the gate's own PING, which
        # already checks the connection (a dead one fails it and is retried once
        # on a new connection, below). bench/ counted 4 round trips instead of 2
        # for a batch after 30 s idle.
        health_check_interval=0,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.1), retries=1),
    )


class RedisStreamsPublisher:
    """Publishes claimed domain events to Redis Streams.

    Args:
        client: a `redis.Redis` (only `ping`, `pipeline`, `script_load` are used).
        dedupe_ttl_seconds: how long a published message id is remembered, seconds.
        maxlen: approximate stream length cap (`MAXLEN ~`), 0 for none.
    """

    channel = Channel.REDIS

    def __init__(self, client: Any, *, dedupe_ttl_seconds: int, maxlen: int = 0) -> None:
        self.client = client
        self.dedupe_ttl_ms = int(dedupe_ttl_seconds * 1000)
        self.maxlen = int(maxlen)
        self._sha: str | None = None

    def gate(self) -> str | None:
        """PING Redis; a reason string when it does not answer."""
        try:
            self.client.ping()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            return f"redis unavailable ({type(exc).__name__})"
        except ResponseError as exc:  # e.g. NOAUTH, LOADING
            return f"redis refused PING ({str(exc).split(' ', 1)[0]})"
        return None

    def claim_limit(self, batch_size: int, seconds_available: float) -> int:
        return batch_size if seconds_available > 0 else 0

    def _script_sha(self) -> str:
        """The publish script's SHA1, loaded on first use (and again after NOSCRIPT).

        Raises `DownstreamUnavailable` when Redis refuses `SCRIPT LOAD` for a
        reason that is not ours (BUSY with another script, LOADING, OOM, …, see
        `classify_reply_error`); any other error reply propagates."""
        if self._sha is None:
            try:
                self._sha = self.client.script_load(PUBLISH_SCRIPT)
            except ResponseError as exc:
                text = reply_error_text(exc)
                if classify_reply_error(text) is ErrorClass.DOWNSTREAM_UNAVAILABLE:
                    raise DownstreamUnavailable(f"redis refused SCRIPT LOAD ({text.split(' ', 1)[0]})") from exc
                raise
        return self._sha

    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None:
        """Publish all `messages` in one pipelined round trip and record the results once.

        Raises `DownstreamUnavailable` when the connection fails (nothing recorded;
        the relay releases the batch with attempts refunded; a message that did
        reach the stream is deduplicated on its next publish)."""
        if not messages or deadline.passed():
            return
        calls = self._build_calls(messages)
        try:
            replies = self._execute(calls)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise DownstreamUnavailable(f"redis connection failed mid-batch ({type(exc).__name__})") from exc
        results: list[DeliveryResult] = []
        for (_, batch), reply in zip(calls, replies):
            results.extend(self._results(batch, reply))
        record(results)

    def _build_calls(self, messages: Sequence[ClaimedMessage]) -> list[tuple[list[Any], list[ClaimedMessage]]]:
        by_stream: dict[str, list[ClaimedMessage]] = defaultdict(list)
        for m in messages:
            by_stream[m.destination].append(m)
        calls = []
        head = [str(self.maxlen), str(self.dedupe_ttl_ms)]
        join = "\0".join
        for stream, group in by_stream.items():
            prefix = dedupe_prefix(stream)
            for start in range(0, len(group), SCRIPT_CHUNK):
                batch = group[start:start + SCRIPT_CHUNK]
                keys = [stream]
                args = list(head)
                for m in batch:
                    mid = m.message_id
                    keys.append(prefix + mid)
                    args.append(join((mid, m.type, m.key or "", m.payload_json, m.created_at, m.headers_json or "")))
                calls.append(([len(keys), *keys, *args], batch))
        return calls

    def _execute(self, calls: list[tuple[list[Any], list[ClaimedMessage]]]) -> list[Any]:
        sha = self._script_sha()
        pipe = self.client.pipeline(transaction=False)
        for argv, _ in calls:
            pipe.evalsha(sha, *argv)
        replies = pipe.execute(raise_on_error=False)
        if any(isinstance(r, NoScriptError) for r in replies):
            # The server lost its script cache (restart, failover): load and redo
            # only those calls; they did not run, so nothing is added twice.
            self._sha = None
            sha = self._script_sha()
            redo = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
            pipe = self.client.pipeline(transaction=False)
            for i in redo:
                pipe.evalsha(sha, *calls[i][0])
            for i, r in zip(redo, pipe.execute(raise_on_error=False)):
                replies[i] = r
        for r in replies:
            if isinstance(r, (RedisConnectionError, RedisTimeoutError)):
                raise r
        return replies

    @staticmethod
    def _results(batch: list[ClaimedMessage], reply: Any) -> list[DeliveryResult]:
        if isinstance(reply, Exception):
            # The whole call failed (e.g. OOM before the script ran).
            text = reply_error_text(reply)
            cls = classify_reply_error(text)
            return [DeliveryResult(m.seq, error_class=cls, error=f"redis: {text}") for m in batch]
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        lines = text.split("\n")
        if len(lines) != len(batch):  # cannot happen with this script; never guess which is which
            return [DeliveryResult(m.seq, error_class=ErrorClass.TRANSIENT,
                                   error=f"redis: script replied {len(lines)} results for {len(batch)} messages")
                    for m in batch]
        out = []
        delivered = DeliveryResult.delivered
        for m, value in zip(batch, lines):
            if value.startswith("!"):
                text = value[1:]
                out.append(DeliveryResult(m.seq, error_class=classify_reply_error(text), error=f"redis: {text}"))
            else:
                out.append(delivered(m.seq, value.lstrip("=")))
        return out
