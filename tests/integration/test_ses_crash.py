"""Crash mid-batch: the relay process is killed (SIGKILL) after k sends; after its lease
expires, the survivor re-sends only what was sent but not yet recorded, which is at
most OUTBOX_SES_RECORD_GROUP_SIZE + OUTBOX_SES_MAX_CONCURRENCY messages."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from outbox_relay.loop import RelayLoop
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.registry import Channel
from outbox_relay.publishers.ses.publisher import SesPublisher
from outbox_relay.store import LeaseStore
from outbox_tools.local_ses import LocalSesServer, answer_get_account
from support.ses import DEFAULT_FROM, SENDER_IDENTITY

ROOT = Path(__file__).resolve().parents[2]
OUTBOX = Path(sys.executable).with_name("outbox")
GROUP, CONCURRENCY, RATE = 5, 4, 40
TOTAL, KILL_AFTER = 40, 17


@pytest.mark.slow
def test_killed_sender_resends_at_most_one_group_plus_in_flight(database_url, relay_engine, enqueue_mail, rows,
                                                                expire_leases, policy, aws_env):
    with LocalSesServer(max_send_rate=RATE) as ses:
        # Given 40 emails and the real relay handler running as its own process against a local SES
        ses.verify(SENDER_IDENTITY)
        enqueue_mail(TOTAL, subject=lambda i: f"crash-{i:02d}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")} | {
            "DATABASE_URL": database_url, "OUTBOX_CHANNEL": "ses", "OUTBOX_SES_FROM": DEFAULT_FROM,
            "OUTBOX_SES_RECORD_GROUP_SIZE": str(GROUP), "OUTBOX_SES_MAX_CONCURRENCY": str(CONCURRENCY),
            "AWS_ENDPOINT_URL_SESV2": ses.url, "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_NAMESPACE": "OutboxRelayTest", "POWERTOOLS_LOG_LEVEL": "WARNING",
        }
        proc = subprocess.Popen([str(OUTBOX), "relay", "--event", "events/relay-ses-scheduler.json"], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        # When it is killed once SES has accepted k sends
        give_up = time.monotonic() + 60
        while len(ses.sent_messages()) < KILL_AFTER:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < give_up, "the relay process sent nothing"
            time.sleep(0.002)
        proc.kill()
        proc.wait(10)
        sent_at_kill = len(ses.sent_messages())
        recorded_at_kill = sum(r["status"] == "delivered" for r in rows())
        unrecorded = sent_at_kill - recorded_at_kill

        # Then what was sent but not yet recorded is at most one group plus the sends in flight
        assert 0 <= unrecorded <= GROUP + CONCURRENCY
        assert {r["status"] for r in rows()} <= {"delivered", "leased"}

        # And once the dead process's lease has expired, a survivor delivers the rest
        expire_leases()
        client = ses.client()
        answer_get_account(client, max_send_rate=200)
        survivor = SesPublisher(client, default_sender=DEFAULT_FROM, max_concurrency=CONCURRENCY,
                                record_group_size=GROUP)
        store = LeaseStore(relay_engine, Channel.SES, default_max_attempts=5)
        summary = RelayLoop(store, survivor, policy, Deadline(lambda: 60_000, 5), "survivor").run()
        assert summary.delivered == TOTAL - recorded_at_kill
        assert {r["status"] for r in rows()} == {"delivered"}

        # And every email reached SES, exactly the unrecorded ones twice
        per_subject = Counter(m.subject for m in ses.sent_messages())
        assert sorted(per_subject) == [f"crash-{i:02d}" for i in range(TOTAL)]
        resent = sum(n - 1 for n in per_subject.values())
        print(f"\nkilled after {sent_at_kill} sends ({recorded_at_kill} recorded): re-sent {resent}; "
              f"bound {GROUP} + {CONCURRENCY} = {GROUP + CONCURRENCY}")
        assert resent == unrecorded
