"""Running the functions in Lambda containers through the SAM CLI, as a
developer does, with what this machine lacks made up for (decision 0024):

- the template built for this machine's architecture (`host_template`):
  template.yaml with its architecture settings, and nothing else, changed;
- the stand-in base image (infra/lambda-image/build.sh) given with
  `--invoke-image`, as no image registry is reachable;
- infra/sam-env.json with the compose services' names replaced by addresses on
  the Docker bridge (`sam_env`), where forwarders and servers of the tests
  listen;
- `sam local invoke` and `sam local start-lambda` run in a directory without
  samconfig.toml, so that its compose network is not used; its local
  parameter overrides are passed as they are.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cfnlint.decode import cfn_yaml
from sqlalchemy.engine import make_url

from support.template import ROOT

WORK = ROOT / ".aws-sam" / "sam-local"
SAM = str(Path(sys.executable).with_name("sam"))
IMAGE_SCRIPT = ROOT / "infra" / "lambda-image" / "build.sh"
HOST_ARCHITECTURE = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}[
    platform.machine().lower()]
#: The compose services infra/sam-env.json names, by the role they play.
COMPOSE_SERVICES = ("postgres", "redis", "moto")


def find_python312() -> str | None:
    """A python3.12 with pip (what `sam build` needs without a container), as .ci/run finds it."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = [shutil.which("python3.12"), "/usr/local/bin/python3.12", "/usr/bin/python3.12",
                  *sorted(glob.glob(f"{root}/versions/3.12*/bin/python3.12"), reverse=True)]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and subprocess.run(
                [candidate, "-c", "import sys, pip; assert sys.version_info[:2] == (3, 12)"],
                capture_output=True, timeout=60).returncode == 0:
            return candidate
    return None


def host_template() -> dict[str, Any]:
    """template.yaml as data, built for this machine: every function's and
    layer's architecture set to the host's. Nothing else differs."""
    doc = cfn_yaml.load(str(ROOT / "template.yaml"))
    doc["Globals"]["Function"]["Architectures"] = [HOST_ARCHITECTURE]
    for resource in doc["Resources"].values():
        if resource["Type"] == "AWS::Serverless::LayerVersion":
            resource["Properties"]["CompatibleArchitectures"] = [HOST_ARCHITECTURE]
            resource["Metadata"]["BuildArchitecture"] = HOST_ARCHITECTURE
        elif resource["Type"] == "AWS::Serverless::Function":
            assert "Architectures" not in resource["Properties"], "architecture set outside Globals"
    return doc


def local_parameter_overrides() -> str:
    """samconfig.toml's placeholders for `sam local` (both relays deployed)."""
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    return config["default"]["local_invoke"]["parameters"]["parameter_overrides"]


def sam_environment(python312: str) -> dict[str, str]:
    """The SAM CLI's own environment: python3.12 first on PATH (for `sam build`),
    dummy AWS credentials, no telemetry."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DATABASE_", "REDIS_", "OUTBOX_"))}
    env.update(PATH=f"{Path(python312).parent}{os.pathsep}{env.get('PATH', '')}", SAM_CLI_TELEMETRY="0",
               AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               AWS_REGION="us-east-1")
    return env


@dataclass(frozen=True)
class Addresses:
    """Where a container finds each compose service's stand-in: (host, port)."""

    postgres: tuple[str, int]
    redis: tuple[str, int]
    moto: tuple[str, int]


def sam_env(addresses: Addresses, database_url: str) -> dict[str, dict[str, str]]:
    """infra/sam-env.json with each compose service's host and port replaced by
    its stand-in's, and the database (name, user) this test's."""
    env = json.loads((ROOT / "infra" / "sam-env.json").read_text())
    where = {name: getattr(addresses, name) for name in COMPOSE_SERVICES}
    for values in env.values():
        for key, value in values.items():
            parts = urlsplit(value) if "://" in value else None
            if parts is None or parts.hostname not in where:
                continue
            host, port = where[parts.hostname]
            if parts.hostname == "postgres":
                values[key] = make_url(database_url).set(host=host, port=port).render_as_string(hide_password=False)
            else:
                values[key] = urlunsplit(parts._replace(netloc=f"{host}:{port}"))
    return env


@dataclass
class Invocation:
    """What `sam local invoke` printed: the function's result (stdout) and the
    emulator's and function's output (stderr: logs, EMF, START/END/REPORT)."""

    returncode: int
    result: Any
    logs: str


def invoke(function: str, event: dict[str, Any], env_vars: dict[str, Any], *, image: str, build_dir: Path,
           python312: str, tmp: Path, timeout: float = 300) -> Invocation:
    """`sam local invoke FUNCTION -e EVENT --env-vars FILE` on the local build."""
    event_file, env_file = tmp / f"{function}-event.json", tmp / f"{function}-env.json"
    event_file.write_text(json.dumps(event))
    env_file.write_text(json.dumps(env_vars))
    proc = subprocess.run(
        [SAM, "local", "invoke", function, "-t", str(build_dir / "template.yaml"), "-e", str(event_file),
         "--env-vars", str(env_file), "--invoke-image", image, "--skip-pull-image",
         "--parameter-overrides", local_parameter_overrides()],
        cwd=WORK, env=sam_environment(python312), capture_output=True, text=True, timeout=timeout)
    out = proc.stdout.strip()
    try:
        result = json.loads(out) if out else None
    except ValueError:
        result = out
    return Invocation(proc.returncode, result, proc.stderr)


def json_logs(output: str) -> list[dict[str, Any]]:
    """The function's JSON log lines (Powertools) in an output."""
    lines = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{") and '"level"' in line:
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
    return lines
