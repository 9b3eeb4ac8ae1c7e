"""The migration function's work: migrate the schema when CloudFormation
creates or updates the template's `SchemaMigration` custom resource, and answer.

- Create and Update: `upgrade()` to the latest revision, connecting with the
  settings the relay uses (DATABASE_URL, DATABASE_SECRET_ARN,
  DATABASE_IAM_AUTH, DATABASE_TLS, DATABASE_CA_BUNDLE). On a database already
  there, nothing changes, so the resource can be updated any number of times.
- Delete: the schema and its messages are kept (they belong to the
  application's database, not to the stack); answered SUCCESS without
  connecting, so a stack whose database is already gone still deletes.
- The physical resource id never changes: a new id on update would tell
  CloudFormation the resource was replaced and make it delete the old one.
- The answer is a PUT of the response object to the request's `ResponseURL`
  (a pre-signed S3 URL: the function's subnets must reach S3), with
  `Data.Revision` (the schema's revision after the run) and
  `Data.PreviousRevision` ("none" for a database never migrated).
- A failure is answered FAILED with a one-line reason naming the log stream,
  then raised, so Lambda counts an error and the errors alarm sees it.
- A watchdog answers FAILED shortly before the Lambda timeout, so a migration
  that waits on a lock fails the deploy instead of leaving CloudFormation
  waiting for an answer that never comes.

Nothing runs at import; `get_dependencies()` builds the engine once per
container and `reset()` forgets it (tests).
"""

from __future__ import annotations

import functools
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Engine

from outbox_migrations import current_revision, head_revision, upgrade
from outbox_relay.config import load_maintenance_settings
from outbox_relay.db import create_relay_engine
from outbox_relay.errors import InvalidEventError
from outbox_relay.observability import logger as log

#: The one physical id of the schema resource (see the module docstring).
PHYSICAL_RESOURCE_ID = "outbox-schema"
#: Seconds before the Lambda timeout at which the watchdog answers FAILED.
WATCHDOG_MARGIN_SECONDS = 5.0
#: CloudFormation keeps at most 4,096 bytes of a response; a reason stays well under.
MAX_REASON_CHARS = 400
RESPONSE_ATTEMPTS = 4
RESPONSE_TIMEOUT_SECONDS = 10.0


class CustomResourceRequest(BaseModel):
    """The fields of a CloudFormation custom resource request this function uses."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    request_type: Literal["Create", "Update", "Delete"] = Field(alias="RequestType")
    response_url: str = Field(alias="ResponseURL", pattern=r"^https?://")
    stack_id: str = Field(alias="StackId")
    request_id: str = Field(alias="RequestId")
    logical_resource_id: str = Field(alias="LogicalResourceId")
    physical_resource_id: str | None = Field(default=None, alias="PhysicalResourceId")

    @classmethod
    def parse(cls, event: Any) -> "CustomResourceRequest":
        """The request in `event`; raises `ValueError` with one line naming the first bad field."""
        try:
            return cls.model_validate(event)
        except ValidationError as exc:
            first = InvalidEventError.of(exc)
            raise InvalidEventError(first.field, f"{first.problem} (not a CloudFormation custom resource "
                                                 "request)") from None


@dataclass(frozen=True)
class MigrationDependencies:
    """What a migration needs; tests may build their own."""

    engine: Engine


@functools.cache
def get_dependencies() -> MigrationDependencies:
    """The engine for this container, built on first use from the relay's
    database settings (without the relay's Redis and lease settings, as the
    maintenance function reads them). Raises `ConfigurationError`."""
    settings = load_maintenance_settings()
    return MigrationDependencies(create_relay_engine(settings))


def reset() -> None:
    """Forget the cached dependencies (tests, or after changing the environment)."""
    if get_dependencies.cache_info().currsize:
        get_dependencies().engine.dispose()
    get_dependencies.cache_clear()


def migrate(engine: Engine) -> tuple[str | None, str]:
    """Upgrade to the latest revision; returns (revision before, revision after)."""
    # The relay's engine runs each unit of work in a transaction: DDL and Alembic's
    # version row go in one, with no session setting (a transaction pooler may serve it).
    before = current_revision(engine)
    upgrade(engine)
    after = current_revision(engine)
    if after != head_revision():
        raise RuntimeError(f"the schema is at {after} after the upgrade, not at {head_revision()}")
    return before, after


class ResponseNotSent(RuntimeError):
    """CloudFormation's response URL did not take the answer."""


