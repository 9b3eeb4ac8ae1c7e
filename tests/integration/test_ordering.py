"""Per-key ordering on the real servers: a poisoned key beside healthy ones, the
dead-letter policies with redrive and discard, many relays at once, and SES
sending one key's emails one at a time, in order."""

from __future__ import annotations

import collections
import dataclasses
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis as redis_lib
from sqlalchemy import text

from outbox_relay.backoff import Backoff
from outbox_relay.loop import RelayLoop, RelayPolicy
from outbox_relay.models import DeliveryResult, ErrorClass, Mode, OrderingOnDead
from outbox_relay.operations.dead import discard
from outbox_relay.operations.redrive import RedriveSelection, redrive
from outbox_relay.producer import enqueue_events_bulk
from outbox_relay.publishers.base import Deadline, Publisher
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore, lease_token
from outbox_tools.local_ses import fail_send_email
from support.ses import make_publisher, sent_messages

CLAIMER = Path(__file__).parents[1] / "support" / "claimer.py"


class FailingKey(Publisher):
    """The real Redis publisher, but the messages of `key` fail with `error_class`
    (the first of them in each batch; its later ones are not attempted, as the
    script answers); `times` failures in all, then the key is healthy."""

    def __init__(self, real: RedisStreamsPublisher, key: str, error_class: ErrorClass, times: int = 10**9):
        self.real, self.key, self.error_class, self.times = real, key, error_class, times
        self.channel, self.pipelined = real.channel, real.pipelined
        self.failures = 0

    def begin(self, deadline):
        self.real.begin(deadline)

    def gate(self):
        return self.real.gate()

    def claim_limit(self, batch_size, seconds):
        return self.real.claim_limit(batch_size, seconds)

    def deliver(self, messages, deadline, record):
        ours = [m for m in messages if m.key == self.key]
        if ours and self.failures < self.times:
            self.failures += 1
            record([DeliveryResult(ours[0].seq, error_class=self.error_class, error="poisoned")]
                   + [DeliveryResult(m.seq, error_class=ErrorClass.NOT_ATTEMPTED, error="key stopped")
                      for m in ours[1:]])
            messages = [m for m in messages if m.key != self.key]
        self.real.deliver(messages, deadline, record)


def enqueue_keyed(app_engine, stream: str, keys: list[str | None]) -> list:
    """One message per element of `keys`, in that order (one transaction); returns their ids."""
    with app_engine.begin() as conn:
        return enqueue_events_bulk(conn, [dict(stream=stream, type="t", payload={"n": i}, key=k)
                                          for i, k in enumerate(keys)])


def stream_order(redis_client, stream: str, app_engine) -> dict[str | None, list[int]]:
    """Per key, the seqs of the stream's entries in stream order (each message once, checked)."""
    with app_engine.connect() as conn:
        seq_of = {str(m): s for m, s in conn.execute(text("SELECT message_id, seq FROM outbox_message"))}
    entries = redis_client.xrange(stream)
    ids = [f["id"] for _, f in entries]
    assert len(ids) == len(set(ids)), "a message is twice in the stream"
    order: dict[str | None, list[int]] = collections.defaultdict(list)
    for _, f in entries:
        order[f.get("key")].append(seq_of[f["id"]])
    return order


def statuses(app_engine, key: str) -> list[tuple]:
    with app_engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT status, attempts, available_at > now() FROM outbox_message WHERE key = :k ORDER BY seq"),
            {"k": key})]


@pytest.mark.parametrize("mode", [Mode.DRAIN, pytest.param(Mode.LATENCY, marks=pytest.mark.slow)],
                         ids=lambda m: m.value)
def test_a_poisoned_key_holds_back_only_itself(enqueue, store, publisher, policy, invoke, redis_client,
                                               redis_prefix, app_engine):
    # Given four keys interleaved on one stream, one of which fails every time
    keys = [k for _ in range(30) for k in ("a", "b", "c", "poison")]
    enqueue_keyed(app_engine, redis_prefix + "mixed", keys)
    poisoned = FailingKey(publisher, "poison", ErrorClass.TRANSIENT)
    small = RelayPolicy(batch_size=20, lease_seconds=30, backoff=Backoff(base=60, cap=60, floor=60))
    # When one invocation runs
    summary = invoke(store, poisoned, small, lease_token("t"))
    # Then every healthy key drained in that invocation, each in enqueue order
    order = stream_order(redis_client, redis_prefix + "mixed", app_engine)
    for key in ("a", "b", "c"):
        assert len(order[key]) == 30 and order[key] == sorted(order[key])
    assert "poison" not in order
    # And the poisoned key's head waits for its retry, with its later messages untried
    # (their attempts refunded) and moved out of the way
    rows = statuses(app_engine, "poison")
    assert rows[0] == ("pending", 1, True)
    assert set(rows[1:]) == {("pending", 0, True)}
    assert summary.delivered == 90 and poisoned.failures == 1


