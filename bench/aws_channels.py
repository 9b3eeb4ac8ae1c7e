"""SQS, SNS, EventBridge and Kinesis channels: drain throughput and round trips per batch,
through moto in server mode.

moto runs in a process of its own (`serve`, the hidden `python -m bench
aws-server`): a `moto.server.ThreadedMotoServer` on a loopback port, which the
relay reaches over HTTP through ``AWS_ENDPOINT_URL_SQS`` / ``_SNS`` /
``_EVENTBRIDGE`` / ``_KINESIS``, as it would reach AWS. The server records, per batch call it
accepted, the entries and their bytes as AWS counts them against its 256 KiB
(body and attributes; detail, detail-type, source and 14 bytes of time; a
record's data and partition key), and each message id with its ``MessageGroupId``
(a record's partition key) in acceptance order. moto refuses more entries a call
than the service takes itself; the bytes are the publisher's to keep, and the
bench checks that no call went over either (the channel's spec's limits).

One change makes moto no rougher than AWS where it would decide the figure: moto
computes every attribute of a queue, counting its messages (three passes over
them), for each message sent, so a send costs in proportion to the queue's
length; the bench's server skips those counts while it sends (the queue's own
attributes are unchanged). moto answers faster than AWS otherwise (no network,
no replication), so the figures are relative: to the same channel's minimal
loop on the same server, in the same run.

Per channel and variant (standard, keyless; FIFO, each message with one of
1,000 ordering keys as its ``MessageGroupId``; keyed, a Kinesis stream's records
over 1,000 ordering keys as partition keys), each on a destination of its own:

- *the channel's minimal loop*: pg8000's native API claims up to `batch_size`
  due rows in one statement (as `limit`), the same request entries the relay
  would send go out in calls as full as the service takes (10; Kinesis 500), at most 4 at once (the relay's default
  concurrency), with no per-key rounds, one ``UPDATE`` marks them delivered;
- *the relay*: the real handler (`handler.relay`) with ``OUTBOX_CHANNEL`` set,
  in drain mode, one invocation over the backlog. Every HTTP call its client
  sends is counted (a botocore ``before-send`` hook), by operation, and so are
  its database statements; per batch = count / batches. The outcome writes
  (`LeaseStore.record`, one statement each, one per round of calls) are timed: how many per batch, the
  median, and their sum as a share of the drain's wall time (they run on the
  invocation's thread, between the calls it starts).

Each over a freshly enqueued backlog, alternately first, in `rounds` rounds; the
medians are compared. CPU per message of the relay's process, the loop's and moto's
is kept beside, less moved by the host's load than the wall clock.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

from . import lambda_model
from .env import BenchEnv, process_cpu_seconds

REGION = "us-east-1"
CONCURRENCY = 4
FIFO_KEYS = 1_000
#: Variants whose messages carry one of FIFO_KEYS ordering keys.
KEYED = ("fifo", "keyed")
#: Shards of a Kinesis run's stream.
SHARDS = 4

#: Per channel: the service's name in messages, the operation of its batch calls,
#: the endpoint variable, and the variants run.
CHANNELS: dict[str, dict[str, Any]] = {
    "sqs": {"service": "SQS", "operation": "SendMessageBatch", "endpoint": "AWS_ENDPOINT_URL_SQS",
            "variants": ("standard", "fifo")},
    "sns": {"service": "SNS", "operation": "PublishBatch", "endpoint": "AWS_ENDPOINT_URL_SNS",
            "variants": ("standard", "fifo")},
    "eventbridge": {"service": "EventBridge", "operation": "PutEvents", "endpoint": "AWS_ENDPOINT_URL_EVENTBRIDGE",
                    "variants": ("standard",)},
    "kinesis": {"service": "Kinesis", "operation": "PutRecords", "endpoint": "AWS_ENDPOINT_URL_KINESIS",
                "variants": ("standard", "keyed")},
}


def _limits(channel: str) -> tuple[int, int]:
    """(entries, bytes) one call of the channel carries, as its spec gives them."""
    from outbox_relay.publishers.registry import spec_for

    limits = spec_for(channel).limits
    return int(limits.entries_per_call or 0), int(limits.bytes_per_call or 0)


# --- the server's side: moto in its own process ------------------------------------------------

_record_lock = threading.Lock()
_record: dict[str, Any] = {}
_sending = threading.local()


def _clear() -> None:
    _record.clear()
    _record.update(calls=0, entries=0, max_entries=0, max_bytes=0, accepted=[])


def _attribute(attributes: Any, name: str) -> str | None:
    """A string attribute's value, as moto parsed it (SQS or SNS)."""
    value = (attributes or {}).get(name)
    if not isinstance(value, dict):
        return None
    for field in ("StringValue", "string_value", "Value"):
        if value.get(field) is not None:
            return str(value[field])
    return None


