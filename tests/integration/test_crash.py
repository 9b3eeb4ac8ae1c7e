"""Crash: a claimer killed after publishing and before recording."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from outbox_relay.relay import run_batch

CLAIMER = Path(__file__).with_name("claimer.py")


def test_killed_after_publish_is_reclaimed_and_not_duplicated(enqueue, database_url, servers, store, publisher,
                                                              policy, plenty, rows, redis_client, redis_prefix):
    # Given a claimer that published its batch to Redis and was killed before recording it
    ids = enqueue(20, stream="crash")
    proc = subprocess.Popen([sys.executable, str(CLAIMER), database_url, servers.redis_url, "--batch", "20",
                             "--lease", "2", "--die-after-publish"], stdout=subprocess.PIPE, text=True)
    claimed = json.loads(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "published"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert len(claimed["seqs"]) == 20
    assert redis_client.xlen(redis_prefix + "crash") == 20
    first_entries = {f["id"]: e for e, f in redis_client.xrange(redis_prefix + "crash")}
    assert {r["status"] for r in rows()} == {"leased"}

    # When the relay runs while the dead claimer's lease still holds, nothing is taken
    assert run_batch(store, publisher, policy, plenty, "survivor-early").claimed == 0

    # And once the lease has expired (by the database clock) the messages are reclaimed
    deadline = time.monotonic() + 10
    while min(r["lease_left"] for r in rows()) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    summary = run_batch(store, publisher, policy, plenty, "survivor")
    assert (summary.claimed, summary.delivered, summary.lease_lost) == (20, 20, 0)

    # Then each is recorded delivered with its first entry id, and the stream still holds one entry each
    after = rows()
    assert {r["status"] for r in after} == {"delivered"}
    assert {r["attempts"] for r in after} == {2}
    assert {str(r["message_id"]): r["delivery_ref"] for r in after} == first_entries
    assert redis_client.xlen(redis_prefix + "crash") == 20
    assert sorted(first_entries) == sorted(str(i) for i in ids)