def test_a_head_released_behind_a_full_window_of_its_key_is_claimed_first(enqueue, store, publisher, policy,
                                                                           invoke, redis_client, redis_prefix,
                                                                           app_engine):
    # Given one key's eleven messages, whose head was claimed and then released (so it is
    # due again, but later in the due order than the ten behind it)
    enqueue_keyed(app_engine, redis_prefix + "one", ["a"] * 11)
    first = lease_token("first")
    (head,) = store.claim(first, 1, 30).messages
    assert store.release(first, [head.seq]).released == 1
    # When invocations claim ten at a time
    small = RelayPolicy(batch_size=10, lease_seconds=30, backoff=policy.backoff)
    first_run = invoke(store, publisher, small, lease_token("t"))
    rest = invoke(store, publisher, small, lease_token("t2"))  # batch mode: one batch each
    # Then the key is not stuck behind its head: the head goes first, then the rest, in order
    order = stream_order(redis_client, redis_prefix + "one", app_engine)
    assert order["a"] == list(range(order["a"][0], order["a"][0] + 11))
    assert first_run.delivered >= 10 and first_run.delivered + rest.delivered == 11


def test_drain_goes_on_past_a_key_whose_head_a_concurrent_claim_has_locked(store, publisher, policy, redis_client,
                                                                           redis_prefix, app_engine):
    # Given 30 messages, the first two of key "x", and the head row locked by another
    # transaction (as a concurrent claim holds it until it commits)
    stream = redis_prefix + "locked"
    enqueue_keyed(app_engine, stream, ["x", "x", *[f"k{i}" for i in range(28)]])
    drain = dataclasses.replace(policy, batch_size=10, mode=Mode.DRAIN)
    plenty = Deadline(lambda: 600_000, margin_seconds=1)
    with app_engine.connect() as holder:
        holder.execute(text("SELECT seq FROM outbox_message ORDER BY seq LIMIT 1 FOR UPDATE"))
        # When one drain-mode invocation runs: its first claim sees the second "x" out of turn
        locked = RelayLoop(store, publisher, drain, plenty, lease_token("t")).run()
        holder.rollback()
    # Then it did not take that batch's shortfall for the end of the backlog: everything but
    # the locked head and the message behind it was delivered
    order = stream_order(redis_client, stream, app_engine)
    assert locked.delivered == 28 and "x" not in order
    # And once the lock is gone, the key goes on in order
    after = RelayLoop(store, publisher, drain, plenty, lease_token("t2")).run()
    order = stream_order(redis_client, stream, app_engine)
    assert after.delivered == 2 and len(order["x"]) == 2 and order["x"] == sorted(order["x"])


def test_drain_goes_on_after_a_claim_that_only_moved_rows_out_of_a_full_window(store, publisher, policy,
                                                                              redis_client, redis_prefix,
                                                                              app_engine):
    # Given at the front of the due order five messages of "y", whose head waits for a retry,
    # and five of "x", whose head another transaction holds locked; then 50 keyless messages
    stream = redis_prefix + "front"
    enqueue_keyed(app_engine, stream, ["y"] * 6 + ["x"] * 6 + [None] * 50)
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET attempts = 1, available_at = now() + interval '1 hour' "
                          "WHERE seq = (SELECT min(seq) FROM outbox_message WHERE key = 'y')"))
    drain = dataclasses.replace(policy, batch_size=10, mode=Mode.DRAIN)
    with app_engine.connect() as holder:
        holder.execute(text("SELECT seq FROM outbox_message WHERE key = 'x' ORDER BY seq LIMIT 1 FOR UPDATE"))
        # When one drain-mode invocation runs: its first claim claims nothing, moves y's five
        # out of the way and leaves x's five out of turn
        summary = RelayLoop(store, publisher, drain, Deadline(lambda: 600_000, margin_seconds=1),
                                 lease_token("t")).run()
        holder.rollback()
    # Then it claimed again past them and delivered the 50 behind, and neither key went out of turn
    order = stream_order(redis_client, stream, app_engine)
    assert summary.delivered == 50 and len(order[None]) == 50
    assert "x" not in order and "y" not in order


