"""`outbox`: the command line (migrate, enqueue, relay, stats, demo, operations).

Every command finds PostgreSQL through `DATABASE_URL` (and Redis through
`REDIS_URL`) or, when they are unset, the local services on their standard
ports; `demo` may also start embedded servers.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from .errors import ConfigurationError, InvalidMessageError


def _database_url() -> str:
    """DATABASE_URL with the pg8000 driver (`postgresql://` is accepted), else the local service."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        from .local import LOCAL_PG_URL

        return LOCAL_PG_URL
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError("DATABASE_URL", "not a SQLAlchemy URL (postgresql+pg8000://user:pass@host/db)") \
            from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+pg8000")
    if parsed.drivername != "postgresql+pg8000":
        raise ConfigurationError("DATABASE_URL", f"driver must be postgresql+pg8000, not {parsed.drivername}")
    return parsed.render_as_string(hide_password=False)


def _engine(autocommit: bool = False):
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    kw: dict[str, Any] = {"poolclass": NullPool}
    if autocommit:
        kw["isolation_level"] = "AUTOCOMMIT"
    return create_engine(_database_url(), **kw)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str, ensure_ascii=False))


class _OutboxGroup(click.Group):
    """Turns the errors a user can fix into one clear line instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        from sqlalchemy.exc import DBAPIError, OperationalError

        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            raise click.ClickException(f"configuration error: {exc}") from None
        except InvalidMessageError as exc:
            raise click.ClickException(f"invalid message: {exc}") from None
        except (OperationalError, DBAPIError) as exc:
            if exc.connection_invalidated or isinstance(exc, OperationalError) or "connect" in str(exc.orig).lower():
                raise click.ClickException(
                    f"cannot reach PostgreSQL ({type(exc.orig).__name__}); check DATABASE_URL") from None
            raise


@click.group(cls=_OutboxGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Transactional-outbox relay: PostgreSQL to Redis Streams and Amazon SES."""


@main.command()
def migrate() -> None:
    """Create or upgrade the outbox schema (Alembic; running it twice is harmless)."""
    from .migrate import upgrade

    engine = _engine()
    upgrade(engine)
    engine.dispose()
    click.echo("schema is at the latest revision")


@main.command("enqueue-event")
@click.option("--stream", required=True, help="Redis stream key.")
@click.option("--type", "type_", required=True, help="Event type, e.g. order.placed.")
@click.option("--payload", required=True, help="JSON text, or @file.json to read a file.")
@click.option("--key", default=None, help="Ordering/partition key.")
@click.option("--message-id", default=None, help="Idempotency key (UUID).")
@click.option("--max-attempts", type=int, default=None)
def enqueue_event_cmd(stream: str, type_: str, payload: str, key: str | None, message_id: str | None,
                      max_attempts: int | None) -> None:
    """Enqueue one domain event (in its own transaction) and print its message id."""
    from .producer import enqueue_event

    try:
        text = Path(payload[1:]).read_text(encoding="utf-8") if payload.startswith("@") else payload
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {payload[1:]} ({exc.__class__.__name__})",
                                 param_hint="--payload") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint="--payload") from None
    engine = _engine()
    try:
        with engine.begin() as conn:
            mid = enqueue_event(conn, stream=stream, type=type_, payload=value, key=key,
                                message_id=message_id, max_attempts=max_attempts)
    except InvalidMessageError as exc:
        raise click.UsageError(f"invalid message: {exc}") from None
    finally:
        engine.dispose()
    click.echo(str(mid))


@main.command()
@click.option("--event", "event_path", type=click.Path(exists=True, dir_okay=False), required=True,
              help="Sample event, e.g. events/relay-redis-scheduler.json.")
@click.option("--timeout", type=float, default=None,
              help="Seconds the fake context starts with [default: OUTBOX_FUNCTION_TIMEOUT_SECONDS].")
@click.option("--function", "function", default="relay", show_default=True,
              help="Which function under functions/ to invoke.")
