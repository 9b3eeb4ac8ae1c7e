"""The SQLAlchemy engine, made for Lambda.

- One small pool per container, reused across warm invocations.
- Every unit of work is one short explicit transaction (`run_with_retry`), most
  of them a single statement. pg8000 sends a statement as three protocol
  messages each ended by Sync (parse; describe; bind and execute): outside a
  transaction block a pooler in transaction mode (PgBouncer, RDS Proxy) may
  hand each to another server connection, inside one it may not. The BEGIN
  pg8000 sends first and the COMMIT (`OutboxPg8000Dialect`) are one round trip
  each. No session state outlives a transaction. The producer API does not use
  this engine: it writes in the caller's transaction.
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
import time
from typing import Any, Callable, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.pg8000 import PGDialect_pg8000
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError

from .config import Settings
from .errors import ConfigurationError
from .observability import logger as log
from .paramstyle import memoize_paramstyle_conversion
from .urls import parse_database_url

T = TypeVar("T")

SECRET_MAX_AGE_SECONDS = 300


class OutboxPg8000Dialect(PGDialect_pg8000):
    """SQLAlchemy's pg8000 dialect, with COMMIT sent as a simple query: one round
    trip, where pg8000's `commit()` takes three (parse, describe, execute)."""

    supports_statement_cache = True

    def do_commit(self, dbapi_connection: Any) -> None:
        if dbapi_connection.autocommit:
            return  # every statement committed itself
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("COMMIT")  # no parameters: pg8000 sends a simple query
        finally:
            cursor.close()


#: The driver name of `OutboxPg8000Dialect` in a SQLAlchemy URL.
DRIVERNAME = "postgresql+outbox_pg8000"
registry.register("postgresql.outbox_pg8000", __name__, "OutboxPg8000Dialect")


def create_outbox_engine(url: URL | str, **kwargs: Any) -> Engine:
    """A SQLAlchemy engine on `url` (a pg8000 URL) for the relay's and the `outbox`
    command's own work: `OutboxPg8000Dialect`, transactions (never autocommit),
    and new connections checked for a pooler in statement mode."""
    from sqlalchemy.engine import make_url

    if kwargs.get("isolation_level") == "AUTOCOMMIT":
        raise ValueError("the outbox engine runs every unit of work in a transaction")
    engine = create_engine(make_url(url).set(drivername=DRIVERNAME), **kwargs)
    # Before SQLAlchemy's own first queries, which a statement-mode pooler would cut.
    event.listen(engine, "connect", _refuse_statement_pooling, insert=True)
    return engine


def _refuse_statement_pooling(dbapi_connection: Any, connection_record: Any) -> None:
    """Raise `ConfigurationError` (one line naming DATABASE_URL) when the server
    answers a statement but closes the connection at BEGIN, as a pooler in
    statement mode (PgBouncer `pool_mode = statement`) does: every unit of work
    here is a transaction. Three round trips per new connection."""
    from pg8000.exceptions import InterfaceError

    dbapi_connection.autocommit = True
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT 1")  # reachable: an error here is the usual one
        try:
            cursor.execute("BEGIN")
        except InterfaceError:
            raise ConfigurationError(
                "DATABASE_URL", "the server closed the connection at BEGIN: a pooler in statement mode (PgBouncer "
                "pool_mode=statement) cannot serve the outbox, which runs each statement in a transaction; "
                "use transaction or session mode") from None
        cursor.execute("COMMIT")
    finally:
        cursor.close()
        dbapi_connection.autocommit = False


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
        try:
            return parse_database_url(settings.database_url)
        except ValueError as exc:
            raise ConfigurationError("DATABASE_URL", str(exc)) from None
    return _secret_url(settings)


def _ssl_context(settings: Settings) -> ssl.SSLContext | None:
    return tls_context(settings.database_tls, settings.database_ca_bundle)


def tls_context(mode: str, ca_bundle: str | None = None) -> ssl.SSLContext | None:
    """The TLS context for DATABASE_TLS `mode` (disable, require, verify-full), the
    relay's and the `outbox` command's alike."""
    if mode == "disable":
        return None
    if mode == "require":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=ca_bundle)
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
        raise ConfigurationError("DATABASE_TLS", "DATABASE_IAM_AUTH=true needs TLS: set require or verify-full")
    url = base_url(settings)
    connect_args: dict[str, Any] = {"timeout": 10, "application_name": "outbox-relay"}
    # pg8000 takes ssl_context=None as "try TLS unverified, else clear text";
    # `disable` means no TLS at all, so pass False.
    ctx = _ssl_context(settings)
    connect_args["ssl_context"] = ctx if ctx is not None else False
    engine = create_outbox_engine(
        url,
        pool_size=settings.database_pool_size,
        max_overflow=2,
        pool_recycle=900,
        pool_pre_ping=False,
        connect_args=connect_args,
    )
    event.listen(engine, "connect", _set_no_delay)
    event.listen(engine, "handle_error", _socket_errors_are_disconnects)
    event.listen(engine, "handle_error", server_error_behind_a_closed_socket)
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


