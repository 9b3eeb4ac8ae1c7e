"""Redis servers of a test's own on free loopback ports (`outbox_tools.redis_nodes`):
the test is skipped, saying why, where redis-server (or, for a cluster, redis-cli) is
not installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox_tools import redis_nodes
from outbox_tools.redis_nodes import MissingServer


class RedisNode(redis_nodes.RedisNode):
    def __init__(self, directory: Path, *args: str) -> None:
        try:
            super().__init__(directory, *args)
        except MissingServer as exc:
            pytest.skip(str(exc))


class OwnCluster(redis_nodes.OwnCluster):
    def __init__(self, directory: Path, primaries: int = 3) -> None:
        try:
            super().__init__(directory, primaries)
        except MissingServer as exc:
            pytest.skip(str(exc))


def replicated_pair(directory: Path, *args: str) -> tuple[RedisNode, RedisNode]:
    try:
        return redis_nodes.replicated_pair(directory, *args)
    except MissingServer as exc:
        pytest.skip(str(exc))