def relay(event_path: str, timeout: float | None, function: str) -> None:
    """Invoke the real Lambda handler once, in-process, and print its summary.

    Standard output carries only the summary (JSON); the handler's logs and
    EMF metrics, which Lambda would send to CloudWatch, go to standard error.
    """
    from .config import get_settings
    from .local import LocalContext, environment, load_handler

    event = json.loads(Path(event_path).read_text(encoding="utf-8"))
    defaults = {}
    if not os.environ.get("DATABASE_URL") and not os.environ.get("DATABASE_SECRET_ARN"):
        defaults["DATABASE_URL"] = _database_url()
    if not os.environ.get("REDIS_URL") and not os.environ.get("REDIS_URL_SECRET_ARN"):
        from .local import LOCAL_REDIS_URL

        defaults["REDIS_URL"] = LOCAL_REDIS_URL
    defaults.setdefault("POWERTOOLS_TRACE_DISABLED", os.environ.get("POWERTOOLS_TRACE_DISABLED", "true"))
    with environment(**defaults):
        try:
            settings = get_settings()
        except ConfigurationError as exc:
            raise click.ClickException(f"configuration error: {exc}") from None
        handler = load_handler(function)
        context = LocalContext(timeout if timeout is not None else settings.function_timeout_seconds)
        with _telemetry_to_stderr():
            result = handler(event, context)
    _echo_json(result)


@contextlib.contextmanager
def _telemetry_to_stderr():
    """Send the Powertools logger's lines and EMF prints to standard error for the block."""
    from .observability import logger

    handler = logger.registered_handler
    previous = handler.setStream(sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        handler.setStream(previous)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def stats(as_json: bool) -> None:
    """Counts per channel and status, messages due now, leased now and expired
    leases, dead in the last hour and day, and the oldest due pending message's
    age (seconds, by the database clock)."""
    from .ops import format_seconds, queue_stats

    engine = _engine()
    try:
        data = queue_stats(engine)
    finally:
        engine.dispose()
    if as_json:
        _echo_json(data)
        return
    if not data["channels"]:
        click.echo("the outbox is empty")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="outbox")
    for col in ("channel", "pending", "due now", "leased", "expired leases", "delivered", "dead",
                "dead 1h", "dead 24h", "oldest pending"):
        table.add_column(col, justify="right" if col != "channel" else "left")
    rows = data["channels"] + ([dict(data["totals"], channel="total")] if len(data["channels"]) > 1 else [])
    for ch in rows:
        table.add_row(ch["channel"], str(ch["pending"]), str(ch["due_now"]), str(ch["leased"]),
                      str(ch["expired_leases"]), str(ch["delivered"]), str(ch["dead"]),
                      str(ch["dead_last_hour"]), str(ch["dead_last_day"]),
                      format_seconds(ch["oldest_pending_age_seconds"]))
    Console(width=None if sys.stdout.isatty() else 200).print(table)


@main.command()
@click.option("--keep", is_flag=True, help="Keep the demo's database and streams afterwards.")
@click.option("--database-name", default="outbox_demo", show_default=True,
              help="The demo's own database (dropped and created again, dropped after).")
@click.option("--prefix", default="demo.", show_default=True,
              help="Redis key prefix of the demo's streams (keys under it are deleted).")
def demo(keep: bool, database_name: str, prefix: str) -> None:
    """Run the whole flow on defaults: migrate, a sample app writing orders and
    their events in one transaction, relay invocations until drained, a report."""
    from .demo import check_names, run_demo

    try:
        check_names(database_name, prefix)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(run_demo(keep=keep, echo=click.echo, database_name=database_name, prefix=prefix))


def _register_commands() -> None:
    from .email_cli import enqueue_email
    from .ops_cli import dead, purge, redrive

    for command in (enqueue_email, dead, redrive, purge):
        main.add_command(command)


_register_commands()


if __name__ == "__main__":
    main()
