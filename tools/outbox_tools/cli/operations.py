"""`outbox stats`, `outbox dead`, `outbox redrive`, `outbox purge`: operating
the queue without SQL. Each prints a human summary by default and one JSON
document with `--json`; long operations show progress. The logic is in
`outbox_relay.operations`."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import datetime, timezone

import click

from outbox_relay.models import ErrorClass
from outbox_relay.operations.dead import discard, get_message, list_dead
from outbox_relay.operations.purge import PURGE_BATCH, count_purge
from outbox_relay.operations.purge import purge as purge_messages
from outbox_relay.operations.redrive import REDRIVE_BATCH, RedriveSelection, count_redrive
from outbox_relay.operations.redrive import redrive as redrive_messages
from outbox_relay.operations.stats import FEEDBACK_COUNTS, delivery_lag_series, queue_stats
from outbox_relay.publishers.registry import CHANNELS, Channel

from .. import lag_chart
from ..durations import format_duration, format_seconds, parse_duration
from . import common

_CHANNELS = click.Choice([spec.name for spec in CHANNELS], case_sensitive=False)
_ERROR_CLASSES = click.Choice([e.value for e in ErrorClass], case_sensitive=False)
#: Columns of `outbox stats --chart`: slices of the lag window (the chart fits 80 columns).
CHART_COLUMNS = 60
#: Longest error text `outbox dead list` prints per row.
LIST_ERROR_CHARS = 80


def _timestamp(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


# --------------------------------------------------------------------------
# outbox stats
# --------------------------------------------------------------------------

@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--lag-window", default="5m", show_default=True, metavar="DURATION",
              help="Report the delivery lag of the messages delivered within this window (90s, 5m, 1h).")
@click.option("--chart", is_flag=True,
              help="Also draw each channel's delivery lag over the window (the largest per slice) as a terminal "
                   "chart; with --json, its figures as lag_chart.")
def stats(as_json: bool, lag_window: str, chart: bool) -> None:
    """Counts per channel and status, messages due now, leased now and expired
    leases, dead in the last hour and day, the keys held back (waiting for a
    retry of their first message; behind a dead letter, which holds them under
    OUTBOX_ORDERING_ON_DEAD=block), the oldest due pending message's age, and
    the delivery lag of recent deliveries (p50, p99, max), and the latency-mode
    pollers of each channel (live now, the last window without one), the day
    partitions (open days, margin left) and the tables' sizes, all by the
    database clock. Durations are printed in one convention (12ms, 7.4s, 48s, 5m 3s)."""
    window = common.duration("--lag-window", lag_window)
    engine = common.engine()
    try:
        data = queue_stats(engine, lag_window_seconds=window)
        if chart:
            data["lag_chart"] = delivery_lag_series(engine, window_seconds=window, buckets=CHART_COLUMNS)
    finally:
        engine.dispose()
    if as_json:
        common.echo_json(data)
        return
    if not data["channels"]:
        click.echo("the outbox is empty")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"outbox (delivery lag of the last {format_seconds(window)})")
    for col in ("channel", "pending", "due now", "leased", "expired leases", "delivered", "dead",
                "dead 1h", "dead 24h", "discarded", "keys waiting retry", "keys behind dead",
                "oldest pending", "lag p50", "lag p99", "lag max"):
        table.add_column(col, justify="right" if col != "channel" else "left")
    rows = data["channels"] + ([dict(data["totals"], channel="total")] if len(data["channels"]) > 1 else [])
    for ch in rows:
        lag = ch.get("delivery_lag_ms") or {}
        table.add_row(ch["channel"], str(ch["pending"]), str(ch["due_now"]), str(ch["leased"]),
                      str(ch["expired_leases"]), str(ch["delivered"]), str(ch["dead"]),
                      str(ch["dead_last_hour"]), str(ch["dead_last_day"]), str(ch["discarded"]),
                      str(ch["keys_waiting_for_retry"]), str(ch["keys_behind_dead_letter"]),
                      format_duration(ch["oldest_pending_age_seconds"]),
                      *("-" if lag.get(k) is None else format_duration(lag[k] / 1000) for k in ("p50", "p99", "max")))
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    # Feedback is SES's alone: other channels' rows would only add zeros.
    emails = [ch for ch in data["channels"] if ch["channel"] == Channel.SES.value]
    if any(ch[k] for ch in emails for k in FEEDBACK_COUNTS):
        email = Table(title="email feedback (messages)")
        for col in ("channel", "delivered", *FEEDBACK_COUNTS):
            email.add_column(col, justify="right" if col != "channel" else "left")
        for ch in emails:
            email.add_row(ch["channel"], str(ch["delivered"]), *(str(ch[k]) for k in FEEDBACK_COUNTS))
        console.print(email)
    parts = data["partitions"]
    click.echo(f"day partitions: {parts['days']} open ({parts['oldest_day']} to {parts['newest_day']}), "
               f"margin {parts['margin_days']} days; size " + ", ".join(
                   f"{name} {size / 2**20:.1f} MiB" for name, size in parts["bytes"].items()))
    if data["pollers"]:
        pollers = Table(title="latency-mode pollers")
        for col in ("channel", "live now", "last window without a poller", "ended"):
            pollers.add_column(col, justify="right" if col != "channel" else "left")
        for p in data["pollers"]:
            gap = p["last_gap_seconds"]
            pollers.add_row(p["channel"], str(p["live"]), "none in the last week" if gap is None
                            else format_duration(gap),
                            "" if gap is None else f"{format_duration(p['last_gap_ended_seconds_ago'])} ago")
        console.print(pollers)
    for ch in data.get("lag_chart", {}).get("channels", []):
        click.echo()
        click.echo("\n".join(lag_chart.render(ch["channel"], ch["max_ms"], ch["delivered"], window_seconds=window)))
    if chart and not data["lag_chart"]["channels"]:
        click.echo(f"\nno delivery in the last {format_seconds(window)}: no lag to chart")


def _message_ids(values: tuple[str, ...], hint: str) -> list[uuid.UUID]:
    """The message ids given as arguments, each once; the first that is not a UUID is refused by name."""
    ids = []
    for raw in values:
        try:
            ids.append(uuid.UUID(raw))
        except ValueError:
            raise click.BadParameter(f"{raw!r} is not a message id (a UUID)", param_hint=hint) from None
    return list(dict.fromkeys(ids))


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
    engine = common.engine()
    try:
        rows = list_dead(engine, channel=Channel(channel) if channel else None, error_class=error_class,
                             since_seconds=since_seconds, since=since_time, limit=limit)
    finally:
        engine.dispose()
    if as_json:
        common.echo_json({"dead": [r.as_dict() for r in rows], "count": len(rows), "limit": limit})
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
        if len(error) > LIST_ERROR_CHARS:
            error = error[: LIST_ERROR_CHARS - 1] + "…"
        table.add_row(str(r.message_id), r.channel, r.type, f"{r.attempts}/{r.max_attempts or 'default'}",
                      r.last_error_class or "-", _timestamp(r.dead_at),
                      format_seconds(r.dead_for_seconds) if r.dead_for_seconds is not None else "-", error)
    Console(width=200 if not common.is_terminal() else None).print(table)


def _since(value: str | None) -> tuple[float | None, datetime | None]:
    if value is None:
        return None, None
    try:
        return parse_duration(value), None
    except ValueError as exc:
        if " is not a duration" not in str(exc):  # a duration, but too long or zero
            raise click.BadParameter(str(exc), param_hint="--since") from None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value[:40]!r} is neither a duration (7d, 12h, 30m, 90s, P1D) nor an "
                                 "ISO 8601 time", param_hint="--since") from None
    if when.tzinfo is None:
        raise click.BadParameter("an ISO 8601 time needs a zone, e.g. 2026-11-29T18:00:00Z", param_hint="--since")
    try:
        when.astimezone(timezone.utc)  # a time near year 1 or 9999 may not exist in UTC
    except OverflowError:
        raise click.BadParameter("the time is outside the years 1 to 9999 in UTC", param_hint="--since") from None
    return None, when


@dead.command("show")
@click.argument("message_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def dead_show(message_id: str, as_json: bool) -> None:
    """Show one message by its message id: payload, attempts and every recorded
    error field (any status; a redriven message keeps its last error)."""
    (mid,) = _message_ids((message_id,), "MESSAGE_ID")
    engine = common.engine()
    try:
        row = get_message(engine, mid)
    finally:
        engine.dispose()
    if row is None:
        raise click.ClickException(f"no message {mid}")
    data = {
        "message_id": row.message_id, "seq": row.seq, "status": row.status.value,
        "channel": row.channel, "destination": row.destination, "type": row.type, "key": row.key,
        "attempts": row.attempts, "max_attempts": row.max_attempts,
        "last_error_class": row.last_error_class, "last_error": row.last_error,
        "created_at": row.created_at, "available_at": row.available_at, "dead_at": row.dead_at,
        "delivered_at": row.delivered_at, "delivery_ref": row.delivery_ref,
        "lease_owner": row.lease_owner, "lease_expires_at": row.lease_expires_at,
        "headers": row.headers, "payload": row.payload,
    }
    if as_json:
        common.echo_json(data)
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


@dead.command("discard")
@click.argument("message_ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def dead_discard(message_ids: tuple[str, ...], as_json: bool) -> None:
    """Give up dead letters for good, by message id: they are never delivered, are
    kept (status discarded) until the dead retention purges them, and no longer
    hold back their key under OUTBOX_ORDERING_ON_DEAD=block: its next messages go on.
    Only dead letters change."""
    ids = _message_ids(message_ids, "MESSAGE_IDS")
    engine = common.engine()
    try:
        result = discard(engine, ids)
    finally:
        engine.dispose()
    if as_json:
        common.echo_json(result.as_dict())
        return
    click.echo(f"discarded {len(result.discarded)} dead letter(s)")
    if result.not_dead:
        click.echo(f"  {len(result.not_dead)} id(s) were not dead letters (unknown, or pending, leased, "
                   "delivered, discarded) and were left alone: " + " ".join(result.not_dead))


# --------------------------------------------------------------------------
# outbox redrive
# --------------------------------------------------------------------------

@click.command()
@click.argument("message_ids", nargs=-1)
@click.option("--channel", type=_CHANNELS, default=None, help="Dead letters of this channel.")
@click.option("--error-class", type=_ERROR_CLASSES, default=None, help="Dead letters with this error class.")
@click.option("--all", "everything", is_flag=True, help="Every dead letter (takes no other selector).")
@click.option("--dry-run", is_flag=True, help="Count what would move, by channel and error class; change nothing.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=REDRIVE_BATCH, show_default=True,
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
    ids = _message_ids(message_ids, "MESSAGE_IDS")
    if everything and (ids or channel or error_class):
        raise click.UsageError("--all takes no MESSAGE_IDS, --channel or --error-class")
    try:
        selection = RedriveSelection(tuple(ids), Channel(channel) if channel else None, error_class, everything)
    except ValueError as exc:
        raise click.UsageError(f"{exc} (MESSAGE_IDS, --channel, --error-class or --all)") from None
    engine = common.engine()
    try:
        if dry_run:
            result = redrive_messages(engine, selection, dry_run=True)
        else:
            total = count_redrive(engine, selection) if common.is_terminal() and not as_json else None
            with common.Progress("redriving", total, quiet=as_json) as progress:
                result = redrive_messages(engine, selection, batch_size=batch_size, on_batch=progress.advance)
    finally:
        engine.dispose()
    if as_json:
        common.echo_json(result.as_dict())
        return
    verb = "would redrive" if dry_run else "redrove"
    click.echo(f"{verb} {result.moved} message{'s' if result.moved != 1 else ''}"
               + ("" if dry_run else f" in {result.batches} batch{'es' if result.batches != 1 else ''}"))
    for title, counts in (("by channel", result.by_channel), ("by error class", result.by_error_class)):
        if counts:
            click.echo(f"  {title}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if result.not_dead:
        click.echo(f"  {len(result.not_dead)} id(s) were not dead letters (unknown, or pending, leased, "
                   "delivered, discarded) and were left alone: " + " ".join(result.not_dead))


# --------------------------------------------------------------------------
# outbox purge
# --------------------------------------------------------------------------

@click.command()
@click.option("--delivered-older-than", "delivered_older_than", required=True, metavar="DURATION",
              help="Delete delivered messages whose delivered_at is older than this (7d, 12h, 30m, 90s, P7D).")
@click.option("--dead-older-than", "dead_older_than", default=None, metavar="DURATION",
              help="Also delete dead letters whose dead_at is older than this.")
@click.option("--batch-size", type=click.IntRange(1, 50_000), default=PURGE_BATCH, show_default=True,
              help="Rows per DELETE (each its own short transaction).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def purge(delivered_older_than: str, dead_older_than: str | None, batch_size: int, dry_run: bool,
          as_json: bool) -> None:
    """Retention: delete old delivered messages (and optionally old dead letters)
    in bounded batches, printing progress. Never one table-wide DELETE: each
    batch is a short transaction, so a relay claiming meanwhile is not held up."""
    delivered_s = common.duration("--delivered-older-than", delivered_older_than)
    dead_s = common.duration("--dead-older-than", dead_older_than)
    assert delivered_s is not None
    engine = common.engine()
    try:
        if dry_run:
            counts = count_purge(engine, delivered_older_than_seconds=delivered_s,
                                     dead_older_than_seconds=dead_s)
            if as_json:
                common.echo_json({"dry_run": True, **counts})
            else:
                click.echo(f"would purge {counts['delivered']} delivered"
                           + (f" and {counts['dead']} dead" if dead_s is not None else "") + " messages")
            return
        total = None
        if common.is_terminal() and not as_json:
            counts = count_purge(engine, delivered_older_than_seconds=delivered_s,
                                     dead_older_than_seconds=dead_s)
            total = counts["delivered"] + counts["dead"]
        with common.Progress("purging", total, quiet=as_json) as progress:
            result = purge_messages(engine, delivered_older_than_seconds=delivered_s, dead_older_than_seconds=dead_s,
                               batch_size=batch_size, on_batch=lambda kind, n: progress.advance(n, f" ({kind})"))
    finally:
        engine.dispose()
    if as_json:
        common.echo_json({"dry_run": False, **result.as_dict()})
        return
    click.echo(f"purged {result.delivered} delivered"
               + (f" and {result.dead} dead" if dead_s is not None else "")
               + f" messages in {result.batches} batch{'es' if result.batches != 1 else ''}")

