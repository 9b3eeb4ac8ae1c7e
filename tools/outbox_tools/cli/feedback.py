"""`outbox show ID` (a message's story: state, attempts, last error, where it
landed, its history of attempts and operators' actions, every SES event recorded for it) and `outbox suppression list|add|remove`.

Addresses are hashed with the key the relay and the feedback function use
(OUTBOX_SES_ADDRESS_KEY, or the secret of OUTBOX_SES_ADDRESS_KEY_SECRET_ARN);
no command prints an address or a payload."""

from __future__ import annotations

import os
from types import SimpleNamespace

import click

from outbox_relay.feedback.hashing import AddressHasher, address_hasher
from outbox_relay.feedback.store import FeedbackStore, SuppressionList
from outbox_relay.operations.dead import get_message, history_of
from outbox_relay.publishers.ses.addresses import address_of, parse_address

from . import common

#: Longest operator note kept with a suppressed address, characters.
MAX_NOTE_CHARS = 200


def _hasher() -> AddressHasher:
    return address_hasher(SimpleNamespace(
        ses_address_key=os.environ.get("OUTBOX_SES_ADDRESS_KEY") or None,
        ses_address_key_secret_arn=os.environ.get("OUTBOX_SES_ADDRESS_KEY_SECRET_ARN") or None))


def _address(value: str) -> str:
    try:
        return address_of(parse_address(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from None


@click.command()
@click.argument("message_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(message_id: str, as_json: bool) -> None:
    """A message's whole story by its message id: status, attempts, the last error
    and its class, the delivery reference (an email's SES message id), its
    history (each attempt's outcome and error, each operator's redrive or
    discard), and every SES event recorded for it (type, time, subtype), oldest
    first. No payload."""
    import uuid

    try:
        mid = uuid.UUID(message_id)
    except ValueError:
        raise click.BadParameter(f"{message_id!r} is not a message id (a UUID)", param_hint="MESSAGE_ID") from None
    engine = common.engine()
    try:
        row = get_message(engine, mid)
        history = history_of(engine, row) if row is not None else []
        events = FeedbackStore(engine).events_of(str(mid)) if row is not None else []
    finally:
        engine.dispose()
    if row is None:
        raise click.ClickException(f"no message {mid}")
    data = {
        "message_id": row.message_id, "channel": row.channel, "destination": row.destination,
        "type": row.type, "key": row.key, "status": row.status.value, "attempts": row.attempts,
        "max_attempts": row.max_attempts, "last_error_class": row.last_error_class, "last_error": row.last_error,
        "created_at": row.created_at, "available_at": row.available_at, "delivered_at": row.delivered_at,
        "dead_at": row.dead_at, "delivery_ref": row.delivery_ref,
        "history": [line.as_dict() for line in history],
        "events": [{k: e[k] for k in ("event_type", "event_at", "subtype", "ses_message_id", "recipients",
                                      "received_at")} for e in events],
    }
    if as_json:
        common.echo_json(data)
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        if key not in ("history", "events"):
            click.echo(f"{key.ljust(width)}  {value if value is not None else '-'}")
    _echo_history(history, width)
    if not events:
        click.echo("events" + " " * (width - 4) + "none recorded")
        return
    click.echo("events:")
    for e in events:
        click.echo(f"  {_when(e['event_at'])}  {e['event_type']:<17} "
                   f"{e['subtype'] or '':<32} {e['recipients']} recipient(s)  ses {e['ses_message_id']}")


def _when(at) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _echo_history(history, width: int) -> None:
    if not history:
        click.echo("history" + " " * (width - 5) + "none recorded")
        return
    click.echo("history:")
    for line in history:
        attempt = f"#{line.attempt}" if line.attempt is not None else "-"
        parts = [f"  {_when(line.at)}  {attempt:<4} {line.event:<13}"]
        if line.error_class:
            parts.append(f"[{line.error_class}] {line.error or ''}".rstrip())
        if line.ref:
            parts.append(f"ref {line.ref}")
        if line.next_at:
            parts.append(f"due again {_when(line.next_at)}")
        if line.actor:
            parts.append(f"by {line.actor}")
        click.echo("  ".join(parts))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def suppression() -> None:
    """The suppression list: addresses (kept as keyed hashes) the SES relay does
    not send to; a message to one is dead-lettered as suppressed. Permanent
    bounces and complaints add to it when feedback is configured."""


@suppression.command("list")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True,
              help="At most this many entries, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def suppression_list(limit: int, as_json: bool) -> None:
    """The list, newest first: each address's hash, why it is there, and since when."""
    engine = common.engine()
    try:
        entries = SuppressionList(engine).entries(limit)
    finally:
        engine.dispose()
    rows = [{"address_hash": e.address_hash, "reason": e.reason, "detail": e.detail,
             "message_id": e.message_id, "created_at": e.created_at} for e in entries]
    if as_json:
        common.echo_json({"suppressed": rows})
        return
    if not rows:
        click.echo("the suppression list is empty")
        return
    for r in rows:
        click.echo(f"{r['created_at'].strftime('%Y-%m-%d %H:%M:%SZ')}  {r['reason']:<9}  {r['address_hash'][:16]}…  "
                   f"{r['detail'] or ''}")


@suppression.command("add")
@click.argument("address")
@click.option("--note", default=None, help=f"Why (at most {MAX_NOTE_CHARS} characters; no personal data).")
def suppression_add(address: str, note: str | None) -> None:
    """Add ADDRESS (kept only as its keyed hash); the relay sends it nothing more."""
    bare = _address(address)
    if note is not None and (len(note) > MAX_NOTE_CHARS or "@" in note):
        raise click.BadParameter(f"must be at most {MAX_NOTE_CHARS} characters and hold no address",
                                 param_hint="--note")
    hasher = _hasher()
    engine = common.engine()
    try:
        added = SuppressionList(engine, hasher).add(bare, note)
    finally:
        engine.dispose()
    click.echo(f"{'added' if added else 'already on the list'}: {hasher.hash(bare)[:16]}…")


@suppression.command("remove")
@click.argument("address")
def suppression_remove(address: str) -> None:
    """Take ADDRESS off the list (mail to it is sent again; SES's own list may still hold it)."""
    bare = _address(address)
    hasher = _hasher()
    engine = common.engine()
    try:
        reason = SuppressionList(engine, hasher).remove(bare)
    finally:
        engine.dispose()
    if reason is None:
        raise click.ClickException(f"not on the list: {hasher.hash(bare)[:16]}…")
    click.echo(f"removed ({reason}): {hasher.hash(bare)[:16]}…")
