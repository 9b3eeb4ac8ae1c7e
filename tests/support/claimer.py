"""A relay claimer run as its own process by the concurrency and crash tests.

usage: python claimer.py DATABASE_URL REDIS_URL --batch N [--lease S] [--max-attempts N]
                         [--die-after-publish | --crash-on-payload TEXT]

Loops RelayLoop.run until the queue is empty, printing one JSON line per batch
with the claimed seqs. With --die-after-publish it claims one batch,
publishes it to Redis, prints "published" and waits to be killed before
recording anything (the crash test's SIGKILL). With --crash-on-payload the
process dies (exit status 3, nothing released or recorded) as soon as it is
about to publish a batch holding a payload with TEXT in it: a message that
crashes the relay.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import redis
from sqlalchemy import create_engine

from outbox_relay.backoff import Backoff
from outbox_relay.loop import RelayLoop, RelayPolicy
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.redis.streams import RedisStreamsPublisher
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import LeaseStore, lease_token


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("database_url")
    ap.add_argument("redis_url")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--lease", type=float, default=30.0)
    ap.add_argument("--max-attempts", type=int, default=5)
    ap.add_argument("--die-after-publish", action="store_true")
    ap.add_argument("--crash-on-payload", default=None)
    args = ap.parse_args()

    engine = create_engine(args.database_url, isolation_level="AUTOCOMMIT", pool_size=1)
    store = LeaseStore(engine, Channel.REDIS, default_max_attempts=args.max_attempts)
    publisher = RedisStreamsPublisher(redis.Redis.from_url(args.redis_url), dedupe_ttl_seconds=3600)
    if args.crash_on_payload is not None:
        deliver, poison = publisher.deliver, args.crash_on_payload

        def crashing(messages, deadline, record):
            if any(poison in m.payload_json for m in messages):
                os._exit(3)
            deliver(messages, deadline, record)

        publisher.deliver = crashing  # type: ignore[method-assign]
    deadline = Deadline(lambda: 600_000, margin_seconds=1)

    if args.die_after_publish:
        owner = lease_token("crash")
        claimed = store.claim(owner, args.batch, args.lease).messages
        publisher.deliver(claimed, deadline, lambda results: None)  # published, not recorded
        print(json.dumps({"owner": owner, "seqs": [m.seq for m in claimed]}), flush=True)
        print("published", flush=True)
        time.sleep(3600)  # killed here, before any outcome is recorded
        return 1

    policy = RelayPolicy(batch_size=args.batch, lease_seconds=args.lease, backoff=Backoff())
    idle = 0
    while idle < 3:
        owner = lease_token("proc")
        seen: list[int] = []
        original = store.claim

        def claim(*args, _orig=original, _seen=seen, **kwargs):
            got = _orig(*args, **kwargs)
            _seen.extend(m.seq for m in got.messages)
            return got

        store.claim = claim  # type: ignore[method-assign]
        summary = RelayLoop(store, publisher, policy, deadline, owner).run()
        store.claim = original  # type: ignore[method-assign]
        print(json.dumps({"owner": owner, "seqs": seen, "delivered": summary.delivered}), flush=True)
        idle = idle + 1 if summary.claimed == 0 else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
