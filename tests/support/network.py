"""Network faults for the integration tests: a TCP forwarder in front of the
real Redis whose connections can be cut (`Forwarder.cut`), as a partition or a
failover would (real sockets, real client errors)."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from support.forward import Forwarder


@pytest.fixture
def tcp_redis(servers):
    parsed = urlparse(servers.redis_url)
    if parsed.scheme not in ("redis", "rediss") or not parsed.port:
        pytest.skip("needs Redis over TCP")
    with Forwarder("127.0.0.1", parsed.hostname, parsed.port) as proxy:
        yield proxy
