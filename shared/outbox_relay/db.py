"""The engine, made for Lambda: a small pool per container; each unit of work one short transaction
(a transaction pooler keeps it on one server connection); no pre-ping (a dead connection is
retried once)."""

from __future__ import annotations

import functools
import random
import socket
import ssl
import time
from typing import Any, Callable, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.pg8000 import PGDialect_pg8000
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from .config import Settings
from .errors import ConfigurationError
from .observability import logger as log
from .urls import parse_database_url

T = TypeVar("T")

SECRET_MAX_AGE_SECONDS = 300


class OutboxPg8000Dialect(PGDialect_pg8000):
    """pg8000's dialect with COMMIT as a simple query: one round trip, where `commit()` takes three."""

    supports_statement_cache = True

    def do_commit(self, dbapi_connection: Any) -> None:
        if dbapi_connection.autocommit:
            return  # every statement committed itself
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("COMMIT")  # no parameters: pg8000 sends a simple query
        finally:
            cursor.close()


DRIVERNAME = "postgresql+outbox_pg8000"
registry.register("postgresql.outbox_pg8000", __name__, "OutboxPg8000Dialect")


def create_outbox_engine(url: URL | str, **kwargs: Any) -> Engine:
    """Never autocommit; new connections checked for a pooler in statement mode."""
    if kwargs.get("isolation_level") == "AUTOCOMMIT":
        raise ValueError("the outbox engine runs every unit of work in a transaction")
    engine = create_engine(make_url(url).set(drivername=DRIVERNAME), **kwargs)
    # Before SQLAlchemy's own first queries, which a statement-mode pooler would cut.
    event.listen(engine, "connect", _refuse_statement_pooling, insert=True)
    return engine


def _refuse_statement_pooling(dbapi_connection: Any, connection_record: Any) -> None:
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


def read_secret(variable: str, arn: str, *, transform: str | None = None, force_fetch: bool = False) -> Any:
    """Secret `arn` through Powertools (cached); unreadable, a `ConfigurationError` naming `variable`."""
    from aws_lambda_powertools.utilities import parameters

    try:
        value = parameters.get_secret(arn, transform=transform, max_age=SECRET_MAX_AGE_SECONDS, force_fetch=force_fetch)
    except Exception as exc:
        raise ConfigurationError(variable, f"cannot read the secret ({type(exc).__name__})") from exc
    return value.decode() if isinstance(value, bytes) else value


def _secret_url(settings: Settings, force_fetch: bool = False) -> URL:
    assert settings.database_secret_arn is not None
    secret = read_secret("DATABASE_SECRET_ARN", settings.database_secret_arn, transform="json", force_fetch=force_fetch)
    try:
        return URL.create("postgresql+pg8000", username=secret["username"], password=secret.get("password"),
                          host=secret["host"], port=int(secret.get("port", 5432)),
                          database=secret.get("dbname") or secret.get("database") or "postgres")
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError("DATABASE_SECRET_ARN",
                                 "secret must be JSON with host, port, username, password, dbname") from exc


def base_url(settings: Settings) -> URL:
    if settings.database_url:
        try:
            return parse_database_url(settings.database_url)
        except ValueError as exc:
            raise ConfigurationError("DATABASE_URL", str(exc)) from None
    return _secret_url(settings)


def tls_context(mode: str, ca_bundle: str | None = None) -> ssl.SSLContext | None:
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
    """Valid 15 minutes, presigned locally: one per new connection."""
    return _rds_client(region).generate_db_auth_token(DBHostname=host, Port=port, DBUsername=user)


def create_relay_engine(settings: Settings, *, token_provider: Callable[[str, int, str], str] | None = None) -> Engine:
    """`token_provider(host, port, user)` replaces IAM token generation (tests)."""
    if settings.database_iam_auth and settings.database_tls == "disable":
        raise ConfigurationError("DATABASE_TLS", "DATABASE_IAM_AUTH=true needs TLS: set require or verify-full")
    url = base_url(settings)
    connect_args: dict[str, Any] = {"timeout": 10, "application_name": "outbox-relay"}
    # pg8000 takes None as "try TLS unverified, else clear text"; False is no TLS.
    ctx = tls_context(settings.database_tls, settings.database_ca_bundle)
    connect_args["ssl_context"] = ctx if ctx is not None else False
    engine = create_outbox_engine(url, pool_size=settings.database_pool_size, max_overflow=2, pool_recycle=900,
                                  pool_pre_ping=False, connect_args=connect_args)
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
            # Refused: the secret may have been rotated since it was cached; fetch it once more.
            cparams.update(_cparams(_secret_url(settings)))
            try:
                return dialect.dbapi.connect(*cargs, **cparams)
            except dialect.dbapi.DatabaseError as exc:
                detail = exc.args[0] if exc.args else None
                if not (isinstance(detail, dict) and str(detail.get("C", "")).startswith("28")):  # not a login refusal
                    raise
                log.info("database refused the cached credentials; fetching the secret again")
                cparams.update(_cparams(_secret_url(settings, force_fetch=True)))
                return dialect.dbapi.connect(*cargs, **cparams)

    return engine


