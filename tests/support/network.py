"""Network faults for the integration tests: a TCP forwarder in front of the
real Redis or PostgreSQL whose connections can be cut (`Forwarder.cut`), as a
partition or a failover would (real sockets, real client errors). In front of
the embedded servers, which listen on Unix sockets only, it is also how a test
that needs TCP reaches them."""

from __future__ import annotations

from urllib.parse import unquote, urlparse

import pytest

from support.forward import Forwarder


def redis_target(url: str) -> tuple[str, int | None]:
    """Where a Redis URL points, as `Forwarder` takes it: (host, port), or (socket path, None)."""
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        return unquote(parsed.path), None
    return parsed.hostname or "127.0.0.1", parsed.port or 6379


def postgres_target(url: str) -> tuple[str, int | None]:
    """Where a DATABASE_URL points, as `Forwarder` takes it: (host, port), or (socket path, None)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.query.get("unix_sock"):
        return str(parsed.query["unix_sock"]), None
    return parsed.host or "127.0.0.1", parsed.port or 5432


def postgres_through(forwarder: Forwarder, url: str) -> str:
    """`url` reaching its database through `forwarder` (TCP, no Unix socket)."""
    from sqlalchemy.engine import make_url

    return (make_url(url).set(host=forwarder.host, port=forwarder.port).difference_update_query(["unix_sock"])
            .render_as_string(hide_password=False))


@pytest.fixture
def tcp_redis(servers):
    with Forwarder("127.0.0.1", *redis_target(servers.redis_url)) as proxy:
        yield proxy
