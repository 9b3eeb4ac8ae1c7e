"""`sam local invoke` and `sam local start-lambda` on the local build, with
the env-vars file written, the image given, and samconfig.toml's placeholders
for the template's parameters."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .build import Image, local_parameter_overrides, sam_environment, sam_executable, work_dir
from .errors import Failed


@dataclass
class Invocation:
    """What `sam local invoke` printed: the function's result (standard output)
    and the emulator's and function's output (standard error: logs, EMF,
    START/END/REPORT)."""

    returncode: int
    result: Any
    logs: str
    seconds: float

    @property
    def failed(self) -> bool:
        """The function raised (Lambda's error document) or the emulator failed."""
        return self.returncode != 0 or not isinstance(self.result, dict) or "errorType" in self.result


def _private_file(directory: Path, name: str, content: Any) -> Path:
    """A JSON file only its owner reads: the environment holds the database's credentials."""
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(content, out)
    return path


def _sigint_default() -> None:
    # A command started with SIGINT ignored (a background job of a script) passes that on to
    # its children; the SAM CLI must take the SIGINT `_stop` sends it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(process: subprocess.Popen, seconds: float = 10) -> None:
    """SIGINT first, as Ctrl-C would (the SAM CLI then removes its containers), then
    SIGTERM, then SIGKILL: `sam local invoke` may not exit on SIGINT once its
    container is gone, and the user who pressed Ctrl-C should not wait a minute."""
    for stop in (lambda: process.send_signal(signal.SIGINT), process.terminate, process.kill):
        if process.poll() is not None:
            return
        stop()
        try:
            process.wait(timeout=seconds)
            return
        except subprocess.TimeoutExpired:
            continue


def invoke(function: str, event: dict[str, Any], env_vars: dict[str, Any], *, root: Path, build_dir: Path,
           image: Image, python312: str, timeout: float = 1000, logs: TextIO | None = None) -> Invocation:
    """`sam local invoke FUNCTION` on the local build with `event` and the
    env-vars file `env_vars`. Standard error is kept, and copied as it comes
    to `logs` when given."""
    with tempfile.TemporaryDirectory(prefix="outbox-local-") as tmp:
        event_file = _private_file(Path(tmp), "event.json", event)
        env_file = _private_file(Path(tmp), "env.json", env_vars)
        result_file = Path(tmp) / "result.json"
        began = time.monotonic()
        with result_file.open("w") as result_out:
            # A session of its own: on Ctrl-C this process asks the SAM CLI to stop, once.
            process = subprocess.Popen(
                [sam_executable(), "local", "invoke", function, "-t", str(build_dir / "template.yaml"),
                 "-e", str(event_file), "--env-vars", str(env_file), *image.sam_args(),
                 "--parameter-overrides", local_parameter_overrides(root)],
                cwd=work_dir(root), env=sam_environment(python312), stdout=result_out, stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True,
                preexec_fn=_sigint_default)
            try:
                output = _collect(process, logs, timeout)
            finally:
                _stop(process)
        seconds = time.monotonic() - began
        out = result_file.read_text(errors="replace").strip()
    try:
        result = json.loads(out) if out else None
    except ValueError:
        result = out
    return Invocation(process.returncode, result, output, seconds)


#: What the runtime interface client says when the SAM CLI stops the container after
#: the invocation's REPORT line: its next poll finds the emulator gone. Not the function's.
AFTER_THE_REPORT = "LAMBDA_RUNTIME Failed to get next invocation"


def _collect(process: subprocess.Popen, logs: TextIO | None, timeout: float) -> str:
    """Read the process's standard error to its end (copying it to `logs`, without
    the runtime's `AFTER_THE_REPORT` line); stop the process when it takes longer
    than `timeout` seconds."""
    timer = threading.Timer(timeout, lambda: _stop(process))
    timer.daemon = True
    timer.start()
    lines: list[str] = []
    reported = False
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if reported and AFTER_THE_REPORT in line:
                continue
            reported = reported or line.startswith("REPORT RequestId")
            lines.append(line)
            if logs is not None:
                logs.write(line)
                logs.flush()
        process.wait()
    finally:
        timer.cancel()
    return "".join(lines)


def lambda_containers() -> set[str]:
    """The ids of the Lambda containers the SAM CLI runs on this engine."""
    out = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", "label=sam.cli.container.type=lambda"],
                         capture_output=True, text=True, timeout=60).stdout
    return set(out.split())


class StartLambda:
    """`sam local start-lambda` with warm containers (as Lambda keeps a
    container between invocations), from the block's start until its end,
    when it is stopped as Ctrl-C stops it and the containers it left are
    removed. Its output goes to `output` (a file), else to this process's."""

    def __init__(self, env_vars: dict[str, Any], *, root: Path, build_dir: Path, image: Image, python312: str,
                 host: str = "127.0.0.1", port: int = 3001, output: Path | None = None,
                 listen_seconds: float = 180) -> None:
        self.env_vars, self.root, self.build_dir, self.image = env_vars, root, build_dir, image
        self.python312, self.host, self.port, self.output = python312, host, port, output
        self.listen_seconds = listen_seconds
        self.process: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._before: set[str] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self) -> Any:
        """boto3's Lambda client on this endpoint (dummy credentials, no retries)."""
        import boto3
        from botocore.config import Config

        return boto3.client("lambda", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing",
                            config=Config(read_timeout=900, retries={"max_attempts": 0}))

    def read_output(self) -> str:
        return self.output.read_text(errors="replace") if self.output is not None and self.output.exists() else ""

    def __enter__(self) -> "StartLambda":
        self._tmp = tempfile.TemporaryDirectory(prefix="outbox-local-")
        env_file = _private_file(Path(self._tmp.name), "env.json", self.env_vars)
        self._before = lambda_containers()
        out = self.output.open("w") if self.output is not None else None
        try:
            self.process = subprocess.Popen(
                [sam_executable(), "local", "start-lambda", "-t", str(self.build_dir / "template.yaml"),
                 "--host", self.host, "--port", str(self.port), "--env-vars", str(env_file), *self.image.sam_args(),
                 "--warm-containers", "LAZY", "--parameter-overrides", local_parameter_overrides(self.root)],
                cwd=work_dir(self.root), env=sam_environment(self.python312), stdout=out,
                stderr=subprocess.STDOUT if out is not None else None, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_sigint_default)
        finally:
            if out is not None:
                out.close()
        try:
            self._wait_listening()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_listening(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.listen_seconds
        while True:
            if self.process.poll() is not None:
                raise Failed(f"sam local start-lambda exited with status {self.process.returncode}"
                             + (f": {self.read_output().strip().splitlines()[-1:]}" if self.output else ""))
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise Failed(f"sam local start-lambda did not listen on {self.url} "
                                 f"within {self.listen_seconds:g} s") from None
                time.sleep(0.5)

    def wait(self) -> int:
        """Until the SAM CLI exits (a developer's Ctrl-C ends the wait here)."""
        assert self.process is not None
        return self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
        # Warm containers a stopped SAM CLI left behind, and only those started since.
        for container in lambda_containers() - self._before:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __exit__(self, *exc: object) -> None:
        self.stop()