@pytest.mark.parametrize("policy_on_dead", list(OrderingOnDead), ids=lambda p: p.value)
def test_a_dead_head_and_the_policies(relay_engine, enqueue, publisher, policy, redis_client, redis_prefix,
                                      app_engine, plenty, policy_on_dead):
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=3, ordering_on_dead=policy_on_dead)
    # Given a key whose first message is refused for good, beside another key
    enqueue_keyed(app_engine, redis_prefix + "dead", ["k", "other", "k", "other", "k", "k"])
    refusing = FailingKey(publisher, "k", ErrorClass.PERMANENT, times=1)
    drain = RelayPolicy(batch_size=100, lease_seconds=30, backoff=Backoff(), mode=Mode.DRAIN)
    RelayLoop(store, refusing, drain, plenty, lease_token("a")).run()
    stream = redis_prefix + "dead"
    order = stream_order(redis_client, stream, app_engine)
    assert len(order["other"]) == 2
    rows = statuses(app_engine, "k")
    assert rows[0][0] == "dead"
    if policy_on_dead is OrderingOnDead.SKIP:
        # Then under skip the key goes on without its dead head, in the same invocation
        assert order["k"] == sorted(order["k"]) and len(order["k"]) == 3
        assert [r[0] for r in rows[1:]] == ["delivered"] * 3
        return
    # Then under block the key waits, its messages moved ahead, not scanned by every claim
    assert "k" not in order and [r[:2] for r in rows[1:]] == [("pending", 0)] * 3 and all(r[2] for r in rows[1:])
    assert RelayLoop(store, publisher, drain, plenty, lease_token("b")).run().claimed == 0
    # When the dead head is redriven, it is delivered first, then the rest in order
    with app_engine.connect() as conn:
        head = conn.execute(text("SELECT message_id FROM outbox_message WHERE status = 'dead'")).scalar_one()
    redrive(app_engine, RedriveSelection(message_ids=(head,)))
    RelayLoop(store, publisher, drain, plenty, lease_token("c")).run()
    order = stream_order(redis_client, stream, app_engine)
    with app_engine.connect() as conn:
        seqs = list(conn.execute(text("SELECT seq FROM outbox_message WHERE key = 'k' ORDER BY seq")).scalars())
    assert order["k"] == seqs


def test_under_block_a_discard_lets_the_key_go_on(relay_engine, enqueue, publisher, redis_client, redis_prefix,
                                                  app_engine, plenty):
    store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=3, ordering_on_dead=OrderingOnDead.BLOCK)
    enqueue_keyed(app_engine, redis_prefix + "discard", ["k", "k", "k"])
    drain = RelayPolicy(batch_size=100, lease_seconds=30, backoff=Backoff(), mode=Mode.DRAIN)
    RelayLoop(store, FailingKey(publisher, "k", ErrorClass.PERMANENT, times=1), drain, plenty, lease_token("a")).run()
    with app_engine.connect() as conn:
        head = conn.execute(text("SELECT message_id FROM outbox_message WHERE status = 'dead'")).scalar_one()
    assert discard(app_engine, [head]).discarded == (str(head),)
    RelayLoop(store, publisher, drain, plenty, lease_token("b")).run()
    order = stream_order(redis_client, redis_prefix + "discard", app_engine)
    assert len(order["k"]) == 2 and order["k"] == sorted(order["k"])
    assert [r[0] for r in statuses(app_engine, "k")] == ["discarded", "delivered", "delivered"]


