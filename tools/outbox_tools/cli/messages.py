"""`outbox enqueue-event`, `enqueue-email`, `enqueue-sqs`, `enqueue-sns`,
`enqueue-eventbridge` and `enqueue-kinesis`: write one message, in its own transaction, through the producer API, and print its message id."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import click

from outbox_relay.email.mime import MAX_MESSAGE_BYTES
from outbox_relay.errors import InvalidMessageError
from outbox_relay.producer import (
    enqueue_email,
    enqueue_event,
    enqueue_eventbridge,
    enqueue_kinesis,
    enqueue_sns,
    enqueue_sqs,
)

from . import common


@click.command("enqueue-event")
@click.option("--stream", required=True, help="Redis stream key.")
@click.option("--type", "type_", required=True, help="Event type, e.g. order.placed.")
@click.option("--payload", required=True, help="JSON text, or @file.json to read a file.")
@click.option("--key", default=None, help="Ordering/partition key.")
@click.option("--message-id", default=None, help="Idempotency key (UUID).")
@click.option("--deliver-at", default=None, help="ISO 8601 time with offset, e.g. 2026-12-01T09:00:00+09:00.")
@click.option("--max-attempts", type=int, default=None)
def enqueue_event_cmd(stream: str, type_: str, payload: str, key: str | None, message_id: str | None,
                      deliver_at: str | None, max_attempts: int | None) -> None:
    """Enqueue one domain event (in its own transaction) and print its message id."""
    when = _deliver_at(deliver_at)
    text = _text_or_file(payload, "--payload")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint="--payload") from None
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply to read", param_hint="--payload") from None
    engine = common.engine()
    try:
        with engine.begin() as conn:
            mid = enqueue_event(conn, stream=stream, type=type_, payload=value, key=key,
                                message_id=message_id, deliver_at=when, max_attempts=max_attempts)
    except InvalidMessageError as exc:
        raise click.UsageError(f"invalid message: {exc}") from None
    finally:
        engine.dispose()
    click.echo(str(mid))


def _json_option(text: str, option: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint=option) from None
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply to read", param_hint=option) from None


def _headers(values: tuple[str, ...]) -> dict[str, str] | None:
    """`--header name=value`, repeated."""
    out: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not name=value", param_hint="--header")
        out[name] = value
    return out or None


def _enqueue_aws(enqueue, fields: dict) -> None:
    """Write one SQS, SNS or EventBridge message through `enqueue` and print its id."""
    fields["deliver_at"] = _deliver_at(fields["deliver_at"])
    fields["payload"] = _json_option(_text_or_file(fields["payload"], "--payload") or "", "--payload")
    engine = common.engine()
    try:
        with engine.begin() as conn:
            mid = enqueue(conn, **fields)
    except InvalidMessageError as exc:
        raise click.UsageError(f"invalid message: {exc}") from None
    finally:
        engine.dispose()
    click.echo(str(mid))


def _aws_options(f):
    for option in reversed((
            click.option("--type", "type_", required=True, help="Message type, e.g. order.placed."),
            click.option("--payload", required=True, help="JSON text, or @file.json to read a file."),
            click.option("--key", default=None, help="Ordering key: its messages are sent in enqueue order (the MessageGroupId on a FIFO queue or topic)."),
            click.option("--message-id", default=None, help="Idempotency key (UUID)."),
            click.option("--deliver-at", default=None, help="ISO 8601 time with offset."),
            click.option("--max-attempts", type=int, default=None))):
        f = option(f)
    return f


@click.command("enqueue-sqs")
@_aws_options
@click.option("--header", "headers", multiple=True, help="A message attribute, name=value (repeatable, at most 7).")
def enqueue_sqs_cmd(type_: str, payload: str, key: str | None, message_id: str | None, deliver_at: str | None,
                    max_attempts: int | None, headers: tuple[str, ...]) -> None:
    """Enqueue one message for the SQS relay's queue and print its message id."""
    _enqueue_aws(enqueue_sqs, {"type": type_, "payload": payload, "key": key, "message_id": message_id,
                               "deliver_at": deliver_at, "max_attempts": max_attempts, "headers": _headers(headers)})


@click.command("enqueue-sns")
@_aws_options
@click.option("--header", "headers", multiple=True, help="A message attribute, name=value (repeatable, at most 7).")
def enqueue_sns_cmd(type_: str, payload: str, key: str | None, message_id: str | None, deliver_at: str | None,
                    max_attempts: int | None, headers: tuple[str, ...]) -> None:
    """Enqueue one message for the SNS relay's topic and print its message id."""
    _enqueue_aws(enqueue_sns, {"type": type_, "payload": payload, "key": key, "message_id": message_id,
                               "deliver_at": deliver_at, "max_attempts": max_attempts, "headers": _headers(headers)})


@click.command("enqueue-eventbridge")
@_aws_options
@click.option("--source", default=None, help="The event's source; else OUTBOX_EVENTBRIDGE_SOURCE.")
@click.option("--bus", default=None, help="The event bus (name or ARN); else OUTBOX_EVENTBRIDGE_BUS.")
def enqueue_eventbridge_cmd(type_: str, payload: str, key: str | None, message_id: str | None,
                            deliver_at: str | None, max_attempts: int | None, source: str | None,
                            bus: str | None) -> None:
    """Enqueue one EventBridge event (the payload, a JSON object, is its detail) and print its message id."""
    _enqueue_aws(enqueue_eventbridge, {"type": type_, "payload": payload, "key": key, "message_id": message_id,
                                       "deliver_at": deliver_at, "max_attempts": max_attempts, "source": source,
                                       "bus": bus})


