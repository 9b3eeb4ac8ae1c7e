"""`outbox enqueue-email`: write one transactional email into the outbox (its own transaction)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from .errors import InvalidMessageError


def _text_or_file(value: str | None) -> str | None:
    """A literal, or ``@path`` to read a UTF-8 file."""
    if value is None or not value.startswith("@"):
        return value
    return Path(value[1:]).read_text(encoding="utf-8")


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
def enqueue_email(to: tuple[str, ...], cc: tuple[str, ...], bcc: tuple[str, ...], reply_to: tuple[str, ...],
                  sender: str | None, subject: str, text: str | None, html: str | None, headers: tuple[str, ...],
                  tags: tuple[str, ...], configuration_set: str | None, attachments: tuple[str, ...],
                  message_id: str | None, deliver_at: str | None, max_attempts: int | None) -> None:
    """Enqueue one email for the SES relay and print its message id."""
    from .cli import _engine
    from .email import enqueue_email as enqueue

    when = None
    if deliver_at is not None:
        try:
            when = datetime.fromisoformat(deliver_at)
        except ValueError:
            raise click.BadParameter("not an ISO 8601 time", param_hint="--deliver-at") from None
    files = [(Path(p).name, Path(p).read_bytes()) for p in attachments]
    engine = _engine()
    try:
        with engine.begin() as conn:
            mid = enqueue(conn, to=list(to), cc=list(cc), bcc=list(bcc), reply_to=list(reply_to), sender=sender,
                          subject=subject, text=_text_or_file(text), html=_text_or_file(html),
                          headers=_pairs(headers, ":", "--header"), tags=_pairs(tags, "=", "--tag"),
                          configuration_set=configuration_set, attachments=files, message_id=message_id,
                          deliver_at=when, max_attempts=max_attempts)
    except InvalidMessageError as exc:
        raise click.UsageError(f"invalid email: {exc}") from None
    finally:
        engine.dispose()
    click.echo(str(mid))
