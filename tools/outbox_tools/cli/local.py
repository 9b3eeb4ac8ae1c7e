"""`outbox migrate`, `outbox relay` and `outbox demo`: the schema, one
invocation of the real handler in-process, and the whole flow on defaults."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

import click

from outbox_migrations import current_revision, upgrade
from outbox_migrations import online as online_path
from outbox_relay.config import get_settings
from outbox_relay.errors import ConfigurationError, InvalidEventError
from outbox_relay.observability import logger

from ..lambda_local import LocalContext, environment, load_handler, project_root
from ..servers import LOCAL_REDIS_URL
from . import common


@click.command()
@click.option("--online", is_flag=True,
              help="Before migration 0016 on a running deployment: build and fill its tables beside the old ones "
                   "(resumable; run again until it says copied); the next upgrade swaps them in (docs/operating.md).")
@click.option("--seconds", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="With --online: stop copying after this long (the next run goes on).")
@click.option("--abandon", is_flag=True,
              help="With --online: undo a prepared online migration before its swap, back to 0015 exactly.")
def migrate(online: bool, seconds: float, abandon: bool) -> None:
    """Create or upgrade the outbox schema (Alembic; running it twice is harmless)."""
    if abandon and not online:
        raise click.UsageError("--abandon: only with --online")
    engine = common.engine()
    try:
        before = current_revision(engine)
        if abandon:
            if before != "0015" or not online_path.abandon(engine):
                raise click.UsageError(f"--abandon: the schema is at {before or 'no revision'} with no online "
                                       "migration prepared; nothing to abandon")
            click.echo("online migration abandoned; the schema is at 0015 as before it")
            return
        if online:
            if before is None or before >= "0016":
                raise click.UsageError(f"--online: the schema is at {before or 'no revision'}; "
                                       "it is for a schema before 0016")
            if before != "0015":
                upgrade(engine, "0015")
            online_path.prepare(engine)
            copied, mark = online_path.copy(engine, seconds)
            click.echo(f"online migration: seqs up to {copied} of {mark} copied; "
                       + ("run it again to go on" if copied < mark else
                          "copied and kept in step; `outbox migrate` or the next deploy swaps them in"))
            return
        upgrade(engine)
        after = current_revision(engine)
    finally:
        engine.dispose()
    if before == after:
        click.echo(f"schema is at the latest revision ({after}); nothing to do")
    else:
        click.echo(f"schema {'created' if before is None else 'upgraded from ' + before} "
                   f"at the latest revision ({after})")


#: Lambda's longest function timeout, seconds.
MAX_TIMEOUT_SECONDS = 900.0


def _event(ctx: click.Context, param: click.Parameter, path: str) -> dict:
    try:
        event = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise click.BadParameter(f"{path} is not a JSON event ({type(exc).__name__})") from None
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path} ({exc.strerror or type(exc).__name__})") from None
    if not isinstance(event, dict):
        raise click.BadParameter(f"{path} must hold a JSON object, as Lambda events are")
    return event


def _timeout(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_SECONDS):
        raise click.BadParameter(f"{value} is not a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS:g} "
                                 "(Lambda's longest timeout)")
    return value


def _function(ctx: click.Context, param: click.Parameter, name: str) -> str:
    try:
        root = project_root() / "functions"
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    known = sorted(p.parent.name for p in root.glob("*/app.py"))
    if name not in known:
        raise click.BadParameter(f"{name!r} is not a function under functions/ ({', '.join(known)})")
    return name


@click.command()
@click.option("--event", "event", type=click.Path(exists=True, dir_okay=False), required=True, callback=_event,
              help="Sample event, e.g. events/relay-redis-scheduler.json.")
@click.option("--timeout", type=float, default=None, callback=_timeout,
              help="Seconds the fake context starts with, at most 900 [default: OUTBOX_FUNCTION_TIMEOUT_SECONDS].")
@click.option("--function", "function", default="relay", show_default=True, callback=_function,
              help="Which function under functions/ to invoke.")
def relay(event: dict, timeout: float | None, function: str) -> None:
    """Invoke the real Lambda handler once, in-process, and print its summary.

    Standard output carries only the summary (JSON); the handler's logs and
    EMF metrics, which Lambda would send to CloudWatch, go to standard error.
    Ctrl-C ends the invocation as its deadline would (in-flight deliveries
    recorded, the rest released) and exits with status 130; a second aborts at
    once, in one line, status 130 (what it holds is claimed again when its
    lease expires, as after a crash).
    """
    defaults = {}
    if not os.environ.get("DATABASE_URL") and not os.environ.get("DATABASE_SECRET_ARN"):
        defaults["DATABASE_URL"] = common.database_url()
    if not os.environ.get("REDIS_URL") and not os.environ.get("REDIS_URL_SECRET_ARN"):
        defaults["REDIS_URL"] = LOCAL_REDIS_URL
    defaults.setdefault("POWERTOOLS_TRACE_DISABLED", os.environ.get("POWERTOOLS_TRACE_DISABLED", "true"))
    with environment(**defaults):
        try:
            settings = get_settings()
        except ConfigurationError as exc:
            raise click.ClickException(f"configuration error: {exc}") from None
        handler = load_handler(function)
        context = LocalContext(timeout if timeout is not None else settings.function_timeout_seconds)
        with _telemetry_to_stderr(), _ctrl_c_ends_the_invocation(context, settings.deadline_margin_seconds) as ctrl_c:
            try:
                result = handler(event, context)
            except InvalidEventError as exc:
                raise click.BadParameter(str(exc), param_hint="--event") from None
    if ctrl_c:
        result["interrupted"] = True  # a `skipped` of "not enough time left" is the Ctrl-C's doing
    common.echo_json(result)
    if function == "feedback" and result.get("unknown"):
        _unknown_hint(result["unknown"], event)
    if ctrl_c:
        sys.exit(130)


def _unknown_hint(unknown: int, event: dict) -> None:
    """Say how a feedback event can match a message: a sample of events/ names one
    that this database does not hold until an email is enqueued with its id."""
    ids = []
    for record in event.get("Records") or []:
        with contextlib.suppress(AttributeError, TypeError, ValueError, LookupError):
            ids += json.loads(record["Sns"]["Message"])["mail"]["tags"]["outbox-message-id"][:1]
    first = ids[0] if ids else "ID"
    click.echo(f"outbox relay: {unknown} event(s) matched no message of this database (matched by the "
               f"outbox-message-id tag, else the SES message id); to make one match, enqueue an email "
               f"with its id first: outbox enqueue-email --message-id {first} --to … --subject … --text …",
               err=True)


@contextlib.contextmanager
def _ctrl_c_ends_the_invocation(context: LocalContext, margin_seconds: float):
    """For the block, a first Ctrl-C brings the invocation to its deadline (it claims
    nothing more, finishes or releases what it holds, attempts refunded, and returns
    its summary); a second one ends the process at once, in one line, status 130
    (an exception raised wherever it lands would unwind through the handler's
    telemetry and print a chained traceback). Yields a list that is true once interrupted.
    A SIGINT that this process ignores (a background job) stays ignored."""
    interrupted: list[bool] = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN or previous is None or threading.current_thread() is not threading.main_thread():
        yield interrupted  # only the main thread may set a handler
        return

    def second(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            os.write(2, b"Error: relay aborted; what it held is claimed again when its lease expires\n")
        os._exit(130)

    def first(signum: int, frame: object) -> None:
        interrupted.append(True)
        context.leave_only(margin_seconds)
        signal.signal(signal.SIGINT, second)
        # os.write: a print here could re-enter a write to standard error in progress
        with contextlib.suppress(OSError):
            os.write(2, b"interrupted: finishing what is in flight, releasing the rest "
                        b"(Ctrl-C again to abort)\n")

    signal.signal(signal.SIGINT, first)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _telemetry_to_stderr():
    """Send the Powertools logger's lines and EMF prints to standard error for the block."""
    handler = logger.registered_handler
    previous = handler.setStream(sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            # Powertools' advice to developers when a failed invocation added no metric: not telemetry
            warnings.filterwarnings("ignore", message="No application metrics to publish")
            yield
    finally:
        handler.setStream(previous)


@click.command()
@click.option("--keep", is_flag=True, help="Keep the demo's database and keys afterwards.")
@click.option("--database-name", default=None,
              help="The database the demo creates (one that exists is refused) [default: outbox_demo_<random>].")
@click.option("--prefix", default=None,
              help="Redis key prefix of the demo's keys (one some key uses is refused) [default: demo.<random>.].")
def demo(keep: bool, database_name: str | None, prefix: str | None) -> None:
    """Run the whole flow on defaults: migrate, a sample app writing orders and
    their events in one transaction, relay invocations until drained, a report.

    It creates its own database and keys and removes them at the end, however
    it ends (Ctrl-C included), unless --keep."""
    from ..demo.events import DemoRefused, run_demo

    try:
        project_root()  # the handlers it invokes: refuse before creating anything
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)  # clean up on SIGTERM as on Ctrl-C
    try:
        code = run_demo(keep=keep, echo=click.echo, database_name=database_name, prefix=prefix)
    except DemoRefused as exc:
        raise click.BadParameter(exc.problem, param_hint=exc.option) from None
    except KeyboardInterrupt:
        click.echo("Error: demo interrupted; what it had created is removed" if not keep else
                   "Error: demo interrupted; its database and keys are kept (--keep)", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    sys.exit(code)