def _attributes_bytes(attributes: Any) -> int:
    total = 0
    for name, value in (attributes or {}).items():
        data_type = value.get("DataType") or value.get("data_type") or value.get("Type") or ""
        total += len(name.encode()) + len(str(data_type).encode()) + len((_attribute(attributes, name) or "").encode())
    return total


def _note(entries: list[tuple[str | None, str | None, int]]) -> None:
    """One accepted batch call: per entry (message id, group, bytes)."""
    with _record_lock:
        size = sum(b for _, _, b in entries)
        _record["calls"] += 1
        _record["entries"] += len(entries)
        _record["max_entries"] = max(_record["max_entries"], len(entries))
        _record["max_bytes"] = max(_record["max_bytes"], size)
        _record["accepted"].extend([i, g] for i, g, _ in entries)


def _install() -> None:
    """Record the batch calls moto accepts, and send to a queue without counting its messages."""
    from moto.events.models import EventsBackend
    from moto.sns.models import SNSBackend
    from moto.sqs.models import Queue, SQSBackend

    from outbox_relay.publishers.aws_message import ID_ATTRIBUTE

    for name in ("approximate_number_of_messages", "approximate_number_of_messages_delayed",
                 "approximate_number_of_messages_not_visible"):
        counted = getattr(Queue, name)

        def skipped(self: Any, _counted: Any = counted) -> int:
            return 0 if getattr(_sending, "active", False) else _counted.fget(self)

        setattr(Queue, name, property(skipped))

    send_batch = SQSBackend.send_message_batch

    def send_message_batch(self: Any, queue_name: str, entries: dict[str, dict[str, Any]]) -> Any:
        _sending.active = True
        try:
            messages, failed = send_batch(self, queue_name, entries)
        finally:
            _sending.active = False
        ok = {m.user_id for m in messages}
        _note([(_attribute(e.get("MessageAttributes"), ID_ATTRIBUTE), e.get("MessageGroupId"),
                len(e["MessageBody"].encode()) + _attributes_bytes(e.get("MessageAttributes")))
               for e in entries.values() if e.get("Id") in ok])
        return messages, failed

    SQSBackend.send_message_batch = send_message_batch

    publish_batch = SNSBackend.publish_batch

    def sns_publish_batch(self: Any, topic_arn: str, publish_batch_request_entries: list[dict[str, Any]]) -> Any:
        successful, failed = publish_batch(self, topic_arn, publish_batch_request_entries)
        ok = {s["Id"] for s in successful}
        _note([(_attribute(e.get("MessageAttributes"), ID_ATTRIBUTE), e.get("MessageGroupId"),
                len(e["Message"].encode()) + _attributes_bytes(e.get("MessageAttributes")))
               for e in publish_batch_request_entries if e["Id"] in ok])
        return successful, failed

    SNSBackend.publish_batch = sns_publish_batch

    put_events = EventsBackend.put_events

    def events_put_events(self: Any, events: list[dict[str, Any]]) -> Any:
        answers = put_events(self, events)
        accepted = []
        for event, answer in zip(events, answers):
            if answer.get("EventId"):
                detail = event.get("Detail") or ""
                accepted.append((json.loads(detail).get(ID_ATTRIBUTE), None,
                                 len(detail.encode()) + len(event.get("DetailType", "").encode())
                                 + len(event.get("Source", "").encode()) + 14))
        _note(accepted)
        return answers

    EventsBackend.put_events = events_put_events

    from moto.kinesis.models import KinesisBackend

    put_records = KinesisBackend.put_records

    def kinesis_put_records(self: Any, stream_arn: str, stream_name: str, records: list[dict[str, Any]]) -> Any:
        reply = put_records(self, stream_arn, stream_name, records)
        _note([(json.loads(r["Data"])["id"], r["PartitionKey"], len(r["Data"]) + len(r["PartitionKey"].encode()))
               for r, answer in zip(records, reply["Records"]) if answer.get("SequenceNumber")])
        return reply

    KinesisBackend.put_records = kinesis_put_records