def _socket_errors_are_disconnects(ctx: Any) -> Any:
    """A raw socket error is a disconnect, so `run_with_retry` runs the work again."""
    original = ctx.original_exception
    if isinstance(original, OSError) and ctx.sqlalchemy_exception is None:
        ctx.is_disconnect = True
        return OperationalError(ctx.statement, ctx.parameters, original, connection_invalidated=True)
    return None


def server_error_behind_a_closed_socket(ctx: Any) -> Any:
    """The server's refusal of a new connection instead of the broken pipe pg8000 raises after
    it (its Terminate on a Unix socket the server closed), which hides it in the chain."""
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
    """TCP_NODELAY, as libpq sets: pg8000 writes a large Bind in parts, and its tail would
    wait for the server's delayed ACK. pg8000 keeps the socket in `_usock`."""
    sock = getattr(dbapi_connection, "_usock", None)
    if sock is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        log.warning("could not set TCP_NODELAY on the database connection", extra={"error_class": type(exc).__name__})


def _cparams(url: URL) -> dict[str, Any]:
    return {"user": url.username, "password": url.password, "host": url.host, "port": url.port or 5432,
            "database": url.database}


#: SQLSTATEs of a server that cannot serve now: connection (08), shutdown or restart
#: (57P0x), too many connections, read-only (a demoted writer during a failover).
_UNREACHABLE_STATES = ("08", "57P01", "57P02", "57P03", "53300", "25006")
#: PostgreSQL unreachable: the longest wait between two tries, seconds.
UNREACHABLE_MAX_WAIT = 0.5


def database_unreachable(exc: BaseException) -> bool:
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
        # Its other interface errors (TLS refused, an authentication method it lacks) are configuration.
        return not any(word in str(exc).lower() for word in ("ssl", "authentication", "password"))
    if isinstance(exc, pg8000.exceptions.DatabaseError) and exc.args and isinstance(exc.args[0], dict):
        return str(exc.args[0].get("C", "")).startswith(_UNREACHABLE_STATES)
    return False


def retry_while_unreachable(work: Callable[[], T], *, time_left: Callable[[], float], reserve: float = 0.0,
                            sleep: Callable[[float], Any] = time.sleep) -> T:
    """Again while PostgreSQL is unreachable and more than `reserve` of `time_left()` would remain."""
    wait = 0.05
    while True:
        try:
            return work()
        except Exception as exc:
            if not database_unreachable(exc) or time_left() - wait <= reserve:
                raise
        sleep(wait)
        wait = min(wait * 2, UNREACHABLE_MAX_WAIT)


#: Attempts of a transaction whose statement met a row another one moved across partitions, and
#: the bound of the first jittered wait before the next (doubling): the writers that moved them commit within
#: milliseconds, and an attempt at once can meet the next ones (several pollers recording at once).
MOVED_ROW_ATTEMPTS, MOVED_ROW_WAIT_SECONDS = 8, 0.02


def moved_row(exc: DBAPIError) -> bool:
    """A row this statement was to lock or change was delivered (moved to another partition) by
    a transaction that committed meanwhile: SQLSTATE 40001, whatever SKIP LOCKED says."""
    detail = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
    return (isinstance(detail, dict) and detail.get("C") == "40001"
            and "moved to another partition" in str(detail.get("M", "")))


def run_with_retry(engine: Engine, work: Callable[[Any], T], *, sleep: Callable[[float], Any] = time.sleep) -> T:
    """In one transaction, once more when the pooled connection was dead, again when a row it
    touched moved partition meanwhile (read anew, it is no longer there); only work safe to repeat."""
    for attempt in range(1, MOVED_ROW_ATTEMPTS + 1):
        try:
            with engine.begin() as conn:
                return work(conn)
        except DBAPIError as exc:
            if exc.connection_invalidated:
                log.warning("database connection was invalidated; retrying once")
                with engine.begin() as conn:
                    return work(conn)
            if not moved_row(exc) or attempt == MOVED_ROW_ATTEMPTS:
                raise
            sleep(random.uniform(0, MOVED_ROW_WAIT_SECONDS * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")


#: pg8000 rescans each statement in Python on every execute; for the `format` style the result
#: depends on the text only, so it is done once per text, in a cache that empties when full.
_PARAMSTYLE_CACHE_SIZE = 64
_PARAMSTYLE_CACHE_MAX_CHARS = 16_000


def memoize_paramstyle_conversion() -> None:
    """Idempotent; a no-op if pg8000 moves its conversion."""
    import pg8000.legacy as legacy

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
