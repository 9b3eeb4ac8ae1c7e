"""`outbox dead`, `outbox redrive`, `outbox purge`: operating the queue without SQL.

`cli.py` attaches the command objects `dead`, `redrive` and `purge` to the
`outbox` group. Each prints a human summary by default and one JSON document
with `--json`; long operations show a progress bar (rich) when standard
output is a terminal, and a progress line at most once a second otherwise.
The logic is in `ops.py`.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import datetime
from typing import Any

import click

from . import ops
from .models import Channel, ErrorClass

_CHANNELS = click.Choice([c.value for c in Channel], case_sensitive=False)
_ERROR_CLASSES = click.Choice([e.value for e in ErrorClass], case_sensitive=False)


def _engine(autocommit: bool = True):
    from .cli import _engine as make

    return make(autocommit=autocommit)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=_json_default, ensure_ascii=False))


def _is_terminal() -> bool:
    return sys.stdout.isatty()


def _duration(param_hint: str, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return ops.parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=param_hint) from None


def _timestamp(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


class _Progress:
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

    def __enter__(self) -> "_Progress":
        self._last_line = time.monotonic()
        if not self.quiet and _is_terminal():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn())
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


# --------------------------------------------------------------------------
# outbox dead list / show
# --------------------------------------------------------------------------

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def dead() -> None:
    """Inspect dead letters: messages the relay gave up on (see `outbox redrive`)."""


@dead.command("list")
@click.option("--channel", type=_CHANNELS, default=None, help="Only this channel.")
@click.option("--since", default=None, metavar="DURATION|TIME",
              help="Only those dead within DURATION (7d, 12h, 30m, 90s, P1D) or since an ISO 8601 "
                   "time with a zone (2026-11-29T18:00:00Z).")
@click.option("--error-class", type=_ERROR_CLASSES, default=None, help="Only this error class.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="At most this many, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def dead_list(channel: str | None, since: str | None, error_class: str | None, limit: int, as_json: bool) -> None:
    """List dead letters, newest first (no payloads; see `outbox dead show ID`)."""
    since_seconds, since_time = _since(since)
    engine = _engine()
    try:
        rows = ops.list_dead(engine, channel=Channel(channel) if channel else None, error_class=error_class,
                             since_seconds=since_seconds, since=since_time, limit=limit)
    finally:
        engine.dispose()
    if as_json:
        _echo_json({"dead": [r.as_dict() for r in rows], "count": len(rows), "limit": limit})
        return
    if not rows:
        click.echo("no dead letters match")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"dead letters ({len(rows)}{', limit reached' if len(rows) == limit else ''})")
    for col in ("message id", "channel", "type", "attempts", "error class", "dead at", "dead for", "error"):
        table.add_column(col, justify="right" if col == "attempts" else "left", overflow="fold")
    for r in rows:
        error = (r.last_error or "")
        if len(error) > ops.LIST_ERROR_CHARS:
            error = error[: ops.LIST_ERROR_CHARS - 1] + "…"
        table.add_row(str(r.message_id), r.channel, r.type, f"{r.attempts}/{r.max_attempts or 'default'}",
                      r.last_error_class or "-", _timestamp(r.dead_at),
                      ops.format_seconds(r.dead_for_seconds) if r.dead_for_seconds is not None else "-", error)
    Console(width=200 if not _is_terminal() else None).print(table)


def _since(value: str | None) -> tuple[float | None, datetime | None]:
    if value is None:
        return None, None
    try:
        return ops.parse_duration(value), None
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a duration (7d, 12h, 30m, 90s, P1D) nor an "
                                 "ISO 8601 time", param_hint="--since") from None
    if when.tzinfo is None:
        raise click.BadParameter("an ISO 8601 time needs a zone, e.g. 2026-11-29T18:00:00Z", param_hint="--since")
    return None, when


@dead.command("show")
@click.argument("message_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def dead_show(message_id: str, as_json: bool) -> None:
    """Show one message by its message id: payload, attempts and every recorded
    error field (any status; a redriven message keeps its last error)."""
    try:
        mid = uuid.UUID(message_id)
    except ValueError:
        raise click.BadParameter(f"{message_id!r} is not a message id (a UUID)", param_hint="MESSAGE_ID") from None
    engine = _engine()
    try:
        row = ops.get_message(engine, mid)
    finally:
        engine.dispose()
    if row is None:
        raise click.ClickException(f"no message {mid}")
    data = {
        "message_id": row.message_id, "seq": row.seq, "status": row.status.value,
        "channel": row.channel.value, "destination": row.destination, "type": row.type, "key": row.key,
        "attempts": row.attempts, "max_attempts": row.max_attempts,
        "last_error_class": row.last_error_class, "last_error": row.last_error,
        "created_at": row.created_at, "available_at": row.available_at, "dead_at": row.dead_at,
        "delivered_at": row.delivered_at, "delivery_ref": row.delivery_ref,
        "lease_owner": row.lease_owner, "lease_expires_at": row.lease_expires_at,
        "headers": row.headers, "payload": row.payload,
    }
    if as_json:
        _echo_json(data)
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        if key in ("payload", "headers", "last_error"):
            continue
        click.echo(f"{key.ljust(width)}  {value if value is not None else '-'}")
    click.echo(f"{'last_error'.ljust(width)}  {row.last_error if row.last_error is not None else '-'}")
    if row.headers:
        click.echo("headers:")
        click.echo(json.dumps(row.headers, indent=2, ensure_ascii=False))
    click.echo("payload:")
    click.echo(json.dumps(row.payload, indent=2, ensure_ascii=False, default=str))


# --------------------------------------------------------------------------
# outbox redrive
# --------------------------------------------------------------------------

@click.command()
@click.argument("message_ids", nargs=-1)
@click.option("--channel", type=_CHANNELS, default=None, help="Dead letters of this channel.")
@click.option("--error-class", type=_ERROR_CLASSES, default=None, help="Dead letters with this error class.")
@click.option("--all", "everything", is_flag=True, help="Every dead letter (takes no other selector).")
@click.option("--dry-run", is_flag=True, help="Count what would move, by channel and error class; change nothing.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=ops.REDRIVE_BATCH, show_default=True,
              help="Messages per statement (each its own short transaction).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def redrive(message_ids: tuple[str, ...], channel: str | None, error_class: str | None, everything: bool,
            dry_run: bool, batch_size: int, as_json: bool) -> None:
    """Move dead letters back to pending: attempts reset to 0, due now.

    Select by MESSAGE_IDS, --channel, --error-class (combined: all must match),
    or --all. Only dead letters move: a message that is pending, being relayed
    or delivered is never touched, so a redrive running beside the relay cannot
    cause a double delivery. The last error is kept for `outbox dead show`.
    """
    ids = []
    for raw in message_ids:
        try:
            ids.append(uuid.UUID(raw))
        except ValueError:
            raise click.BadParameter(f"{raw!r} is not a message id (a UUID)", param_hint="MESSAGE_IDS") from None
    try:
        selection = ops.RedriveSelection(tuple(ids), Channel(channel) if channel else None, error_class, everything)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    engine = _engine()
    try:
        if dry_run:
            result = ops.redrive(engine, selection, dry_run=True)
        else:
            total = ops.count_redrive(engine, selection) if _is_terminal() and not as_json else None
            with _Progress("redriving", total, quiet=as_json) as progress:
                result = ops.redrive(engine, selection, batch_size=batch_size, on_batch=progress.advance)
    finally:
        engine.dispose()
    if as_json:
        _echo_json(result.as_dict())
        return
    verb = "would redrive" if dry_run else "redrove"
    click.echo(f"{verb} {result.moved} message{'s' if result.moved != 1 else ''}"
               + ("" if dry_run else f" in {result.batches} batch{'es' if result.batches != 1 else ''}"))
    for title, counts in (("by channel", result.by_channel), ("by error class", result.by_error_class)):
        if counts:
            click.echo(f"  {title}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if result.not_dead:
        click.echo(f"  {len(result.not_dead)} id(s) were not dead letters (unknown, or pending, leased, "
                   "delivered) and were left alone: " + " ".join(result.not_dead))


# --------------------------------------------------------------------------
# outbox purge
# --------------------------------------------------------------------------

@click.command()
@click.option("--delivered-older-than", "delivered_older_than", required=True, metavar="DURATION",
              help="Delete delivered messages whose delivered_at is older than this (7d, 12h, 30m, 90s, P7D).")
@click.option("--dead-older-than", "dead_older_than", default=None, metavar="DURATION",
              help="Also delete dead letters whose dead_at is older than this.")
@click.option("--batch-size", type=click.IntRange(1, 50_000), default=ops.PURGE_BATCH, show_default=True,
              help="Rows per DELETE (each its own short transaction).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def purge(delivered_older_than: str, dead_older_than: str | None, batch_size: int, dry_run: bool,
          as_json: bool) -> None:
    """Retention: delete old delivered messages (and optionally old dead letters)
    in bounded batches, printing progress. Never one table-wide DELETE: each
    batch is a short transaction, so a relay claiming meanwhile is not held up."""
    delivered_s = _duration("--delivered-older-than", delivered_older_than)
    dead_s = _duration("--dead-older-than", dead_older_than)
    assert delivered_s is not None
    engine = _engine()
    try:
        if dry_run:
            counts = ops.count_purge(engine, delivered_older_than_seconds=delivered_s,
                                     dead_older_than_seconds=dead_s)
            if as_json:
                _echo_json({"dry_run": True, **counts})
            else:
                click.echo(f"would purge {counts['delivered']} delivered"
                           + (f" and {counts['dead']} dead" if dead_s is not None else "") + " messages")
            return
        total = None
        if _is_terminal() and not as_json:
            counts = ops.count_purge(engine, delivered_older_than_seconds=delivered_s,
                                     dead_older_than_seconds=dead_s)
            total = counts["delivered"] + counts["dead"]
        with _Progress("purging", total, quiet=as_json) as progress:
            result = ops.purge(engine, delivered_older_than_seconds=delivered_s, dead_older_than_seconds=dead_s,
                               batch_size=batch_size, on_batch=lambda kind, n: progress.advance(n, f" ({kind})"))
    finally:
        engine.dispose()
    if as_json:
        _echo_json({"dry_run": False, **result.as_dict()})
        return
    click.echo(f"purged {result.delivered} delivered"
               + (f" and {result.dead} dead" if dead_s is not None else "")
               + f" messages in {result.batches} batch{'es' if result.batches != 1 else ''}")

