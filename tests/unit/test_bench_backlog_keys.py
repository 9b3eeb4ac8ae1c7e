"""The catch-up's reference backlog waits on the producers' own keys, in the order they commit
them (bench/scaling.py `backlog_key`, bench/latency.py `producer_key`)."""

from __future__ import annotations

from bench.latency import FIRST_SEED, producer_key
from bench.scaling import KEYS, backlog_key


def test_a_backlog_takes_each_producers_keys_in_the_order_that_producer_commits_them():
    producers = 3
    backlog = [backlog_key(i, producers) for i in range(2 * producers * KEYS + 5)]
    for p in range(producers):
        mine = backlog[p::producers]  # the producers take turns
        assert mine == [producer_key(FIRST_SEED + p, j, KEYS) for j in range(len(mine))]
    assert len(set(backlog)) == producers * KEYS
    assert backlog[:4] == [f"p{FIRST_SEED}.0", f"p{FIRST_SEED + 1}.0", f"p{FIRST_SEED + 2}.0", f"p{FIRST_SEED}.1"]