def test_eight_relays_at_once_keep_each_keys_order(relay_engine, servers, redis_client, redis_prefix,
                                                   app_engine, invoke, mode):
    # Given 2,000 messages on 50 keys, shuffled, and eight relays at once (small batches)
    rng = random.Random(14)
    keys = [f"k{rng.randrange(50)}" for _ in range(2000)]
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=redis_prefix + "eight", type="t", payload={"n": i}, key=k)
                                   for i, k in enumerate(keys)])
    errors: list[BaseException] = []

    def relay() -> None:
        try:
            store = LeaseStore(relay_engine, Channel.REDIS, default_max_attempts=5)
            client = redis_lib.Redis.from_url(servers.redis_url)
            publisher = RedisStreamsPublisher(client, dedupe_ttl_seconds=3600)
            policy = RelayPolicy(batch_size=37, lease_seconds=30, backoff=Backoff())
            idle = 0
            while idle < (1 if mode is Mode.LATENCY else 3):  # a latency invocation polls until its deadline
                idle = idle + 1 if invoke(store, publisher, policy, lease_token("t")).claimed == 0 else 0
            client.close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=relay) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    # Then per key the stream is in enqueue order, each message exactly once, all recorded delivered
    order = stream_order(redis_client, redis_prefix + "eight", app_engine)
    assert sum(len(v) for v in order.values()) == 2000
    for key, seqs in order.items():
        assert seqs == sorted(seqs), key
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT status, count(*) FROM outbox_message GROUP BY status")).fetchall() == [
            ("delivered", 2000)]


@pytest.mark.slow
def test_eight_processes_keep_each_keys_order(database_url, servers, redis_client, redis_prefix, app_engine):
    # Given 5,000 messages on 50 keys, shuffled, and eight relay processes at once
    rng = random.Random(5000)
    with app_engine.begin() as conn:
        enqueue_events_bulk(conn, [dict(stream=redis_prefix + "procs", type="t", payload={"n": i},
                                        key=f"k{rng.randrange(50)}") for i in range(5000)])
    procs = [subprocess.Popen([sys.executable, str(CLAIMER), database_url, servers.redis_url, "--batch", "41"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    # Then per key the stream is in enqueue order, each message exactly once
    order = stream_order(redis_client, redis_prefix + "procs", app_engine)
    assert sum(len(v) for v in order.values()) == 5000 and len(order) == 50
    for key, seqs in order.items():
        assert seqs == sorted(seqs), key
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT status, attempts, count(*) FROM outbox_message "
                                 "GROUP BY status, attempts")).fetchall() == [("delivered", 1, 5000)]


def test_ses_sends_one_keys_emails_one_at_a_time_in_order(ses, ses_store, enqueue_mail, policy, plenty):
    # Given 12 emails of one key and 12 without, and sends that take 50 ms each
    ids = enqueue_mail(12, key="order-7", subject=lambda i: f"step {i}")
    enqueue_mail(12, subject=lambda i: f"other {i}")
    lock = threading.Lock()
    in_flight: dict[str, int] = collections.Counter()
    peak = collections.Counter()
    started: list[str] = []

    def slow(request):
        subject = request["Content"]["Simple"]["Subject"]["Data"]
        kind = "keyed" if subject.startswith("step") else "other"
        with lock:
            started.append(subject)
            in_flight[kind] += 1
            peak[kind] = max(peak[kind], in_flight[kind])
        time.sleep(0.05)
        with lock:
            in_flight[kind] -= 1

    fail_send_email(ses, slow)
    publisher = make_publisher(ses, max_concurrency=8, max_send_rate=1000, record_group_size=4)
    # When one batch sends them with up to 8 sends at once
    summary = RelayLoop(ses_store, publisher, policy, plenty, "owner").run()
    # Then the keyed ones went one at a time, in enqueue order, while the others overlapped
    assert summary.delivered == 24 and len(sent_messages()) == 24
    assert [s for s in started if s.startswith("step")] == [f"step {i}" for i in range(12)]
    assert peak["keyed"] == 1 and peak["other"] > 1
    assert len(ids) == 12


def test_ses_stops_a_key_at_its_first_failure(ses, ses_store, enqueue_mail, policy, plenty, rows):
    # Given 5 emails of one key, the second of which SES refuses for a moment
    enqueue_mail(5, key="k", subject=lambda i: f"step {i}")
    fail_send_email(ses, lambda r: ("TooManyRequestsException", "slow down", 429)
                    if r["Content"]["Simple"]["Subject"]["Data"] == "step 1" else None)
    summary = RelayLoop(ses_store, make_publisher(ses, max_concurrency=8), policy, plenty, "owner").run()
    # Then the first was sent, the second deferred, the three after it not attempted (refunded), unsent
    assert summary.delivered == 1 and [m.subject for m in sent_messages()] == ["step 0"]
    got = [(r["status"], r["attempts"], r["last_error_class"]) for r in rows()]
    assert got[0] == ("delivered", 1, None)
    assert got[1][0] == "pending" and got[1][2] == "throttled"
    assert got[2:] == [("pending", 0, "not_attempted")] * 3
