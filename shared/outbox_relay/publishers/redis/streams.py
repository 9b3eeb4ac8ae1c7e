"""Redis Streams publisher: one pipeline of the publish script per batch (per node in a cluster), WAIT
for replicas last in it when asked (docs/channels.md)."""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import redis
from redis.exceptions import AskError, MovedError, NoScriptError, RedisClusterException, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...errors import DownstreamUnavailable
from ...models import ClaimedMessage, DeliveryResult, ErrorClass
from ..base import Deadline, Publisher, RecordResults
from ..registry import Channel
from . import MEMORY_FULL, METRICS, NOT_REPLICATED, STREAM_FULL, TRIMMED_UNACKNOWLEDGED
from .entries import cloudevent_fields, plain_fields
from .script import KEY_STOPPED, PUBLISH_SCRIPT, all_failed, dedupe_prefix, script_calls
from .settings import RedisFormat, RedisOnFull, RedisTrim

#: Threads sending a batch's per-node pipelines in a cluster.
NODE_THREADS = 16
STREAM_AT_BOUND = ("redis: not attempted: the stream is at OUTBOX_REDIS_MAXLEN and a consumer group has not "
                   "acknowledged the entries trimming would remove")

# Error replies that mean "Redis cannot take writes now", not "this message is bad".
_UNAVAILABLE_PREFIXES = ("OOM", "BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS",
                         "MOVED", "ASK")
# Exception classes whose reply code redis-py strips (older ones have no `status_code`).
_CODE_OF_CLASS = tuple((code, getattr(redis.exceptions, name)) for code, name in (
    ("MOVED", "MovedError"), ("ASK", "AskError"), ("OOM", "OutOfMemoryError"), ("READONLY", "ReadOnlyError"),
    ("LOADING", "BusyLoadingError"), ("TRYAGAIN", "TryAgainError"), ("CLUSTERDOWN", "ClusterDownError"),
    ("MASTERDOWN", "MasterDownError")) if hasattr(redis.exceptions, name))
_PERMANENT_PREFIXES = ("WRONGTYPE",)


