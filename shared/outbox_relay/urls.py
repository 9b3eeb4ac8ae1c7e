"""The rules for DATABASE_URL and REDIS_URL, for the settings, the relay and the `outbox` command;
and for the AWS SDK's endpoint URLs (AWS_ENDPOINT_URL, a channel's AWS_ENDPOINT_URL_<SERVICE>)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator


def check_endpoint_url(v: str | None) -> str | None:
    from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url

    if v is not None and not (v.lower().startswith(("http://", "https://"))
                              and (is_valid_endpoint_url(v) or is_valid_ipv6_endpoint_url(v))):
        raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:5000")
    return v


#: A setting holding an AWS endpoint URL (the SDK reads the variable itself; checked here
#: so that start-up stops naming it).
EndpointUrl = Annotated[str | None, AfterValidator(check_endpoint_url)]

#: The query parameters a DATABASE_URL may carry (passed to pg8000 as they are).
DATABASE_URL_QUERY = frozenset({"application_name", "unix_sock"})


def parse_database_url(value: str) -> Any:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value)
    except ArgumentError:
        raise ValueError("not a SQLAlchemy URL; use postgresql+pg8000://user:pass@host:5432/db") from None
    except ValueError:  # make_url casts the port with int()
        raise ValueError("the port must be a number from 1 to 65535") from None
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError("the port must be a number from 1 to 65535")
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+pg8000")
    if url.drivername != "postgresql+pg8000":
        raise ValueError(f"driver must be postgresql+pg8000 (PostgreSQL through pg8000; postgresql:// and "
                         f"postgres:// mean the same), not {url.drivername}")
    # The query goes to pg8000's connect(), where another name fails at the first connection.
    for name in url.query:
        if name == "sslmode":
            raise ValueError("sslmode in the URL is not read (pg8000 has no libpq options): "
                             "set DATABASE_TLS=require or verify-full instead")
        if name not in DATABASE_URL_QUERY:
            raise ValueError(f"the query parameter {name!r} is not a connection option "
                             f"(the URL may carry only {', '.join(sorted(DATABASE_URL_QUERY))})")
    return url


def check_redis_url(value: str, *, cluster: bool = False, iam: bool = False) -> None:
    """ValueError for a Redis URL redis-py would read otherwise than it says (a database path
    that is not a number, a bad port) or a cluster cannot use."""
    from urllib.parse import parse_qs, unquote, urlparse

    from redis.connection import URL_QUERY_ARGUMENT_PARSERS, parse_url

    try:
        parsed = urlparse(value)
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
    except ValueError:
        raise ValueError("the port must be a number from 1 to 65535") from None
    try:
        kwargs = parse_url(value)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    # redis-py passes unknown parameters to the connection, where they fail at the first command.
    for name in parse_qs(parsed.query, keep_blank_values=True):
        if name not in URL_QUERY_ARGUMENT_PARSERS:
            raise ValueError(f"the query parameter {name!r} is not a redis-py connection option "
                             f"(known: {', '.join(sorted(URL_QUERY_ARGUMENT_PARSERS))})")
    if parsed.scheme == "unix" and not kwargs.get("path"):
        raise ValueError("a unix:// URL needs the socket's path, unix:///path/to/redis.sock")
    path = unquote(parsed.path).strip("/") if parsed.scheme != "unix" else ""
    if path and not path.isdigit():
        raise ValueError(f"the database in the URL's path must be a number, e.g. redis://host:6379/0, not {path!r}")
    if int(kwargs.get("db", 0)) < 0:
        raise ValueError("the database number must not be negative")
    if cluster and parsed.scheme == "unix":
        raise ValueError("OUTBOX_REDIS_CLUSTER=true needs a redis:// or rediss:// URL of a node, not a unix:// socket")
    if iam and (parsed.scheme != "rediss" or not parsed.username):
        raise ValueError("OUTBOX_REDIS_IAM_AUTH=true needs a rediss:// URL with the IAM-enabled user's id, "
                         "rediss://user-id@host:6379 (ElastiCache accepts IAM tokens only over TLS)")
    if cluster and int(kwargs.get("db", 0)) != 0:
        raise ValueError("a Redis Cluster has database 0 only (OUTBOX_REDIS_CLUSTER=true): use /0 or no path")