def _socket_errors_are_disconnects(ctx: Any) -> Any:
    """A socket error from pg8000 (it lets some through unwrapped, e.g. a
    connection reset by a server that ended the backend) means the connection
    is gone: mark it a disconnect, so the pool drops its connections and
    `run_with_retry` runs the work again on a new one."""
    original = ctx.original_exception
    if isinstance(original, OSError) and ctx.sqlalchemy_exception is None:
        ctx.is_disconnect = True
        return OperationalError(ctx.statement, ctx.parameters, original, connection_invalidated=True)
    return None


def server_error_behind_a_closed_socket(ctx: Any) -> Any:
    """The server's refusal of a new connection (a database that does not exist, a
    login refused) instead of pg8000's "network error" that hides it: pg8000 sends
    Terminate before raising, which over a Unix socket the server has already closed
    fails with a broken pipe that replaces the server's error (left in its chain)."""
    import pg8000.exceptions

    original = ctx.original_exception
    if not isinstance(original, pg8000.exceptions.InterfaceError):
        return None
    cause: BaseException | None = original
    for _ in range(4):
        cause = cause.__cause__ or cause.__context__
        if cause is None:
            return None
        if isinstance(cause, pg8000.exceptions.DatabaseError) and cause.args and isinstance(cause.args[0], dict):
            return DBAPIError.instance(None, None, cause, pg8000.exceptions.Error, dialect=ctx.dialect)
    return None


def _set_no_delay(dbapi_connection: Any, connection_record: Any) -> None:
    """Turn off Nagle's algorithm on a new pg8000 connection's TCP socket.

    libpq does this for every connection (PostgreSQL source, fe-connect.c,
    `connectNoDelay`); pg8000 does not. pg8000 writes a statement's Bind in
    parts, so a Bind larger than one TCP segment (the outcome arrays of a
    batch) left its tail waiting for the ACK of the first part, which the
    server delays ("TCP delayed acknowledgement"), stalling the statement.
    Unix-domain sockets have no such option and are left alone.
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


def _cparams(url: URL) -> dict[str, Any]:
    return {"user": url.username, "password": url.password, "host": url.host,
            "port": url.port or 5432, "database": url.database}


#: SQLSTATEs that say the server cannot serve this connection now, not that the
#: statement is wrong: connection exceptions (class 08), operator intervention
#: (57P01-57P03: shutdown, crash restart, still starting up), too many
#: connections (53300), and a read-only server (25006: a demoted writer still
#: reached through the old address during a failover).
_UNREACHABLE_STATES = ("08", "57P01", "57P02", "57P03", "53300", "25006")


#: Latency mode, PostgreSQL unreachable: the longest wait between two tries, seconds
#: (delivery resumes within about this long of its return).
UNREACHABLE_MAX_WAIT = 0.5


def database_unreachable(exc: BaseException) -> bool:
    """Whether `exc` says PostgreSQL cannot be reached now (a failover, a restart,
    a network cut), as opposed to a statement it refused."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig if exc.orig is not None else exc
    import pg8000.exceptions

    if isinstance(exc, ssl.SSLError):
        return False  # a certificate or TLS setting refused: a configuration error, not an outage
    if isinstance(exc, OSError):
        return True
    if isinstance(exc, pg8000.exceptions.InterfaceError):
        # pg8000 says "Can't create a connection", "network error", "connection is
        # closed" for a lost server; its other interface errors (TLS refused, an
        # authentication method it lacks) are configuration errors.
        text = str(exc).lower()
        return not any(word in text for word in ("ssl", "authentication", "password"))
    if isinstance(exc, pg8000.exceptions.DatabaseError) and exc.args and isinstance(exc.args[0], dict):
        code = str(exc.args[0].get("C", ""))
        return code.startswith(_UNREACHABLE_STATES)
    return False


def retry_while_unreachable(work: Callable[[], T], *, time_left: Callable[[], float], reserve: float = 0.0,
                            sleep: Callable[[float], Any] = time.sleep) -> T:
    """Run `work()`; while it fails because PostgreSQL cannot be reached
    (`database_unreachable`), wait (50 ms, doubling up to `UNREACHABLE_MAX_WAIT`)
    and run it again, as long as more than `reserve` seconds of `time_left()`
    would remain after the wait; then raise."""
    wait = 0.05
    while True:
        try:
            return work()
        except Exception as exc:
            if not database_unreachable(exc) or time_left() - wait <= reserve:
                raise
        sleep(wait)
        wait = min(wait * 2, UNREACHABLE_MAX_WAIT)


def run_with_retry(engine: Engine, work: Callable[[Any], T]) -> T:
    """Run `work(connection)` in one short transaction (`engine.begin()`: a
    transaction pooler keeps the statements' protocol messages on one server
    connection); if the pooled connection turns out to be dead (a thawed Lambda
    container, a failover), run it once more on a new one. Any other error
    propagates; pass only work that is harmless to repeat."""
    try:
        with engine.begin() as conn:
            return work(conn)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        log.warning("database connection was invalidated; retrying once")
        with engine.begin() as conn:
            return work(conn)