def put_response(url: str, body: dict[str, Any], *, attempts: int = RESPONSE_ATTEMPTS,
                 timeout: float = RESPONSE_TIMEOUT_SECONDS) -> int:
    """PUT `body` as JSON to a pre-signed response URL; returns the HTTP status.

    The URL was signed without a content type, so none is sent (an empty
    Content-Type). Network errors and error statuses are tried again, with
    1, 2, 4 … seconds between tries; then `ResponseNotSent`.
    """
    data = json.dumps(body).encode("utf-8")
    problem = "no attempt"
    for attempt in range(attempts):
        if attempt:
            time.sleep(2 ** (attempt - 1))
        request = urllib.request.Request(url, data=data, method="PUT", headers={"Content-Type": ""})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            problem = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            problem = type(exc).__name__
    # The URL carries a signature: name only what went wrong, never the URL.
    raise ResponseNotSent(f"the response URL did not take the answer after {attempts} tries ({problem})")


class Responder:
    """Sends the one answer a request gets; a second `send` (the watchdog's,
    after the main path's, or the other way round) is ignored."""

    def __init__(self, request: CustomResourceRequest, context: Any,
                 put: Callable[[str, dict[str, Any]], int] = put_response) -> None:
        self.request, self.context, self._put = request, context, put
        self._lock = threading.Lock()
        self.sent: dict[str, Any] | None = None

    def send(self, status: Literal["SUCCESS", "FAILED"], *, reason: str = "",
             data: dict[str, str] | None = None) -> dict[str, Any]:
        with self._lock:
            if self.sent is not None:
                return self.sent
            body = {
                "Status": status,
                "Reason": reason[:MAX_REASON_CHARS],
                "PhysicalResourceId": self.request.physical_resource_id or PHYSICAL_RESOURCE_ID,
                "StackId": self.request.stack_id,
                "RequestId": self.request.request_id,
                "LogicalResourceId": self.request.logical_resource_id,
                "NoEcho": False,
                "Data": data or {},
            }
            self._put(self.request.response_url, body)
            self.sent = body
            log.info("answered CloudFormation", extra={"status": status, "request_type": self.request.request_type,
                                                       "data": body["Data"]})
            return body

    def failure_reason(self, exc: BaseException) -> str:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        stream = getattr(self.context, "log_stream_name", None)
        where = f" (log stream {stream})" if stream else ""
        return f"schema migration failed: {type(exc).__name__}: {first_line}"[: MAX_REASON_CHARS - len(where)] + where


def run_custom_resource(event: Any, context: Any,
                        dependencies: Callable[[], MigrationDependencies] = get_dependencies,
                        put: Callable[[str, dict[str, Any]], int] = put_response) -> dict[str, Any]:
    """Handle one custom resource request; returns the response sent to CloudFormation.

    Raises `ValueError` for an event that is not such a request (nothing is
    sent: there is nowhere to send it), and re-raises a failed migration
    after answering FAILED.
    """
    request = CustomResourceRequest.parse(event)
    responder = Responder(request, context, put)
    if request.request_type == "Delete":
        return responder.send("SUCCESS", reason="the schema and its messages are kept")

    seconds_left = context.get_remaining_time_in_millis() / 1000.0 - WATCHDOG_MARGIN_SECONDS
    watchdog = threading.Timer(max(seconds_left, 0.0), lambda: responder.send(
        "FAILED", reason="schema migration failed: the function's timeout was near; see its log group"))
    watchdog.daemon = True
    watchdog.start()
    try:
        before, after = migrate(dependencies().engine)
    except Exception as exc:
        log.exception("schema migration failed", extra={"request_type": request.request_type})
        responder.send("FAILED", reason=responder.failure_reason(exc))
        raise
    finally:
        watchdog.cancel()
    log.info("schema migrated", extra={"previous_revision": before, "revision": after})
    return responder.send("SUCCESS", data={"Revision": after, "PreviousRevision": before or "none"})
