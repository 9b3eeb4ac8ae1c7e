"""The Lambda runtime, imitated on a workstation: a context with a countdown,
the real handler files loaded as Lambda loads them, and environment overrides."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator


class LocalContext:
    """A Lambda-like context: request id, function name, memory, and remaining
    time counted down from `timeout_seconds` by the local monotonic clock."""

    def __init__(self, timeout_seconds: float = 60.0, function_name: str = "outbox-relay-local",
                 memory_limit_in_mb: int = 512, request_id: str | None = None) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_limit_in_mb
        self.invoked_function_arn = f"arn:aws:lambda:local:000000000000:function:{function_name}"
        self.aws_request_id = request_id or str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))

    def leave_only(self, seconds: float) -> None:
        """Bring the end of the countdown to at most `seconds` from now. With the
        handler's deadline margin, the handler is at its deadline: it starts nothing
        more and keeps the margin to record outcomes and release what it claimed."""
        self._deadline = min(self._deadline, time.monotonic() + seconds)


def project_root() -> Path:
    """The source checkout that holds the functions (`functions/`, `events/`):
    the one this package is installed from (`pip install -e`), else the one
    the current directory is in (an installed wheel, run inside a checkout)."""
    for start in (Path(__file__).resolve(), Path.cwd().resolve() / "pyproject.toml"):
        for parent in start.parents:
            if (parent / "functions").is_dir() and (parent / "pyproject.toml").is_file():
                return parent
    raise FileNotFoundError("functions/ not found: run inside a checkout of outbox-relay, where the "
                            "Lambda functions are")


def load_handler(function: str = "relay") -> Callable[[dict, Any], dict]:
    """Import `functions/<function>/app.py` and return its `handler`, as Lambda would."""
    path = project_root() / "functions" / function / "app.py"
    spec = importlib.util.spec_from_file_location(f"outbox_function_{function}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.handler


@contextlib.contextmanager
def log_level(level: str) -> Iterator[None]:
    """The handlers' logger at `level` for the block: Powertools reads
    POWERTOOLS_LOG_LEVEL once, when the logger is built at import."""
    from outbox_relay.observability import logger

    previous = logger.log_level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set (or, with None, unset) environment variables for the block."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
