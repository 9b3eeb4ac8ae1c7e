"""Pollers killed -9 while a channel scales (issue 34's chaos): during a scale-up, as
the added pollers are about to be shed, and at a handover, while an application
commits to the same keys all along. Real handler processes on the real PostgreSQL
and Redis; each self-invoke starts another process, as Lambda would."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from outbox_relay.producer import enqueue_events_bulk
from support.deadline import wait_for

pytestmark = pytest.mark.slow  # poller processes scaling up and down, a few minutes on a loaded machine

EVENT = {"source": "outbox.scheduler", "channel": "redis"}
KEYS = 40
BATCH = 5

# A poller process: its self-invoke (a successor or an added poller) starts another such
# process, unless the test wrote the stop file; it writes its event (pid.event) before
# it polls and its summary (pid.json) when it ends.
_POLLER = """
import json, os, subprocess, sys
from outbox_relay import runtime
from outbox_tools.lambda_local import LocalContext, load_handler
event, timeout, folder = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]

def starter(name, region):
    def start(event):
        if os.path.exists(os.path.join(folder, "stop")):
            raise RuntimeError("the test is over")
        subprocess.Popen([sys.executable, "-c", "SCRIPT = " + repr(SCRIPT) + "\\n" + SCRIPT, json.dumps(event),
                          timeout, folder],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return start

runtime.lambda_starter = starter
with open(os.path.join(folder, f"{os.getpid()}.event"), "w") as f:
    f.write(json.dumps(event))
summary = load_handler("relay")(event, LocalContext(float(timeout)))
with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
    f.write(json.dumps(summary))
"""
_POLLER = "SCRIPT = " + repr(_POLLER) + "\n" + _POLLER


def _started(folder: Path) -> dict[int, dict]:
    """Every poller process started so far: pid -> the event it was invoked with."""
    out = {}
    for p in folder.glob("*.event"):
        try:
            out[int(p.stem)] = json.loads(p.read_text())
        except ValueError:  # being written
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _parent(pid: int) -> int:
    """The process that started `pid` (a successor's predecessor; 1 once it died)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 1


def _live(app_engine, *, added: bool = False) -> int:
    """Live registrations (`added`: of the slots above the one kept)."""
    with app_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM outbox_poller WHERE left_at IS NULL AND expires_at > now() "
                                 "AND slot >= :lowest"), {"lowest": 1 if added else 0}).scalar_one()