def serve() -> None:
    """(the server's process) moto on a free loopback port: print the port, then answer
    ``take`` on stdin with what was recorded since the last one (one JSON line); stop at EOF."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    _clear()
    _install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(server.get_host_and_port()[1], flush=True)
    for line in sys.stdin:
        if line.strip() == "take":
            with _record_lock:
                out = json.dumps(_record)
                _clear()
            print(out, flush=True)
    server.stop()


# --- the bench's side ---------------------------------------------------------------------------

class MotoServer:
    """The moto server's process: its URL, what it recorded (`take`), its CPU seconds."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen([sys.executable, "-m", "bench", "aws-server"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"the moto server did not start (it printed {line!r})")
        self.url = f"http://127.0.0.1:{int(line)}"

    def take(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("take\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def cpu_seconds(self) -> float | None:
        return process_cpu_seconds(self.proc.pid)

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_server: MotoServer | None = None


def moto_server() -> MotoServer:
    """The moto server of this bench process, started by the first section that needs it
    (the three sections of `all` share it; each run uses a destination of its own) and
    stopped when the process exits."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = MotoServer()
        atexit.register(_server.close)
    return _server


def aws_environment(channel: str, url: str) -> dict[str, str | None]:
    """The relay's AWS variables: the channel's endpoint at the server, test credentials, a region."""
    values: dict[str, str | None] = {k: None for k in os.environ if k.startswith("AWS_ENDPOINT_URL")
                                     or k in ("AWS_PROFILE", "AWS_SESSION_TOKEN")}
    values.update({CHANNELS[channel]["endpoint"]: url, "AWS_ACCESS_KEY_ID": "testing",
                   "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION})
    return values


@functools.lru_cache(maxsize=None)
def _client(channel: str, url: str) -> Any:
    """A client of the channel's service on the server, configured as the relay's
    (`aws_client.create_client`: SDK retries off, a pool for the concurrency)."""
    from outbox_relay.publishers.aws_client import create_client
    from outbox_tools.lambda_local import environment

    service = {"sqs": "sqs", "sns": "sns", "eventbridge": "events", "kinesis": "kinesis"}[channel]
    with environment(**{"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": None,
                        "AWS_PROFILE": None, "AWS_ENDPOINT_URL": None, CHANNELS[channel]["endpoint"]: url}):
        return create_client(service, CHANNELS[channel]["service"], max_concurrency=CONCURRENCY, region_name=REGION)


def _destination(channel: str, client: Any, variant: str) -> dict[str, str]:
    """A new queue, topic, bus or stream for one run: the relay's setting that names it."""
    name = f"outbox-bench-{uuid.uuid4().hex[:10]}"
    fifo = variant == "fifo"
    if channel == "sqs":
        attributes = {"FifoQueue": "true"} if fifo else {}
        url = client.create_queue(QueueName=name + (".fifo" if fifo else ""), Attributes=attributes)["QueueUrl"]
        return {"OUTBOX_SQS_QUEUE_URL": url}
    if channel == "sns":
        attributes = {"FifoTopic": "true"} if fifo else {}
        arn = client.create_topic(Name=name + (".fifo" if fifo else ""), Attributes=attributes)["TopicArn"]
        return {"OUTBOX_SNS_TOPIC_ARN": arn}
    if channel == "kinesis":
        client.create_stream(StreamName=name, ShardCount=SHARDS)
        return {"OUTBOX_KINESIS_STREAM": name}
    client.create_event_bus(Name=name)
    return {"OUTBOX_EVENTBRIDGE_BUS": name}


def enqueue(env: BenchEnv, channel: str, n: int, *, keys: int | None, chunk: int = 1000, seed: int = 6) -> float:
    """`n` ~1 KB `order.placed` messages for `channel`, keyless or over `keys` ordering
    keys: each row validated as the channel's producer function validates it (its spec's
    `message_row`, behind `enqueue_sqs`, `enqueue_sns`, `enqueue_eventbridge`), written `chunk` at a time
    by the statement `enqueue_events_bulk` writes with. Returns the seconds it took."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from outbox_relay.producer import _insert_chunk
    from outbox_relay.publishers.registry import spec_for

    from . import payloads

    started = time.perf_counter()
    engine = create_engine(env.database_url, poolclass=NullPool)
    rows = [spec_for(channel).message_row({"type": e["type"], "payload": e["payload"]}
                    | ({} if e["key"] is None else {"key": e["key"]}))
            for e in payloads.events(n, seed=seed, keys=keys)]
    try:
        for start in range(0, n, chunk):
            with engine.begin() as conn:
                _insert_chunk(conn, start, rows[start:start + chunk])
    finally:
        engine.dispose()
    return time.perf_counter() - started


def _prepare(env: BenchEnv, channel: str, n: int, keys: int | None) -> None:
    from .drain import checkpoint

    env.reset_table()
    enqueue(env, channel, n, keys=keys)
    env.vacuum_analyze()
    checkpoint(env)


# --- the channel's minimal loop -------------------------------------------------------------------

CLAIM = """
    WITH picked AS (
        SELECT seq FROM outbox_message
         WHERE status = 'pending' AND channel = :channel AND available_at <= now()
         ORDER BY available_at, seq
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
    )
    UPDATE outbox_message o
       SET status = 'leased', attempts = o.attempts + 1, lease_owner = :owner,
           lease_expires_at = now() + interval '2 minutes'
     WHERE o.seq = ANY (ARRAY(SELECT seq FROM picked))
    RETURNING o.seq, o.message_id::text, o.type, o.key,
              (SELECT b.payload::text FROM outbox_message_body b WHERE b.seq = o.seq)
"""


def _requests(channel: str, rows: list[Any], setting: dict[str, str], fifo: bool) -> list[dict[str, Any]]:
    """The request entries the relay sends for these rows, built inline."""
    from outbox_relay.publishers.aws_message import ID_ATTRIBUTE, KEY_ATTRIBUTE, TYPE_ATTRIBUTE
    from outbox_relay.publishers.kinesis.records import partition_key, record_data

    out = []
    for i, (_, message_id, type_, key, payload) in enumerate(rows):
        if channel == "kinesis":
            out.append({"Data": record_data(message_id, type_, key, None, payload).encode(),
                        "PartitionKey": partition_key(key, message_id)})
            continue
        if channel == "eventbridge":
            detail = f'{{"{ID_ATTRIBUTE}":"{message_id}",' + payload.strip()[1:]
            out.append({"Source": "outbox.relay", "DetailType": type_, "Detail": detail,
                        "EventBusName": setting["OUTBOX_EVENTBRIDGE_BUS"]})
            continue
        attributes = {ID_ATTRIBUTE: {"DataType": "String", "StringValue": message_id},
                      TYPE_ATTRIBUTE: {"DataType": "String", "StringValue": type_}}
        if key is not None:
            attributes[KEY_ATTRIBUTE] = {"DataType": "String", "StringValue": key}
        entry = {"Id": str(i), "MessageBody" if channel == "sqs" else "Message": payload,
                 "MessageAttributes": attributes}
        if fifo:
            entry["MessageGroupId"] = key if key is not None else message_id
            entry["MessageDeduplicationId"] = message_id
        out.append(entry)
    return out


def _send(channel: str, client: Any, setting: dict[str, str], entries: list[dict[str, Any]]) -> None:
    if channel == "sqs":
        reply = client.send_message_batch(QueueUrl=setting["OUTBOX_SQS_QUEUE_URL"], Entries=entries)
        failed = reply.get("Failed")
    elif channel == "sns":
        reply = client.publish_batch(TopicArn=setting["OUTBOX_SNS_TOPIC_ARN"], PublishBatchRequestEntries=entries)
        failed = reply.get("Failed")
    elif channel == "kinesis":
        failed = client.put_records(StreamName=setting["OUTBOX_KINESIS_STREAM"], Records=entries
                                    ).get("FailedRecordCount")
    else:
        failed = client.put_events(Entries=entries).get("FailedEntryCount")
    if failed:
        raise RuntimeError(f"{channel}: the minimal loop's call failed: {failed}")


def drain_minimal(env: BenchEnv, channel: str, client: Any, setting: dict[str, str], *, batch_size: int,
                  fifo: bool) -> tuple[int, int]:
    """The channel's minimal loop until a claim returns nothing; (messages delivered, batches)."""
    from .limit import DONE, _connect

    con = _connect(env.database_url)
    owner = f"limit:{uuid.uuid4().hex[:8]}"
    per_call = _limits(channel)[0]
    delivered = batches = 0
    try:
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            while True:
                rows = con.run(CLAIM, channel=channel, limit=batch_size, owner=owner)
                if not rows:
                    return delivered, batches
                requests = _requests(channel, rows, setting, fifo)
                calls = [requests[i:i + per_call] for i in range(0, len(requests), per_call)]
                list(pool.map(lambda entries: _send(channel, client, setting, entries), calls))
                con.run(DONE, seqs=[r[0] for r in rows])
                delivered += len(rows)
                batches += 1
    finally:
        con.close()


# --- one run: the minimal loop, then the relay ----------------------------------------------------

class CallCounter:
    """HTTP calls a boto3 client sends (botocore ``before-send``), by operation."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.by_operation: dict[str, int] = {}
        self._lock = threading.Lock()
        client.meta.events.register("before-send", self._on_send)

    def _on_send(self, event_name: str = "", **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self.by_operation[operation] = self.by_operation.get(operation, 0) + 1

    def take(self) -> dict[str, int]:
        with self._lock:
            out, self.by_operation = self.by_operation, {}
        return out

    def remove(self) -> None:
        self.client.meta.events.unregister("before-send", self._on_send)


@contextlib.contextmanager
def _timed_outcome_writes() -> Iterator[list[float]]:
    """The seconds of each outcome write (`LeaseStore.record`) made inside the block."""
    from outbox_relay.store import LeaseStore

    original = LeaseStore.record
    seconds: list[float] = []

    def record(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - started)

    LeaseStore.record = record  # type: ignore[method-assign]
    try:
        yield seconds
    finally:
        LeaseStore.record = original  # type: ignore[method-assign]


def _order_violations(env: BenchEnv, accepted: list[list[Any]]) -> tuple[int, int]:
    """(messages accepted out of their key's seq order, distinct message ids) from the
    server's record; keys from the table."""
    from sqlalchemy import text

    with env.engine.connect() as conn:
        rows = {mid: (seq, key) for mid, seq, key in conn.execute(text(
            "SELECT message_id::text, seq, key FROM outbox_message"))}
    last: dict[str, int] = {}
    violations = 0
    for message_id, _ in accepted:
        seq, key = rows.get(message_id, (None, None))
        if key is None or seq is None:
            continue
        if seq < last.get(key, -1):
            violations += 1
        last[key] = max(seq, last.get(key, -1))
    return violations, len({m for m, _ in accepted})


def _minimal_run(env: BenchEnv, server: MotoServer, channel: str, variant: str, *, n: int,
                 batch_size: int) -> dict[str, Any]:
    """The channel's minimal loop over a fresh backlog, on a destination of its own."""
    fifo = variant == "fifo"
    client = _client(channel, server.url)
    setting = _destination(channel, client, variant)
    _prepare(env, channel, n, FIFO_KEYS if variant in KEYED else None)
    server.take()
    with lambda_model.holding():
        cpu0, client0, started = server.cpu_seconds(), time.process_time(), time.perf_counter()
        delivered, batches = drain_minimal(env, channel, client, setting, batch_size=batch_size, fifo=fifo)
        wall = time.perf_counter() - started
    client_cpu, cpu1 = time.process_time() - client0, server.cpu_seconds()
    record = server.take()
    violations, ids = _order_violations(env, record["accepted"])
    counts = env.counts()
    env.reset_table()
    return {
        "delivered": delivered, "wall_seconds": round(wall, 3),
        "messages_per_second": round(delivered / wall, 1) if wall else None, "batches": batches,
        "calls": record["calls"],
        "entries_per_call": round(record["entries"] / record["calls"], 2) if record["calls"] else None,
        "cpu_us_per_message": {"client": _us(client_cpu, 0.0, delivered), "moto": _us(cpu1, cpu0, delivered)},
        "check": {"accepted": record["entries"], "distinct_ids": ids, "rows_delivered": counts.get("delivered", 0),
                  "out_of_order": violations,
                  "ok": delivered == n == record["entries"] == ids == counts.get("delivered", 0)},
    }


def _relay_run(env: BenchEnv, server: MotoServer, channel: str, variant: str, *, n: int,
               batch_size: int) -> dict[str, Any]:
    """One drain-mode invocation of the real handler over a fresh backlog, on a destination of its own."""
    from .drain import DRAIN_ENV, warm
    from .handler import relay

    operation = CHANNELS[channel]["operation"]
    setting = _destination(channel, _client(channel, server.url), variant)
    extra = aws_environment(channel, server.url) | DRAIN_ENV | setting
    with relay(env, batch_size, channel=channel, timeout_seconds=600, extra_env=extra) as r:
        _prepare(env, channel, n, FIFO_KEYS if variant in KEYED else None)
        warm(r)
        counter = CallCounter(r.deps.publisher.client)
        server.take()
        with lambda_model.holding(), _timed_outcome_writes() as writes:
            cpu0, client0, started = server.cpu_seconds(), time.process_time(), time.perf_counter()
            result = r.invoke()
            wall = time.perf_counter() - started
        client_cpu, cpu1 = time.process_time() - client0, server.cpu_seconds()
        statements = r.statements.take()
        calls = counter.take()
        counter.remove()
        record = server.take()
    violations, ids = _order_violations(env, record["accepted"])
    counts = env.counts()
    env.reset_table()
    batches = max(1, result["batches"])
    delivered = result["delivered"]
    return {
        "delivered": delivered, "wall_seconds": round(wall, 3),
        "messages_per_second": round(delivered / wall, 1) if wall else None,
        "batches": result["batches"], "statements_per_batch": round(statements / batches, 2),
        "calls_per_batch": round(sum(calls.values()) / batches, 2), "calls_by_operation": calls,
        "batch_calls_per_batch": round(calls.get(operation, 0) / batches, 2),
        "entries_per_call": round(record["entries"] / record["calls"], 2) if record["calls"] else None,
        "max_entries_per_call": record["max_entries"], "max_bytes_per_call": record["max_bytes"],
        "outcome_writes": {"per_batch": round(len(writes) / batches, 2),
                           "median_ms": round(statistics.median(writes) * 1000, 2) if writes else None,
                           "share_of_wall": round(sum(writes) / wall, 3) if wall else None},
        "cpu_us_per_message": {"client": _us(client_cpu, 0.0, delivered), "moto": _us(cpu1, cpu0, delivered)},
        "check": {"accepted": record["entries"], "distinct_ids": ids, "rows_delivered": counts.get("delivered", 0),
                  "server_calls": record["calls"], "client_batch_calls": calls.get(operation, 0),
                  "out_of_order": violations,
                  "ok": (delivered == n == record["entries"] == ids == counts.get("delivered", 0)
                         and record["calls"] == calls.get(operation, 0) and violations == 0
                         and record["max_entries"] <= _limits(channel)[0]
                         and record["max_bytes"] <= _limits(channel)[1])},
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median msg/s (the lower middle of an even count)."""
    ordered = sorted(runs, key=lambda r: r["messages_per_second"] or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def _variant(env: BenchEnv, server: MotoServer, channel: str, variant: str, *, n: int, batch_size: int,
             rounds: int) -> dict[str, Any]:
    """`rounds` interleaved rounds of the minimal loop and the relay (minimal first in
    the odd rounds, the relay first in the even ones); medians compared."""
    minimal: list[dict[str, Any]] = []
    relayed: list[dict[str, Any]] = []
    for i in range(rounds):
        order = ("minimal", "relay") if i % 2 == 0 else ("relay", "minimal")
        for which in order:
            if which == "minimal":
                minimal.append(_minimal_run(env, server, channel, variant, n=n, batch_size=batch_size))
            else:
                relayed.append(_relay_run(env, server, channel, variant, n=n, batch_size=batch_size))
    m, r = _median(minimal), _median(relayed)
    ratio = (r["messages_per_second"] / m["messages_per_second"]
             if r["messages_per_second"] and m["messages_per_second"] else None)
    return {"variant": variant, "keys": FIFO_KEYS if variant in KEYED else None, "minimal": m, "relay": r,
            "vs_minimal": None if ratio is None else round(ratio, 3),
            "rounds": [{"minimal_messages_per_second": a["messages_per_second"],
                        "relay_messages_per_second": b["messages_per_second"]} for a, b in zip(minimal, relayed)],
            "check": {"ok": all(x["check"]["ok"] for x in minimal + relayed)}}


def _us(end: float | None, start: float | None, n: int) -> float | None:
    if end is None or start is None or not n:
        return None
    return round((end - start) / n * 1e6, 1)


def run_aws_channel(env: BenchEnv, channel: str, *, n: int, batch_size: int = 1000,
                    rounds: int = 5) -> dict[str, Any]:
    """The section of `channel` (sqs, sns, eventbridge, kinesis): each variant's minimal loop and relay."""
    spec = CHANNELS[channel]
    server = moto_server()
    runs = [_variant(env, server, channel, variant, n=n, batch_size=batch_size, rounds=rounds)
            for variant in spec["variants"]]
    return {"channel": channel, "service": spec["service"], "operation": spec["operation"], "messages": n,
            "batch_size": batch_size, "rounds": rounds, "concurrency": CONCURRENCY, "fifo_keys": FIFO_KEYS,
            "entries_per_call": _limits(channel)[0], "bytes_per_call": _limits(channel)[1],
            "level": "real handler (functions/relay/app.py), drain mode, one invocation; moto server in its own "
                     "process", "runs": runs}
