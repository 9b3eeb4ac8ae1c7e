"""`outbox enqueue-…`, one command per registered channel, made from its spec
(`ChannelSpec.enqueue_command`, `enqueue_options`): write one message, in its own
transaction, through the producer API (`enqueue`), and print its message id."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import click

from outbox_relay.errors import InvalidMessageError
from outbox_relay.publishers.registry import CHANNELS
from outbox_relay.publishers.ses import MAX_MESSAGE_BYTES
from outbox_relay.publishers.spec import COMMON_OPTIONS, ChannelSpec, Option
from outbox_relay.write import enqueue

from . import common


def _json(text: str, option: str) -> object:
    try:
        return json.loads(_text_or_file(text, option) or "")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint=option) from None
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply to read", param_hint=option) from None


def _deliver_at(value: str, option: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter("not an ISO 8601 time", param_hint=option) from None


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


def _pairs(values: tuple[str, ...], sep: str, option: str) -> dict[str, str] | None:
    """`name=value` (the value as written) or `Name: value` (both stripped), repeated."""
    out: dict[str, str] = {}
    for item in values:
        name, found, value = item.partition(sep)
        if not found or not name:
            raise click.BadParameter(f"{item!r} is not name{sep}value", param_hint=option)
        out[name.strip()] = value.strip() if sep == ":" else value
    return out or None


#: How each kind of option's text becomes the producer API's value (None: left out).
_READ: dict[str, Callable[[Any, str], Any]] = {
    "text": lambda v, o: v,
    "int": lambda v, o: v,
    "json": _json,
    "file-text": _text_or_file,
    "time": _deliver_at,
    "list": lambda v, o: list(v),
    "pairs=": lambda v, o: _pairs(v, "=", o),
    "pairs:": lambda v, o: _pairs(v, ":", o),
    "files": lambda v, o: [(Path(p).name, _file_bytes(p, o)) for p in v],
}


def _click_option(o: Option) -> Callable[[Any], Any]:
    many = o.kind in ("list", "pairs=", "pairs:", "files")
    kind = int if o.kind == "int" else click.Path(exists=True, dir_okay=False) if o.kind == "files" else None
    return click.option(o.flag, o.field, required=o.required, multiple=many, type=kind, default=None,
                        help=o.help or None)


def enqueue_command(spec: ChannelSpec) -> click.Command:
    """The `outbox` command that enqueues one message for `spec`'s channel."""
    options = (*spec.enqueue_options, *COMMON_OPTIONS)

    def run(**values: Any) -> None:
        fields: dict[str, Any] = {}
        for o in options:
            value = values[o.field]
            if value is not None and value != ():
                fields[o.field] = _READ[o.kind](value, o.flag)
            elif o.kind == "list":
                fields[o.field] = []
        engine = common.engine()
        try:
            with engine.begin() as conn:
                mid = enqueue(conn, channel=spec.name, **fields)
        except InvalidMessageError as exc:
            raise click.UsageError(f"invalid {spec.enqueue_noun}: {exc}") from None
        finally:
            engine.dispose()
        click.echo(str(mid))

    command = click.command(spec.enqueue_command, help=spec.enqueue_help)(run)
    for o in options:
        command = _click_option(o)(command)
    return command


#: Each channel's enqueue command, by the name its spec (`ChannelSpec.enqueue_command`) gives.
ENQUEUE_COMMANDS: dict[str, click.Command] = {spec.enqueue_command: enqueue_command(spec) for spec in CHANNELS}
