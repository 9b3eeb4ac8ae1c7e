"""What every `outbox` command shares: finding PostgreSQL, JSON output, progress."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from typing import Any, get_args

import click
from sqlalchemy import Engine, event

from outbox_relay.config import DatabaseTls
from outbox_relay.errors import ConfigurationError
from outbox_relay.urls import parse_database_url

from ..durations import parse_duration
from ..servers import LOCAL_PG_URL


def database_url() -> str:
    """DATABASE_URL with the pg8000 driver, by the relay's rule (`parse_database_url`),
    else the local service."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        return LOCAL_PG_URL
    try:
        return parse_database_url(url).render_as_string(hide_password=False)
    except ValueError as exc:
        raise ConfigurationError("DATABASE_URL", str(exc)) from None


def engine() -> Engine:
    """An engine without a pool (one command, a few statements), over TLS as
    DATABASE_TLS and DATABASE_CA_BUNDLE say, with the relay's transactions
    (`create_outbox_engine`: it works through a transaction pooler)."""
    from sqlalchemy.pool import NullPool

    from outbox_relay.db import create_outbox_engine, server_error_behind_a_closed_socket, tls_context

    kw: dict[str, Any] = {"poolclass": NullPool}
    tls = os.environ.get("DATABASE_TLS") or "disable"
    if tls not in get_args(DatabaseTls):
        raise ConfigurationError("DATABASE_TLS", f"must be {', '.join(get_args(DatabaseTls))}")
    context = tls_context(tls, os.environ.get("DATABASE_CA_BUNDLE") or None)
    # pg8000 takes ssl_context=None as "try TLS unverified, else clear text": disable means clear text.
    kw["connect_args"] = {"ssl_context": context if context is not None else False}
    engine = create_outbox_engine(database_url(), **kw)
    event.listen(engine, "handle_error", server_error_behind_a_closed_socket)
    return engine



def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=_json_default, ensure_ascii=False))


def is_terminal() -> bool:
    return sys.stdout.isatty()


def duration(param_hint: str, value: str | None) -> float | None:
    """A duration option in seconds, or a usage error naming the option."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=param_hint) from None


class Progress:
    """A rich progress bar on a terminal; elsewhere a plain line at most once a
    second (nothing at all with --json, so the output stays one document)."""

    def __init__(self, description: str, total: int | None, *, quiet: bool) -> None:
        self.description = description
        self.total = total
        self.quiet = quiet
        self.done = 0
        self._bar: Any = None
        self._task: Any = None
        self._last_line = 0.0

    def __enter__(self) -> "Progress":
        self._last_line = time.monotonic()
        if not self.quiet and is_terminal():
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total)
        return self

    def advance(self, n: int, note: str = "") -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, advance=n)
        elif not self.quiet and time.monotonic() - self._last_line >= 1.0:
            self._last_line = time.monotonic()
            of = f" of {self.total}" if self.total is not None else ""
            click.echo(f"{self.description}: {self.done}{of}{note}")

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