@click.command("enqueue-kinesis")
@_aws_options
@click.option("--header", "headers", multiple=True, help="A header of the record, name=value (repeatable).")
def enqueue_kinesis_cmd(type_: str, payload: str, key: str | None, message_id: str | None, deliver_at: str | None,
                        max_attempts: int | None, headers: tuple[str, ...]) -> None:
    """Enqueue one record for the Kinesis relay's stream (the key is its partition key) and print its message id."""
    _enqueue_aws(enqueue_kinesis, {"type": type_, "payload": payload, "key": key, "message_id": message_id,
                                   "deliver_at": deliver_at, "max_attempts": max_attempts,
                                   "headers": _headers(headers)})


def _deliver_at(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter("not an ISO 8601 time", param_hint="--deliver-at") from None


def _text_or_file(value: str | None, option: str) -> str | None:
    """A literal, or ``@path`` to read a UTF-8 file; a file that cannot be read is a
    usage error naming `option`."""
    if value is None or not value.startswith("@"):
        return value
    path = value[1:]
    try:
        return _file_bytes(path, option).decode("utf-8")
    except UnicodeDecodeError:
        raise click.BadParameter(f"{path} is not UTF-8 text", param_hint=option) from None


def _file_bytes(path: str, option: str) -> bytes:
    """The file's bytes, read no further than the largest email SES takes (a device
    or a huge file is refused, not read into memory)."""
    if not path:
        raise click.BadParameter("no file named after '@'", param_hint=option)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MESSAGE_BYTES + 1)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path} ({exc.strerror or type(exc).__name__})",
                                 param_hint=option) from None
    if len(data) > MAX_MESSAGE_BYTES:
        raise click.BadParameter(f"{path} is larger than {MAX_MESSAGE_BYTES:,} bytes, the most a message "
                                 "may hold", param_hint=option)
    return data


def _pairs(values: tuple[str, ...], sep: str, option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        name, found, value = item.partition(sep)
        if not found:
            raise click.BadParameter(f"{item!r} is not NAME{sep}VALUE", param_hint=option)
        out[name.strip()] = value.strip() if sep == ":" else value
    return out


@click.command("enqueue-email")
@click.option("--to", "to", multiple=True, help="Recipient, 'a@example.com' or 'Name <a@example.com>' (repeatable).")
@click.option("--cc", multiple=True, help="Cc recipient (repeatable).")
@click.option("--bcc", multiple=True, help="Bcc recipient (repeatable).")
@click.option("--reply-to", multiple=True, help="Reply-To address (repeatable).")
@click.option("--from", "sender", default=None, help="From; a verified SES identity [default: OUTBOX_SES_FROM at send].")
@click.option("--subject", required=True, help="Subject (UTF-8).")
@click.option("--text", default=None, help="Plain-text body, or @file.txt.")
@click.option("--html", default=None, help="HTML body, or @file.html.")
@click.option("--header", "headers", multiple=True, help="Custom header 'Name: value' (repeatable).")
@click.option("--tag", "tags", multiple=True, help="SES message tag 'name=value' (repeatable).")
@click.option("--configuration-set", default=None, help="SES configuration set [default: OUTBOX_SES_CONFIGURATION_SET].")
@click.option("--attach", "attachments", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="File to attach (repeatable); the email is then sent as raw MIME.")
@click.option("--message-id", default=None, help="Idempotency key (UUID).")
@click.option("--deliver-at", default=None, help="ISO 8601 time with offset, e.g. 2026-12-01T09:00:00+09:00.")
@click.option("--max-attempts", type=int, default=None)
@click.option("--key", default=None, help="Ordering key: emails with the same key are sent one at a time, in order.")
def enqueue_email_cmd(to: tuple[str, ...], cc: tuple[str, ...], bcc: tuple[str, ...], reply_to: tuple[str, ...],
                  sender: str | None, subject: str, text: str | None, html: str | None, headers: tuple[str, ...],
                  tags: tuple[str, ...], configuration_set: str | None, attachments: tuple[str, ...],
                  message_id: str | None, deliver_at: str | None, max_attempts: int | None,
                  key: str | None) -> None:
    """Enqueue one email for the SES relay and print its message id."""
    when = _deliver_at(deliver_at)
    files = [(Path(p).name, _file_bytes(p, "--attach")) for p in attachments]
    text, html = _text_or_file(text, "--text"), _text_or_file(html, "--html")
    engine = common.engine()
    try:
        with engine.begin() as conn:
            mid = enqueue_email(conn, to=list(to), cc=list(cc), bcc=list(bcc), reply_to=list(reply_to), sender=sender,
                          subject=subject, text=text, html=html,
                          headers=_pairs(headers, ":", "--header"), tags=_pairs(tags, "=", "--tag"),
                          configuration_set=configuration_set, attachments=files, message_id=message_id,
                          deliver_at=when, max_attempts=max_attempts, key=key)
    except InvalidMessageError as exc:
        raise click.UsageError(f"invalid email: {exc}") from None
    finally:
        engine.dispose()
    click.echo(str(mid))


#: Each channel's enqueue command, by the name its spec (`ChannelSpec.enqueue_command`) gives.
ENQUEUE_COMMANDS: dict[str, click.Command] = {
    c.name: c for c in (enqueue_event_cmd, enqueue_email_cmd, enqueue_sqs_cmd, enqueue_sns_cmd,
                        enqueue_eventbridge_cmd, enqueue_kinesis_cmd) if c.name}
