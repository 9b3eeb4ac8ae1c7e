"""One `outbox local` run: every step in order, and what it started undone in
reverse at the end, however it ends (decision 0039)."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Callable

from outbox_relay.publishers.registry import CHANNELS

from .bridges import Bridges, database_target, redis_target
from .build import (
    HOST_ARCHITECTURE,
    Image,
    build_for_host,
    choose_image,
    find_python312,
    sam_executable,
    work_dir,
)
from .docker import DockerEngine, find_or_start
from .errors import Unavailable
from .sam import Invocation, StartLambda, invoke

#: The sample in events/ each function runs on when no --event is given.
DEFAULT_EVENTS = {
    **{f"Relay{spec.template_prefix}Function": f"relay-{spec.name}-scheduler.json" for spec in CHANNELS},
    "MaintenanceFunction": "maintenance-scheduled.json",
    "MigrationFunction": "migrate-create.json",
    "FeedbackFunction": "feedback-delivery.json",
}


def _where(target: tuple[str, int | None]) -> str:
    host, port = target
    return f"{host}:{port}" if port is not None else f"socket {host}"


class Session:
    """Docker, a python3.12, the image and the build (`prepare`), then the
    machine's services bridged to the containers (`bridge`), then `invoke` or
    `start_lambda`. Leaving the block stops what was started: the bridges,
    embedded servers, and the Docker engine unless `keep`."""

    def __init__(self, root: Path, *, image: str = "auto", python312: str | None = None, keep: bool = False,
                 echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> None:
        self.root, self.image_choice, self.python312, self.keep = root, image, python312, keep
        self.echo = echo
        self._stack = contextlib.ExitStack()
        self.docker: DockerEngine | None = None
        self.image: Image | None = None
        self.build_dir: Path | None = None
        self.bridges: Bridges | None = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def prepare(self) -> None:
        sam_executable()
        if self.python312 is None:
            self.python312 = find_python312()
        self.docker = find_or_start(start=True, log=work_dir(self.root) / "dockerd.log", echo=self.echo)
        if self.docker.started:
            self._stack.callback(self._stop_docker, self.docker)
        else:
            self.echo(f"Docker {self.docker.version} is running; containers reach this machine at "
                      f"{self.docker.bridge}")
        self.image = choose_image(self.image_choice, self.root, self.python312, echo=self.echo)
        self.echo(f"image: {self.image.description}")
        began = time.monotonic()
        self.build_dir = build_for_host(self.root, self.python312)
        self.echo(f"sam build for {HOST_ARCHITECTURE} with {self.python312}: {time.monotonic() - began:.0f} s "
                  "(template.yaml unchanged; the build is in .aws-sam/sam-local)")

    def _stop_docker(self, docker: DockerEngine) -> None:
        if self.keep:
            self.echo(f"dockerd keeps running (--keep), pid {docker.pid}")
            return
        docker.stop()
        self.echo("stopped the dockerd this command started")

    def bridge(self, database_url: str | None = None, redis_url: str | None = None, *,
               on_response: Callable[[Any], None] | None = None) -> Bridges:
        """The database and Redis (DATABASE_URL and REDIS_URL, else the local
        services, else embedded servers, migrated) at forwarders on the bridge,
        with moto and a CloudFormation response server."""
        from ..servers import find_servers

        assert self.docker is not None, "prepare() first"
        if database_url is None or redis_url is None:
            servers = find_servers()
            self._stack.callback(servers.close)
            database_url = database_url or servers.database_url
            redis_url = redis_url or servers.redis_url
            if servers.database_source == "embedded":
                self._migrate(database_url)
            self.echo(f"PostgreSQL ({servers.database_source}, {_where(database_target(database_url))}) and "
                      f"Redis ({servers.redis_source}, {_where(redis_target(redis_url))})")
        try:
            self.bridges = self._stack.enter_context(Bridges(self.root, self.docker.bridge, database_url, redis_url,
                                                                   on_response=on_response))
        except ImportError as exc:
            raise Unavailable(f"{exc.name} is not installed, which runs SES (moto) here: "
                              "pip install -e '.[dev]' in the checkout") from None
        a = self.bridges.addresses
        self.echo(f"containers reach PostgreSQL at {_where(a.postgres)}, Redis at {_where(a.redis)}, "
                  f"moto (SES, SQS, SNS, EventBridge) at {_where(a.moto)}, CloudFormation's response URL at "
                  f"{self.bridges.cfn.url('/')}")
        return self.bridges

    def _migrate(self, database_url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        from outbox_migrations import upgrade

        engine = create_engine(database_url, poolclass=NullPool)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        self.echo("embedded PostgreSQL migrated (it starts empty and is removed at the end)")

    def invoke(self, function: str, event: dict[str, Any], *, logs: Any = None) -> Invocation:
        assert self.bridges is not None and self.image is not None and self.build_dir is not None
        assert self.python312 is not None
        self.echo(f"sam local invoke {function}")
        return invoke(function, self.bridges.custom_resource_event(event), self.bridges.environment(),
                      root=self.root, build_dir=self.build_dir, image=self.image, python312=self.python312,
                      logs=logs)

    def start_lambda(self, host: str, port: int) -> StartLambda:
        assert self.bridges is not None and self.image is not None and self.build_dir is not None
        assert self.python312 is not None
        return StartLambda(self.bridges.environment(), root=self.root, build_dir=self.build_dir, image=self.image,
                           python312=self.python312, host=host, port=port)
