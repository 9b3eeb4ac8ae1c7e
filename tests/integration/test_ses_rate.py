"""Throughput within the account's MaxSendRate: concurrent sends, paced by the token bucket."""

from __future__ import annotations

import bisect
import threading
import time

import pytest

from outbox_relay.loop import RelayLoop
from outbox_relay.publishers.base import Deadline
from outbox_tools.local_ses import fail_send_email
from support.ses import make_publisher, sent_messages

LATENCY_SECONDS = 0.1  # simulated SendEmail round trip: one thread alone could send only 10 per second


def _slow_sends(client) -> tuple[list[float], list[int]]:
    """Each SendEmail takes LATENCY_SECONDS; returns the start times and the peak of calls in flight."""
    starts: list[float] = []
    peak = [0]
    in_flight = [0]
    lock = threading.Lock()

    def slow(_request):
        with lock:
            starts.append(time.monotonic())
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(LATENCY_SECONDS)
        with lock:
            in_flight[0] -= 1
        return None  # then moto records the send

    fail_send_email(client, slow)
    return starts, peak


@pytest.mark.slow
def test_sends_close_to_max_send_rate_and_never_more_in_any_second(ses, ses_store, enqueue_mail, policy, plenty,
                                                                   rows):
    # Given 41 emails, an account whose MaxSendRate is 20 per second, and sends that take 100 ms each
    max_send_rate, n = 20, 41
    enqueue_mail(n)
    starts, peak = _slow_sends(ses)
    publisher = make_publisher(ses, max_send_rate=max_send_rate, max_concurrency=8, record_group_size=10)

    # When one invocation sends them
    summary = RelayLoop(ses_store, publisher, policy, plenty, "owner-1").run()

    # Then all are delivered, concurrently (one thread could not keep up with 100 ms calls)
    assert summary.delivered == n and len(sent_messages()) == n
    assert peak[0] >= 2

    # And no one-second window holds more than MaxSendRate sends
    starts.sort()
    busiest = max(bisect.bisect_left(starts, t + 1.0) - i for i, t in enumerate(starts))
    assert busiest <= max_send_rate

    # And the rate over the run is close to MaxSendRate (the bucket keeps 3% headroom)
    measured = (n - 1) / (starts[-1] - starts[0])
    print(f"\nmeasured send rate {measured:.2f}/s against MaxSendRate {max_send_rate}/s; "
          f"busiest one-second window {busiest}; peak concurrency {peak[0]}")
    assert 0.9 * max_send_rate <= measured <= max_send_rate


def test_claim_is_bounded_by_what_the_rate_allows_before_the_deadline(ses, ses_store, enqueue_mail, policy, rows):
    # Given 30 emails of 3 recipients each (the rate counts recipients), MaxSendRate 10 per second,
    # and an invocation with 2.5 s left of which 1 s is kept in reserve
    enqueue_mail(30, to=lambda i: [f"a{i}@example.com", f"b{i}@example.com", f"c{i}@example.com"])
    publisher = make_publisher(ses, max_send_rate=10, max_concurrency=4)
    ends = time.monotonic() + 2.5
    deadline = Deadline(lambda: max(0, int((ends - time.monotonic()) * 1000)), margin_seconds=1.0)

    # When it runs
    summary = RelayLoop(ses_store, publisher, policy, deadline, "owner-1").run()

    # Then it claims only what 10 per second allows in the 1.5 s it has (10 / 1.03 × 1.5 = 14)
    assert 9 <= summary.claimed <= 14  # fewer when the machine is slow to get to the claim
    # And sends what the recipient-weighted pace allows (one email each 0.31 s), releasing the rest
    # with attempts refunded; the unclaimed stay untouched
    sent = len(sent_messages())
    assert 2 <= sent <= 6
    assert (summary.delivered, summary.released) == (sent, summary.claimed - sent)
    after = rows()
    assert sum(r["status"] == "delivered" for r in after) == sent
    released = [r for r in after if r["last_error_class"] == "not_attempted"]
    assert len(released) == summary.claimed - sent
    assert {(r["status"], r["attempts"]) for r in released} == {("pending", 0)}
    assert sum(r["status"] == "pending" and r["last_error_class"] is None for r in after) == 30 - summary.claimed
