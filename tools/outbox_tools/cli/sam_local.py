"""`outbox local invoke` and `outbox local start-lambda`: the template's
functions in Lambda containers, in one command (decision 0039)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Iterator

import click

from outbox_relay.errors import ConfigurationError
from outbox_relay.urls import check_redis_url

from ..lambda_local import project_root
from ..sam_local.build import IMAGE_CHOICES, check_python312, function_names, is_image_reference
from ..sam_local.errors import Failed, Unavailable
from ..sam_local.session import DEFAULT_EVENTS, Session
from . import common
from .local import _event


class _Missing(click.ClickException):
    """Something the command needs is missing: one line, the usage status."""

    exit_code = 2


def _root() -> Path:
    try:
        return project_root()
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None


def _function(ctx: click.Context, param: click.Parameter, name: str) -> str:
    known = function_names(_root())
    if name not in known:
        raise click.BadParameter(f"{name!r} is not a function of template.yaml ({', '.join(known)})")
    return name


def _optional_event(ctx: click.Context, param: click.Parameter, path: str | None) -> dict | None:
    return None if path is None else _event(ctx, param, path)


def _image(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value not in IMAGE_CHOICES and not is_image_reference(value):
        raise click.BadParameter(f"{value!r} is none of {', '.join(IMAGE_CHOICES)}, nor an image name "
                                 "([registry/]name[:tag])")
    return value


def _python(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_python312(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _host(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value != "localhost":
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not an IP address of this machine to listen on") from None
    return value


_IMAGE_HELP = ("The functions' base image: auto (AWS's where its registry answers, else the stand-in that "
               "infra/lambda-image/build.sh builds), aws, stand-in, or an image name.")
_PYTHON_HELP = "The python3.12 (with pip) sam build uses [default: found as .ci/run finds it, pyenv included]."
_KEEP_HELP = "Leave running the Docker engine this command started (later runs then start faster)."


def _common_options(command):
    for option in reversed([
        click.option("--image", default="auto", show_default=True, callback=_image, help=_IMAGE_HELP),
        click.option("--python", "python312", type=click.Path(exists=True, dir_okay=False), callback=_python,
                     help=_PYTHON_HELP),
        click.option("--keep", is_flag=True, help=_KEEP_HELP),
    ]):
        command = option(command)
    return command


@click.group("local")
def local_group() -> None:
    """Run the template's functions in Lambda containers (Docker and the SAM CLI).

    Finds or starts Docker, builds the functions for this machine's
    architecture (template.yaml is not edited), uses AWS's image or builds a
    stand-in where no registry answers, and lets the containers reach this
    machine's PostgreSQL and Redis (DATABASE_URL and REDIS_URL, else
    127.0.0.1:5432 and :6379, else embedded ones) and a local SES (moto).
    What it starts, it stops at the end."""


def _reach_database() -> None:
    from sqlalchemy import text

    engine = common.engine()
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()


def _reach_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ConfigurationError("REDIS_URL", f"cannot reach Redis ({type(exc).__name__}: {exc})") from None
    finally:
        client.close()


@contextlib.contextmanager
def _session(image: str, python312: str | None, keep: bool) -> Iterator[Session]:
    """A session whose missing prerequisites and failed steps end the command
    in one line; Ctrl-C or SIGTERM stops what it started, exit status 130."""
    root = _root()
    # Bad settings are named now, before Docker and the build (exit status 1, as every command).
    if os.environ.get("DATABASE_URL"):
        common.database_url()
        # Reached now, not from the container half a minute later: the group turns a
        # failure into one line naming DATABASE_URL.
        _reach_database()
    if os.environ.get("REDIS_URL"):
        try:
            check_redis_url(os.environ["REDIS_URL"])
        except ValueError as exc:
            raise ConfigurationError("REDIS_URL", str(exc)) from None
        _reach_redis(os.environ["REDIS_URL"])

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        with Session(root, image=image, python312=python312, keep=keep,
                     echo=lambda line: click.echo(f"outbox local: {line}", err=True)) as session:
            yield session
    except Unavailable as exc:
        raise _Missing(str(exc)) from None
    except Failed as exc:
        raise click.ClickException(str(exc)) from None
    except LookupError as exc:
        raise click.BadParameter(str(exc), param_hint="--image") from None
    except KeyboardInterrupt:
        click.echo("Error: interrupted; what this command started is stopped", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)


@local_group.command("invoke")
@click.argument("function", callback=_function)
@click.option("--event", "event", type=click.Path(exists=True, dir_okay=False), callback=_optional_event,
              help="The event, a JSON file [default: the function's sample in events/].")
@_common_options
def invoke_cmd(function: str, event: dict | None, image: str, python312: str | None, keep: bool) -> None:
    """Invoke FUNCTION once in a Lambda container and print its result.

    Standard output carries only the result (JSON): the relay's summary, the
    maintenance report, or the migration's answer to CloudFormation (its
    ResponseURL is pointed at a local server). The steps, the container's
    logs and the function's EMF metrics go to standard error."""
    root = _root()
    if event is None:
        event = json.loads((root / "events" / DEFAULT_EVENTS[function]).read_text(encoding="utf-8"))
    with _session(image, python312, keep) as session:
        session.prepare()
        bridges = session.bridge()
        done = session.invoke(function, event, logs=click.get_text_stream("stderr"))
        _report(function, done, bridges)


def _report(function: str, done: Any, bridges: Any) -> None:
    notes = [note] if (note := bridges.recorded(function)) else []
    for response in bridges.cfn.responses:
        notes.append(f"CloudFormation's response URL got {response.body.get('Status')}")
    click.echo(f"outbox local: {function} returned in {done.seconds:.1f} s"
               + "".join(f"; {note}" for note in notes), err=True)
    if done.result is not None:
        common.echo_json(done.result)
    if done.failed:
        error = done.result if isinstance(done.result, dict) else {}
        what = (f"{error.get('errorType')}: {error.get('errorMessage')}" if "errorType" in error
                else f"sam local invoke exited with status {done.returncode}")
        raise click.ClickException(f"{function} failed: {what}".splitlines()[0][:500])


@local_group.command("start-lambda")
@click.option("--host", default="127.0.0.1", show_default=True, callback=_host,
              help="The address the Lambda API listens on.")
@click.option("--port", default=3001, show_default=True, type=click.IntRange(1, 65535),
              help="The port the Lambda API listens on.")
@_common_options
def start_lambda_cmd(host: str, port: int, image: str, python312: str | None, keep: bool) -> None:
    """Serve every function on the Lambda API until Ctrl-C, for boto3's Lambda
    client (endpoint_url=http://HOST:PORT); warm containers are reused
    between invocations, as Lambda does.

    A custom resource request for MigrationFunction answers CloudFormation at
    its ResponseURL: point it at the response URL printed at the start, and
    each answer is printed here."""
    with _session(image, python312, keep) as session:
        session.prepare()
        session.bridge(on_response=lambda r: click.echo(json.dumps({"path": r.path, **r.body})))
        with session.start_lambda(host, port) as server:
            click.echo(f"outbox local: the Lambda API is at {server.url} "
                       f"({', '.join(function_names(session.root))}); Ctrl-C stops it and what this command "
                       "started", err=True)
            try:
                code = server.wait()
            except KeyboardInterrupt:  # how a developer ends it: stop what was started, exit 0
                click.echo("outbox local: stopping", err=True)
                return
        raise click.ClickException(f"sam local start-lambda exited by itself, status {code}")
