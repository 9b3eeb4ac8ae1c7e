"""Crash: a claimer killed after publishing and before recording."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

CLAIMER = Path(__file__).parents[1] / "support" / "claimer.py"

pytestmark = pytest.mark.slow


def test_killed_after_publish_is_reclaimed_and_not_duplicated(enqueue, database_url, servers, store, publisher,
                                                              policy, plenty, rows, redis_client, redis_prefix,
                                                              invoke):
    # Given a claimer that published its batch to Redis and was killed before recording it
    ids = enqueue(20, stream="crash")
    proc = subprocess.Popen([sys.executable, str(CLAIMER), database_url, servers.redis_url, "--batch", "20",
                             "--lease", "6", "--die-after-publish"], stdout=subprocess.PIPE, text=True)
    claimed = json.loads(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "published"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert len(claimed["seqs"]) == 20
    assert redis_client.xlen(redis_prefix + "crash") == 20
    first_entries = {f["id"]: e for e, f in redis_client.xrange(redis_prefix + "crash")}
    assert {r["status"] for r in rows()} == {"leased"}

    # When the relay runs while the dead claimer's lease still holds (6 s: a latency run and a
    # loaded machine's slow start fit in it), nothing is taken
    assert invoke(store, publisher, policy, "survivor-early").claimed == 0

    # And once the lease has expired (by the database clock) the messages are reclaimed
    deadline = time.monotonic() + 30
    while min(r["lease_left"] for r in rows()) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    summary = invoke(store, publisher, policy, "survivor")
    assert (summary.claimed, summary.delivered, summary.lease_lost) == (20, 20, 0)

    # Then each is recorded delivered with its first entry id, and the stream still holds one entry each
    after = rows()
    assert {r["status"] for r in after} == {"delivered"}
    assert {r["attempts"] for r in after} == {2}
    assert {str(r["message_id"]): r["delivery_ref"] for r in after} == first_entries
    assert redis_client.xlen(redis_prefix + "crash") == 20
    assert sorted(first_entries) == sorted(str(i) for i in ids)


def test_a_message_that_crashes_the_relay_dies_alone(enqueue, database_url, servers, rows, redis_client,
                                                      redis_prefix, app_engine):
    # Given a batch of 11 in which one payload crashes the relay every time it is about to be published
    ids = enqueue(10, stream="suspects") + enqueue(1, stream="suspects", payload={"poison": True})
    runs, statuses = 0, []
    # When relays run one after another, each one's leases expiring once it died, until none crashes
    while runs < 12:
        proc = subprocess.run([sys.executable, str(CLAIMER), database_url, servers.redis_url, "--batch", "11",
                               "--max-attempts", "3", "--crash-on-payload", "poison"],
                              capture_output=True, text=True, timeout=120)
        runs += 1
        statuses.append(proc.returncode)
        if proc.returncode == 0:
            break
        assert proc.returncode == 3, proc.stderr
        with app_engine.begin() as conn:
            conn.execute(text("UPDATE outbox_message SET lease_expires_at = now() - interval '1 second' "
                              "WHERE status = 'leased'"))
    # Then the crashing message ran out of attempts alone: it crashed three relays
    # (claimed with the batch, requeued with it after that first expiry, crashed the
    # batch again, then alone) and is dead as lease_expired after exactly its attempts
    assert statuses == [3, 3, 3, 0]
    by_id = {str(r["message_id"]): r for r in rows()}
    poison = by_id[str(ids[-1])]
    assert (poison["status"], poison["last_error_class"], poison["attempts"]) == ("dead", "lease_expired", 3)
    # And every other message of its batch was delivered: twice in a batch that the
    # poison crashed, then alone
    innocents = [by_id[str(i)] for i in ids[:-1]]
    assert {(r["status"], r["attempts"]) for r in innocents} == {("delivered", 3)}
    assert {f["id"] for _, f in redis_client.xrange(redis_prefix + "suspects")} == {str(i) for i in ids[:-1]}
