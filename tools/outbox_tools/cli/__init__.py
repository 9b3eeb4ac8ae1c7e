"""`outbox`: the command line (migrate, enqueue, relay, stats, demo, operations, local).

Every command finds PostgreSQL through `DATABASE_URL` (and Redis through
`REDIS_URL`) or, when they are unset, the local services on their standard
ports; `demo` may also start embedded servers.
"""

from __future__ import annotations

from typing import Any

import click

from outbox_relay.errors import ConfigurationError, InvalidMessageError
from outbox_relay.publishers.registry import CHANNELS

from . import feedback, local, messages, operations, sam_local


def _sqlstate(exc: BaseException) -> str:
    """The SQLSTATE of a PostgreSQL error as pg8000 reports it (its first argument is
    the server's error fields; "C" is the code), else ''."""
    orig = getattr(exc, "orig", None)
    fields = orig.args[0] if orig is not None and orig.args else None
    return str(fields.get("C", "")) if isinstance(fields, dict) else ""


def _database_problem(exc: BaseException) -> str | None:
    """What a user can fix behind a database error, in one line naming DATABASE_URL (None: not theirs)."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    from outbox_relay.db import database_unreachable

    code = _sqlstate(exc)
    message = str(exc.orig.args[0].get("M", "")) if code else ""
    # PostgreSQL error codes (PostgreSQL documentation, Appendix A): 3D000 invalid_catalog_name,
    # class 28 invalid authorization, 42P01 undefined_table, 42703 undefined_column.
    if code == "3D000":
        return f"DATABASE_URL: {message}"
    if code.startswith("28"):
        return f"DATABASE_URL: PostgreSQL refused the login ({code})"
    if code in ("42P01", "42703") and "outbox" in message:
        return "DATABASE_URL: the database has no outbox schema, or an older one: run `outbox migrate`"
    if "refuses ssl" in str(exc.orig).lower():
        return "DATABASE_TLS: the PostgreSQL server does not accept TLS; set DATABASE_TLS=disable or enable TLS on it"
    if isinstance(exc, DBAPIError) and (exc.connection_invalidated or isinstance(exc, OperationalError)
                                        or "connect" in str(exc.orig).lower() or database_unreachable(exc)):
        return f"cannot reach PostgreSQL ({_reason(exc)}); check DATABASE_URL"
    return None


def _reason(exc: BaseException) -> str:
    """The driver's error class, and the system's words for the socket error under it
    (`No such file or directory` for a Unix socket path where no server listens)."""
    orig = getattr(exc, "orig", None) or exc
    cause: BaseException | None = orig
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, OSError) and cause.strerror:
        return f"{type(orig).__name__}: {cause.strerror}"
    return type(orig).__name__


class _OutboxGroup(click.Group):
    """Turns the errors a user can fix into one clear line instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        from sqlalchemy.exc import DBAPIError

        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            raise click.ClickException(f"configuration error: {exc}") from None
        except InvalidMessageError as exc:
            raise click.ClickException(f"invalid message: {exc}") from None
        except DBAPIError as exc:
            problem = _database_problem(exc)
            if problem is None:
                raise
            raise click.ClickException(problem) from None


@click.group(cls=_OutboxGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Transactional-outbox relay: PostgreSQL to Redis Streams, Amazon SES, SQS, SNS, EventBridge and Kinesis."""


for _command in (local.migrate, local.relay, operations.stats, local.demo, operations.dead, operations.redrive,
                 operations.purge, feedback.show, feedback.suppression):
    main.add_command(_command)
# One enqueue command per registered channel, under the name its spec gives.
for _spec in CHANNELS:
    main.add_command(messages.ENQUEUE_COMMANDS[_spec.enqueue_command])
main.add_command(sam_local.local_group)