class RedisStreamsPublisher(Publisher):
    """Publishes to Redis Streams; the arguments are the OUTBOX_REDIS_* settings (docs/configuration.md)."""

    channel = Channel.REDIS
    pipelined = True

    def __init__(self, client: Any, *, dedupe_ttl_seconds: int, maxlen: int = 0,
                 trim: RedisTrim = RedisTrim.MAXLEN, on_full: RedisOnFull = RedisOnFull.HOLD,
                 wait_replicas: int = 0, wait_timeout_ms: int = 1000, memory_high: float = 0.9,
                 oom_backoff_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 entry_format: RedisFormat = RedisFormat.FIELDS, cloudevents_source: str = "/outbox-relay") -> None:
        self.client = client
        self.entry_fields = cloudevent_fields(cloudevents_source) \
            if RedisFormat(entry_format) is RedisFormat.CLOUDEVENTS else plain_fields
        self.dedupe_ttl_ms = int(dedupe_ttl_seconds * 1000)
        self.maxlen = int(maxlen)
        self.trimming = "maxlen" if RedisTrim(trim) is RedisTrim.MAXLEN else RedisOnFull(on_full).value
        self.wait_replicas = int(wait_replicas)
        self.wait_timeout_ms = int(wait_timeout_ms)
        self.memory_high = float(memory_high)
        self.oom_backoff_seconds = float(oom_backoff_seconds)
        self.clock = clock
        self._sha: str | None = None
        self._info_refused = False
        self.cluster = _is_cluster(client)
        self._refresh_slots = False
        self._nodes_pool: ThreadPoolExecutor | None = None
        #: When Redis last answered OOM, until the gate saw it recover.
        self.oom_at: float | None = None
        self._counts: dict[str, int] = dict.fromkeys(METRICS, 0)

    @property
    def counters(self) -> Mapping[str, int]:
        return self._counts

    def begin(self, deadline: Deadline) -> None:
        self._counts = dict.fromkeys(METRICS, 0)

    def gate(self) -> str | None:
        """Every primary answers (not loading its data), is below the memory mark (no OOM since) and has
        WAIT's replicas."""
        try:
            if self._refresh_slots:
                # A node failed mid-batch: ask the cluster which node serves which slot now.
                self.client.nodes_manager.initialize()
                self._refresh_slots = False
            for node in self._primaries():
                reason = self._gate_node(node)
                if reason is not None:
                    return reason
        except (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException) as exc:
            self._refresh_slots = self.cluster
            return f"redis unavailable ({type(exc).__name__})"
        except ResponseError as exc:  # e.g. NOAUTH, LOADING
            return f"redis refused PING ({reply_error_text(exc).split(' ', 1)[0]})"
        return None

    def _primaries(self) -> list[Any]:
        if not self.cluster:
            return [self.client]
        return [self.client.get_redis_connection(n) for n in self.client.get_primaries()]

    def _gate_node(self, node: Any) -> str | None:
        if self._info_refused:
            node.ping()
            return self._oom_gate(None)
        pipe = node.pipeline(transaction=False)
        # Redis answers INFO while it loads its data after a restart, but refuses PING and every write (LOADING).
        pipe.ping()
        pipe.info("memory")
        if self.wait_replicas:
            pipe.info("replication")
        try:
            _, *replies = pipe.execute()
        except ResponseError as exc:
            if reply_error_text(exc).startswith("NOPERM") or "unknown command" in str(exc).lower():
                # INFO renamed or not granted (an ACL): fall back to PING and the remembered OOM.
                self._info_refused = True
                return self._gate_node(node)
            raise
        reason = self._oom_gate(replies[0])
        if reason is None and self.wait_replicas:
            replication = replies[1]
            connected = int(replication.get("connected_slaves", 0))
            if replication.get("role") == "master" and connected < self.wait_replicas:
                reason = (f"redis primary has {connected} replicas connected, "
                          f"OUTBOX_REDIS_WAIT_REPLICAS asks for {self.wait_replicas}")
        return reason

    def _oom_gate(self, memory: dict[str, Any] | None) -> str | None:
        used = int(memory.get("used_memory", 0)) if memory else 0
        limit = int(memory.get("maxmemory", 0)) if memory else 0
        policy = str(memory.get("maxmemory_policy", "noeviction")) if memory else "noeviction"
        # An allkeys-* policy evicts to make room, so being near the limit is its normal state.
        known = limit > 0 and not policy.startswith("allkeys")
        if known and used >= self.memory_high * limit:
            self._counts[MEMORY_FULL] += 1
            return f"redis memory at {100 * used // limit}% of maxmemory ({policy})"
        if self.oom_at is not None:
            if known or self.clock() - self.oom_at >= self.oom_backoff_seconds:
                self.oom_at = None
            else:
                self._counts[MEMORY_FULL] += 1
                return "redis answered OOM to the last batch"
        return None

    def claim_limit(self, batch_size: int, seconds_available: float) -> int:
        return batch_size if seconds_available > 0 else 0

    def _script_sha(self) -> str:
        if self._sha is None:
            self._sha = self._load_script(self.client)
        return self._sha

    def _load_script(self, node: Any) -> str:
        """`SCRIPT LOAD` on `node`; `DownstreamUnavailable` when Redis cannot take it now (BUSY, OOM, …)."""
        try:
            return node.script_load(PUBLISH_SCRIPT)
        except ResponseError as exc:
            text = reply_error_text(exc)
            if classify_reply_error(text) is ErrorClass.DOWNSTREAM_UNAVAILABLE:
                self._note_error(text)
                raise DownstreamUnavailable(f"redis refused SCRIPT LOAD ({text.split(' ', 1)[0]})") from exc
            raise

    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None:
        """One pipelined round trip, recorded once. `DownstreamUnavailable` when the connection
        fails or too few replicas acknowledged (what reached the stream is deduplicated next time)."""
        if not messages or deadline.passed():
            return
        calls = self._build_calls(messages)
        try:
            replies, unconfirmed = self._execute(calls)
        except (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException) as exc:
            self._refresh_slots = self.cluster
            raise DownstreamUnavailable(f"redis connection failed mid-batch ({type(exc).__name__})") from exc
        results: list[DeliveryResult] = []
        not_replicated = 0
        for i, ((_, batch), reply) in enumerate(zip(calls, replies)):
            got = self._results(batch, reply)
            if i in unconfirmed:
                # A failover could lose what only the primary has: not recorded delivered.
                kept = [r for r in got if r.error_class is not None]
                not_replicated += len(got) - len(kept)
                got = kept
            results.extend(got)
        record(results)
        if not_replicated:
            self._counts[NOT_REPLICATED] += not_replicated
            raise DownstreamUnavailable(f"redis: fewer than {self.wait_replicas} replicas acknowledged "
                                        f"{not_replicated} messages within {self.wait_timeout_ms} ms")

    def _build_calls(self, messages: Sequence[ClaimedMessage]) -> list[tuple[list[Any], list[ClaimedMessage]]]:
        by_stream: dict[str, list[ClaimedMessage]] = defaultdict(list)
        for m in messages:
            by_stream[m.destination].append(m)
        calls = []
        head = [str(self.maxlen), str(self.dedupe_ttl_ms), self.trimming, "1" if self.wait_replicas else "0"]
        fields = self.entry_fields
        for stream, group in by_stream.items():
            prefix = dedupe_prefix(stream)
            for batch in script_calls(group):
                keys = [stream]
                args = list(head)
                for m in batch:
                    keys.append(prefix + m.message_id)
                    args.append(fields(m))
                calls.append(([len(keys), *keys, *args], batch))
        return calls

    def _execute(self, calls: list[tuple[list[Any], list[ClaimedMessage]]]) -> tuple[list[Any], set[int]]:
        """The replies in the order of `calls`, and the calls too few replicas acknowledged. Calls
        refused with NOSCRIPT, MOVED or ASK are sent once more; a second refusal stays a reply."""
        sha = self._script_sha()
        replies: list[Any] = [None] * len(calls)
        replicas: list[int] = [0] * len(calls)
        todo: list[tuple[int, tuple[str, int] | None]] = [(i, None) for i in range(len(calls))]
        for attempt in range(2):
            again: list[tuple[int, tuple[str, int] | None]] = []
            groups = list(self._by_node(calls, todo).items())
            sent = self._run_all(sha, [(node, [(calls[i][0], ask is not None) for i, ask in items])
                                       for node, items in groups])
            for (node, items), (got, acked) in zip(groups, sent):
                noscript = False
                for (i, _), reply in zip(items, got):
                    replies[i], replicas[i] = reply, acked
                    if isinstance(reply, NoScriptError):
                        noscript = True
                        again.append((i, None))
                    elif not self.cluster:
                        continue  # a redirect to a single-node client: nowhere to follow it, released
                    elif isinstance(reply, MovedError):
                        self.client.nodes_manager.move_slot(reply)
                        again.append((i, None))
                    elif isinstance(reply, AskError):
                        again.append((i, reply.node_addr))
                if noscript and attempt == 0:
                    self._load_script(node)
            if not again:
                break
            todo = again
        for r in replies:
            if isinstance(r, (RedisConnectionError, RedisTimeoutError)):
                raise r
        unconfirmed = {i for i, n in enumerate(replicas) if n < self.wait_replicas} if self.wait_replicas else set()
        return replies, unconfirmed

    def _by_node(self, calls: list[tuple[list[Any], list[ClaimedMessage]]],
                 todo: list[tuple[int, tuple[str, int] | None]]) -> dict[Any, list[tuple[int, Any]]]:
        """The calls by the client of the node serving their slot (or the one an ASK named)."""
        if not self.cluster:
            return {self.client: todo}
        out: dict[Any, list[tuple[int, Any]]] = defaultdict(list)
        nodes = self.client.nodes_manager
        for i, ask in todo:
            if ask is not None:
                node = nodes.get_node(host=ask[0], port=ask[1])
                if node is None:
                    from redis.cluster import ClusterNode

                    node = ClusterNode(ask[0], ask[1])
                    nodes.nodes_cache[node.name] = node
            else:
                node = nodes.get_node_from_slot(self.client.keyslot(calls[i][0][1]))
            out[self.client.get_redis_connection(node)].append((i, ask))
        return out

    def _run_all(self, sha: str, work: list[tuple[Any, list[tuple[list[Any], bool]]]]) -> list[tuple[list[Any], int]]:
        """`_run` on each node at once: a batch waits for its slowest node, not their sum."""
        if len(work) == 1:
            return [self._run(work[0][0], sha, work[0][1])]
        if self._nodes_pool is None:
            self._nodes_pool = ThreadPoolExecutor(max_workers=NODE_THREADS, thread_name_prefix="outbox-redis-node")
        return list(self._nodes_pool.map(lambda w: self._run(w[0], sha, w[1]), work))

    def _run(self, node: Any, sha: str, argvs: list[tuple[list[Any], bool]]) -> tuple[list[Any], int]:
        """One pipeline: the calls (after ASKING when asked), then WAIT; (replies, replicas acked)."""
        pipe = node.pipeline(transaction=False)
        at = []  # where each call's reply is, past ASKING's
        for argv, asking in argvs:
            if asking:
                pipe.execute_command("ASKING")
            at.append(len(pipe))
            pipe.evalsha(sha, *argv)
        if self.wait_replicas:
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        got = pipe.execute(raise_on_error=False)
        acked = got[-1] if self.wait_replicas else 0
        return [got[i] for i in at], acked if isinstance(acked, int) else 0

    def _results(self, batch: list[ClaimedMessage], reply: Any) -> list[DeliveryResult]:
        if isinstance(reply, Exception):
            text = reply_error_text(reply)
            self._note_error(text)
            return all_failed(batch, classify_reply_error(text), f"redis: {text}")
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        lines = text.split("\n")
        if len(lines) == len(batch) + 1 and lines[-1].startswith("^"):
            self._counts[TRIMMED_UNACKNOWLEDGED] += int(lines.pop()[1:])
        if len(lines) != len(batch):  # cannot happen with this script; never guess which is which
            return all_failed(batch, ErrorClass.TRANSIENT,
                               f"redis: script replied {len(lines)} results for {len(batch)} messages")
        out = []
        delivered = DeliveryResult.delivered
        for m, value in zip(batch, lines):
            if value == "~":
                out.append(DeliveryResult(m.seq, error_class=ErrorClass.NOT_ATTEMPTED, error=KEY_STOPPED))
            elif value == "#":
                self._counts[STREAM_FULL] += 1
                out.append(DeliveryResult(m.seq, error_class=ErrorClass.THROTTLED, error=STREAM_AT_BOUND))
            elif value.startswith("!"):
                text = value[1:]
                self._note_error(text)
                out.append(DeliveryResult(m.seq, error_class=classify_reply_error(text), error=f"redis: {text}"))
            else:
                out.append(delivered(m.seq, value.lstrip("=")))
        return out

    def _note_error(self, text: str) -> None:
        if text.lstrip().upper().startswith("OOM"):
            self.oom_at = self.clock()


def _is_cluster(client: Any) -> bool:
    from redis.cluster import RedisCluster

    from .client import ClusterOnFirstUse

    return isinstance(client, (RedisCluster, ClusterOnFirstUse))


def classify_reply_error(text: str) -> ErrorClass:
    upper = text.lstrip().upper()
    if upper.startswith(_PERMANENT_PREFIXES):
        return ErrorClass.PERMANENT
    if upper.startswith(_UNAVAILABLE_PREFIXES):
        return ErrorClass.DOWNSTREAM_UNAVAILABLE
    return ErrorClass.TRANSIENT


def reply_error_text(exc: Exception) -> str:
    """The error reply as Redis sent it, with the code redis-py strips put back first."""
    text = str(exc)
    code = getattr(exc, "status_code", None)
    if not code:
        code = next((c for c, cls in _CODE_OF_CLASS if isinstance(exc, cls)), None)
    if code and not text.upper().startswith(code):
        return f"{code} {text}"
    return text