def test_pollers_killed_during_a_scale_up_a_scale_down_and_a_handover_lose_nothing_and_keep_each_keys_order(
        database_url, servers, app_engine, redis_client, redis_prefix, tmp_path):
    # Given one poller kept and up to three while the oldest due message is over a second
    # old, small batches, pollers of 30 s handing over 10 s before their end, and a
    # backlog over 40 keys committed 30 s ago, its last part one hot key's (one poller at a
    # time takes its turns, so the backlog stays old while added pollers find little to do)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")} | {
        "DATABASE_URL": database_url, "REDIS_URL": servers.redis_url, "OUTBOX_CHANNEL": "redis",
        "OUTBOX_MODE": "latency", "OUTBOX_POLLERS_MAX": "3", "OUTBOX_POLLERS_ADD_AGE_SECONDS": "1",
        # A registration lives 2 s: a loaded machine may starve a heartbeat for a second
        "OUTBOX_DEADLINE_MARGIN_SECONDS": "1", "OUTBOX_POLLER_TTL_SECONDS": "2", "OUTBOX_BATCH_SIZE": str(BATCH),
        "OUTBOX_SUCCESSOR_LEAD_SECONDS": "10", "AWS_LAMBDA_FUNCTION_NAME": "stack-relay-redis",
        "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_NAMESPACE": "OutboxRelayTest"}
    stream = redis_prefix + "chaos"
    place: dict[str, tuple[str, int]] = {}  # message id -> (key, its place among the key's)
    counts: collections.Counter = collections.Counter()

    def commit(n: int, key: str | None = None) -> None:
        rows = [dict(stream=stream, type="t", payload={"n": 1}, key=key or f"key{(len(place) + i) % KEYS}")
                for i in range(n)]
        with app_engine.begin() as conn:
            ids = enqueue_events_bulk(conn, rows)
        for i, row in zip(ids, rows):
            place[str(i)] = (row["key"], counts[row["key"]])
            counts[row["key"]] += 1

    commit(5000)
    commit(1500, key="hot")
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET available_at = available_at - interval '30 s', "
                          "created_at = created_at - interval '30 s'"))

    # and an application committing to the same keys all along
    stop_committing = threading.Event()

    def application() -> None:
        while not stop_committing.wait(0.1):
            commit(5)

    committer = threading.Thread(target=application, daemon=True)
    killed: dict[str, int] = {}

    def kill(what: str, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        killed[what] = pid

    def hot_tail() -> bool:
        """Of the backlog, only the hot key's messages are left."""
        with app_engine.connect() as conn:
            left = dict(conn.execute(text(
                "SELECT key = 'hot', count(*) FROM outbox_message WHERE status <> 'delivered' "
                "AND created_at < now() - interval '20 s' GROUP BY 1")).all())
        return not left.get(False) and bool(left.get(True))

    first = subprocess.Popen([sys.executable, "-c", _POLLER, json.dumps(EVENT), "30", str(tmp_path)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        committer.start()
        # When an added poller is killed -9 once it polls, while the first still adds
        # (the backlog is old)
        def added_polling() -> list[int]:
            return [p for p, e in _started(tmp_path).items() if e.get("reason") == "backlog" and _alive(p)]

        def registered() -> bool:  # every added process alive has registered
            added = added_polling()
            return bool(added) and _live(app_engine, added=True) >= len(added)

        wait_for(registered, what="a poller added", seconds=180)
        kill("scale-up", added_polling()[0])

        # and another added one as the backlog runs out (the hot key's tail): it is shed
        # once the backlog is no longer old
        wait_for(lambda: hot_tail() and registered(), what="the backlog's hot tail with an added poller polling",
                 seconds=300)
        kill("scale-down", added_polling()[0])

        # and a poller at its handover (the one that started a successor since), its
        # successor started and not yet polling
        before = set(_started(tmp_path))

        def handing_over() -> list[int]:
            started = _started(tmp_path)
            # Only a poller process of this test's (a successor whose predecessor died has another parent)
            ours = set(started) | {first.pid}
            return [_parent(p) for p, e in started.items() if p not in before and e.get("reason") == "deadline"
                    and _parent(p) in ours and _alive(_parent(p))]

        wait_for(handing_over, what="a poller's successor started", seconds=180)
        kill("handover", handing_over()[0])

        # Then, the application stopped, every message reaches the stream
        time.sleep(2)
        stop_committing.set()
        committer.join(30)
        wait_for(lambda: len({f["id"] for _, f in redis_client.xrange(stream)}) >= len(place),
                 what="every message in the stream", seconds=300)
    finally:
        stop_committing.set()
        (tmp_path / "stop").write_text("")
        try:
            wait_for(lambda: _live(app_engine) == 0, what="every poller ended", seconds=180)
        finally:
            for pid in _started(tmp_path):
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            if first.poll() is None:
                first.kill()
            first.wait(30)

    assert list(killed) == ["scale-up", "scale-down", "handover"]
    # The killed added pollers' registrations expired and another poller took their leases
    # over (the one killed at its handover may have left for its successor first): no
    # registration was left behind
    with app_engine.connect() as conn:
        taken_over, dangling = conn.execute(text(
            "SELECT count(*) FILTER (WHERE taken_over_at IS NOT NULL), "
            "count(*) FILTER (WHERE left_at IS NULL AND taken_over_at IS NULL) FROM outbox_poller")).one()
        slots = conn.execute(text("SELECT DISTINCT slot FROM outbox_poller")).scalars().all()
        statuses = conn.execute(text("SELECT DISTINCT status FROM outbox_message")).scalars().all()
        claimed_again = set(conn.execute(text("SELECT message_id::text FROM outbox_message WHERE attempts > 1"))
                            .scalars())
    assert taken_over >= 2 and dangling == 0 and max(slots) <= 2
    # and nothing was lost: every message delivered, each in the stream
    assert statuses == ["delivered"]
    entries = [f for _, f in redis_client.xrange(stream)]
    ids = [f["id"] for f in entries]
    assert set(ids) == set(place)
    # Duplicates only of messages claimed again after a poller died with them leased (at most a batch each)
    duplicated = {i for i, n in collections.Counter(ids).items() if n > 1}
    assert duplicated <= claimed_again and len(ids) - len(set(ids)) <= BATCH * len(killed)
    # and each key's messages in the stream in the order they were committed (a redelivered
    # duplicate counts where it first appeared)
    order: dict[str, list[int]] = collections.defaultdict(list)
    seen: set[str] = set()
    for f in entries:
        if f["id"] in seen:
            continue
        seen.add(f["id"])
        key, n = place[f["id"]]
        assert f["key"] == key
        order[key].append(n)
    assert all(p == sorted(p) for p in order.values())
