"""The SQLAlchemy engine, made for Lambda.

- One small pool per container, reused across warm invocations.
- Autocommit: every statement of the relay is its own short transaction (one
  round trip, no BEGIN/COMMIT), which is also what RDS Proxy and PgBouncer in
  transaction mode need. The producer API does not use this engine: it writes
  in the caller's transaction.
- No pre-ping round trip: a connection that died while the container was
  frozen is detected on use and the unit of work is retried once
  (`run_with_retry`).
- Credentials from `DATABASE_URL`, or from a Secrets Manager secret through
  Powertools parameters (cached for `SECRET_MAX_AGE_SECONDS`, fetched again
  when a login fails, as after a rotation), or an RDS IAM auth token generated
  per new connection ("Connecting to your DB instance using IAM
  authentication", Amazon RDS User Guide).
- TLS: `DATABASE_TLS=verify-full` verifies the server certificate against
  `DATABASE_CA_BUNDLE` (the RDS global bundle) and the host name.
"""

from __future__ import annotations

import functools
import socket
import ssl
from typing import Any, Callable, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError

from .config import Settings
from .errors import ConfigurationError
from .observability import logger as log

T = TypeVar("T")

SECRET_MAX_AGE_SECONDS = 300


def _secret_url(settings: Settings, force_fetch: bool = False) -> URL:
    from aws_lambda_powertools.utilities import parameters

    assert settings.database_secret_arn is not None
    try:
        secret: Any = parameters.get_secret(
            settings.database_secret_arn, transform="json",
            max_age=SECRET_MAX_AGE_SECONDS, force_fetch=force_fetch,
        )
    except Exception as exc:  # the secret is unreadable: configuration, not data
        raise ConfigurationError("DATABASE_SECRET_ARN", f"cannot read the secret ({type(exc).__name__})") from exc
    try:
        return URL.create(
            "postgresql+pg8000",
            username=secret["username"],
            password=secret.get("password"),
            host=secret["host"],
            port=int(secret.get("port", 5432)),
            database=secret.get("dbname") or secret.get("database") or "postgres",
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError(
            "DATABASE_SECRET_ARN", "secret must be JSON with host, port, username, password, dbname"
        ) from exc


def base_url(settings: Settings) -> URL:
    """The URL the engine is created with (password from the secret, if any)."""
    if settings.database_url:
        url = make_url(settings.database_url)
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+pg8000")
        if url.drivername != "postgresql+pg8000":
            raise ConfigurationError("DATABASE_URL", f"driver must be postgresql+pg8000, not {url.drivername}")
        return url
    return _secret_url(settings)


def _ssl_context(settings: Settings) -> ssl.SSLContext | None:
    if settings.database_tls == "disable":
        return None
    if settings.database_tls == "require":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=settings.database_ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError("DATABASE_CA_BUNDLE", f"cannot load CA bundle ({exc})") from exc


@functools.cache
def _rds_client(region: str | None) -> Any:
    import boto3

    return boto3.client("rds", region_name=region)


def iam_token(host: str, port: int, user: str, region: str | None = None) -> str:
    """A fresh RDS IAM authentication token (valid 15 minutes) for one new connection.

    The token is a SigV4-presigned request made locally from the function's
    credentials (no network call); `region` defaults to the environment's
    (AWS_REGION in Lambda). "Connecting to your DB instance using IAM
    authentication and the AWS SDK for Python (Boto3)", Amazon RDS User Guide.
    """
    return _rds_client(region).generate_db_auth_token(DBHostname=host, Port=port, DBUsername=user)


def _is_login_refused(exc: Exception) -> bool:
    """True for a server's refusal of the credentials: SQLSTATE class 28
    (invalid_authorization_specification 28000, invalid_password 28P01;
    PostgreSQL documentation, Appendix A "PostgreSQL Error Codes")."""
    detail = exc.args[0] if exc.args else None
    return isinstance(detail, dict) and str(detail.get("C", "")).startswith("28")


def create_relay_engine(settings: Settings, *, token_provider: Callable[[str, int, str], str] | None = None) -> Engine:
    """Build the engine used by the lease store, once per container.

    `token_provider(host, port, user) -> password` overrides IAM token
    generation (tests stub it). Raises `ConfigurationError` for unusable
    settings, among them IAM authentication without TLS, which RDS refuses
    ("IAM database authentication for MariaDB, MySQL, and PostgreSQL",
    Amazon RDS User Guide: connections must use SSL).
    """
    if settings.database_iam_auth and settings.database_tls == "disable":
        raise ConfigurationError("DATABASE_TLS", "IAM authentication needs TLS: set require or verify-full")
    url = base_url(settings)
    connect_args: dict[str, Any] = {"timeout": 10, "application_name": "outbox-relay"}
    # pg8000 takes ssl_context=None as "try TLS unverified, else clear text";
    # `disable` means no TLS at all, so pass False.
    ctx = _ssl_context(settings)
    connect_args["ssl_context"] = ctx if ctx is not None else False
    engine = create_engine(
        url,
        isolation_level="AUTOCOMMIT",
        pool_size=settings.database_pool_size,
        max_overflow=2,
        pool_recycle=900,
        pool_pre_ping=False,
        connect_args=connect_args,
    )
    event.listen(engine, "connect", _set_no_delay)
    memoize_paramstyle_conversion()

    if settings.database_iam_auth:
        provider = token_provider or iam_token

        @event.listens_for(engine, "do_connect")
        def _iam_password(dialect, conn_rec, cargs, cparams):  # noqa: ANN001
            cparams["password"] = provider(cparams["host"], int(cparams.get("port", 5432)), cparams["user"])

    elif settings.database_secret_arn and not settings.database_url:

        @event.listens_for(engine, "do_connect")
        def _secret_password(dialect, conn_rec, cargs, cparams):  # noqa: ANN001
            # Current credentials (cached); when the server refuses them, fetch
            # the secret again, once: it may have been rotated since it was cached.
            cparams.update(_cparams(_secret_url(settings)))
            try:
                return dialect.dbapi.connect(*cargs, **cparams)
            except dialect.dbapi.DatabaseError as exc:
                if not _is_login_refused(exc):
                    raise
                log.info("database refused the cached credentials; fetching the secret again")
                cparams.update(_cparams(_secret_url(settings, force_fetch=True)))
                return dialect.dbapi.connect(*cargs, **cparams)

    return engine


def _set_no_delay(dbapi_connection: Any, connection_record: Any) -> None:
    """Turn off Nagle's algorithm on a new pg8000 connection's TCP socket.

    libpq does this for every connection (PostgreSQL source, fe-connect.c,
    `connectNoDelay`); pg8000 does not. pg8000 writes a statement's Bind in
    parts, so a Bind larger than one TCP segment (the outcome arrays of a
    batch) left its tail waiting for the ACK of the first part, which the
    server delays ("TCP delayed acknowledgement", 40 ms on Linux): bench/
    measured the outcome write of 1,000 messages at 18 ms with this and
    62-71 ms without. Unix-domain sockets have no such option and are left alone.
    pg8000 keeps its socket in `_usock` (no public accessor); when that changes,
    the connection still works, only slower.
    """
    sock = getattr(dbapi_connection, "_usock", None)
    if sock is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        log.warning("could not set TCP_NODELAY on the database connection", extra={"error_class": type(exc).__name__})


def memoize_paramstyle_conversion() -> None:
    """Make pg8000 convert each distinct statement text's placeholders once per process.

    pg8000 rewrites a statement's `%s` placeholders (SQLAlchemy's `format`
    paramstyle for pg8000) into `$1, $2, …` on every execute, with a scanner
    that reads the text one character at a time in Python (pg8000.dbapi,
    `convert_paramstyle`): 0.7 ms for the claim's 3,000 characters and 1.3 ms
    per invocation on the bench machine, whatever the batch size. For the
    `format` style the rewritten text depends on the text only (the
    parameters pass through unchanged), so it is kept in a dictionary keyed
    by the text. The relay has a handful of statements; texts longer than
    `_PARAMSTYLE_CACHE_MAX_CHARS` are not kept, and when
    `_PARAMSTYLE_CACHE_SIZE` texts are kept the dictionary starts again
    empty, so a process that also runs SQL built at run time (an `IN` list of
    varying length) holds at most about 1 MB of it and the relay's own
    statements come back on their next use. Other paramstyles go straight to
    pg8000.

    This replaces `pg8000.legacy.convert_paramstyle` for the whole process
    (every pg8000 connection, not only the relay's engine); pg8000 looks the
    function up in that module at each execute. If a pg8000 release moves
    it, this does nothing and statements are converted as before. Idempotent.
    """
    try:
        import pg8000.legacy as legacy
    except ImportError:  # pragma: no cover - pg8000 is a dependency
        return
    original = getattr(legacy, "convert_paramstyle", None)
    if original is None or getattr(original, "outbox_memoized", False):
        return
    cache: dict[str, str] = {}

    def convert_paramstyle(style: str, query: str, args: Any) -> tuple[str, Any]:
        if style != "format":
            return original(style, query, args)
        statement = cache.get(query)
        if statement is None:
            statement, vals = original(style, query, args)
            if len(query) <= _PARAMSTYLE_CACHE_MAX_CHARS:
                if len(cache) >= _PARAMSTYLE_CACHE_SIZE:
                    cache.clear()
                cache[query] = statement
            return statement, vals
        return statement, args

    convert_paramstyle.outbox_memoized = True  # type: ignore[attr-defined]
    convert_paramstyle.original = original  # type: ignore[attr-defined]
    convert_paramstyle.cache = cache  # type: ignore[attr-defined]
    legacy.convert_paramstyle = convert_paramstyle


_PARAMSTYLE_CACHE_SIZE = 64
_PARAMSTYLE_CACHE_MAX_CHARS = 8_000


def _cparams(url: URL) -> dict[str, Any]:
    return {"user": url.username, "password": url.password, "host": url.host,
            "port": url.port or 5432, "database": url.database}


def run_with_retry(engine: Engine, work: Callable[[Any], T]) -> T:
    """Run `work(connection)` once; if the pooled connection turns out to be
    dead (a thawed Lambda container, a failover), run it once more on a new one.
    Any other error propagates."""
    try:
        with engine.connect() as conn:
            return work(conn)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        log.warning("database connection was invalidated; retrying once")
        with engine.connect() as conn:
            return work(conn)
