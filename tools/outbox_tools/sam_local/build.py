"""What `sam local` runs: a python3.12 for `sam build`, template.yaml built for
this machine's architecture (a generated copy; the template is not edited),
and the base image (AWS's where a registry answers, else the stand-in that
infra/lambda-image/build.sh makes)."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import Failed, Unavailable

HOST_ARCHITECTURE = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(
    platform.machine().lower(), platform.machine().lower())
#: AWS's base image for the functions' runtime, as the SAM CLI names it.
AWS_IMAGE = f"public.ecr.aws/lambda/python:3.12-{HOST_ARCHITECTURE}"
#: Where the SAM CLI pulls AWS's image from; answering on 443 counts as reachable.
AWS_REGISTRY = ("public.ecr.aws", 443)
PYTHON312_HELP = ("sam build needs a python3.12 with pip, the functions' runtime: install one (pyenv install 3.12, "
                  "or your system's python3.12 package) or name it with --python")


def work_dir(root: Path) -> Path:
    """Where the local build, its template and logs go: away from samconfig.toml,
    whose local sections name the compose network."""
    return root / ".aws-sam" / "sam-local"


# ---------------------------------------------------------------------------
# python3.12
# ---------------------------------------------------------------------------

def _probe(candidate: str) -> tuple[str, bool] | None:
    """(the interpreter's own path, whether it has pip) for a python3.12, else None."""
    try:
        proc = subprocess.run(
            [candidate, "-c", "import sys, importlib.util; assert sys.version_info[:2] == (3, 12); "
                              "print(sys.executable); print(importlib.util.find_spec('pip') is not None)"],
            capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.split()
    if proc.returncode != 0 or len(lines) != 2:
        return None
    return lines[0], lines[1] == "True"


def _pyenv_root() -> str:
    if shutil.which("pyenv"):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            found = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=30).stdout.strip()
            if found:
                return found
    return os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", Path(path).parents[1].name))


def python312_candidates() -> list[str]:
    """Where .ci/run looks, in its order: PATH, /usr/local/bin, /usr/bin, then
    pyenv's installed 3.12 versions, newest first (a pyenv shim answers only
    when its version is selected, so the installs are tried directly)."""
    installs = glob.glob(os.path.join(_pyenv_root(), "versions", "3.12*", "bin", "python3.12"))
    return [c for c in (shutil.which("python3.12"), "/usr/local/bin/python3.12", "/usr/bin/python3.12",
                        *sorted(installs, key=_version_key, reverse=True)) if c]


def find_python312() -> str:
    """The first python3.12 with pip, as its own path (not a shim). Raises
    `Unavailable` saying how to provide one."""
    without_pip = None
    for candidate in python312_candidates():
        if not os.access(candidate, os.X_OK):
            continue
        found = _probe(candidate)
        if found is None:
            continue
        if found[1]:
            return found[0]
        without_pip = without_pip or found[0]
    if without_pip:
        raise Unavailable(f"{without_pip} has no pip, which sam build uses: {without_pip} -m ensurepip, "
                          "or name another python3.12 with --python")
    raise Unavailable(f"no python3.12 found (PATH, /usr/local/bin, /usr/bin, pyenv): {PYTHON312_HELP}")


def check_python312(path: str) -> str:
    """`path` as a python3.12 with pip (its own path), or ValueError saying what it is not."""
    found = _probe(path)
    if found is None:
        raise ValueError(f"{path} is not a python3.12 interpreter")
    if not found[1]:
        raise ValueError(f"{path} has no pip, which sam build uses ({path} -m ensurepip adds it)")
    return found[0]


# ---------------------------------------------------------------------------
# The template, built for this machine
# ---------------------------------------------------------------------------

def load_template(root: Path) -> dict[str, Any]:
    from cfnlint.decode import cfn_yaml  # the SAM CLI's own dependency: reads !Ref, !Sub and the rest

    return cfn_yaml.load(str(root / "template.yaml"))


def function_names(root: Path) -> list[str]:
    """The template's Lambda functions, as `sam local` names them."""
    return sorted(name for name, r in load_template(root)["Resources"].items()
                  if r["Type"] == "AWS::Serverless::Function")


def host_template(root: Path) -> dict[str, Any]:
    """template.yaml as data, built for this machine: every function's and
    layer's architecture set to the host's. Nothing else differs."""
    doc = load_template(root)
    doc["Globals"]["Function"]["Architectures"] = [HOST_ARCHITECTURE]
    for name, resource in doc["Resources"].items():
        if resource["Type"] == "AWS::Serverless::LayerVersion":
            resource["Properties"]["CompatibleArchitectures"] = [HOST_ARCHITECTURE]
            resource["Metadata"]["BuildArchitecture"] = HOST_ARCHITECTURE
        elif resource["Type"] == "AWS::Serverless::Function" and "Architectures" in resource["Properties"]:
            raise Failed(f"template.yaml: {name} sets Architectures itself; `outbox local` expects it in Globals")
    return doc


def sam_executable() -> str:
    """The SAM CLI installed beside this Python (the dev extra), else the one on PATH."""
    beside = Path(sys.executable).with_name("sam")
    found = str(beside) if beside.is_file() else shutil.which("sam")
    if found is None:
        raise Unavailable("the SAM CLI is not installed: pip install -e '.[dev]' in the checkout "
                          "(or pip install aws-sam-cli)")
    return found


def sam_environment(python312: str) -> dict[str, str]:
    """The SAM CLI's own environment: python3.12 first on PATH (for `sam build`),
    dummy AWS credentials, no telemetry, and none of this shell's database,
    Redis or relay settings (`sam local` hands a shell's values of the
    template's variables to the function)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DATABASE_", "REDIS_", "OUTBOX_"))}
    env.update(PATH=f"{Path(python312).parent}{os.pathsep}{env.get('PATH', '')}", SAM_CLI_TELEMETRY="0",
               AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               AWS_REGION="us-east-1")
    return env


def local_parameter_overrides(root: Path) -> str:
    """samconfig.toml's placeholders for `sam local` (every relay deployed)."""
    config = tomllib.loads((root / "samconfig.toml").read_text())
    return config["default"]["local_invoke"]["parameters"]["parameter_overrides"]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build at a time in the work directory (two `outbox local` at once, or one beside the tests)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_for_host(root: Path, python312: str) -> Path:
    """`sam build` of template.yaml for this machine's architecture into the
    work directory (cached between runs); returns the build directory, whose
    template.yaml `sam local` takes. Raises `Failed` naming the log."""
    work = work_dir(root)
    with _locked(work / "build.lock"):
        template = work / "template.json"
        template.write_text(json.dumps(host_template(root), indent=1))
        out, log = work / "build", work / "build.log"
        with log.open("w") as output:
            proc = subprocess.run(
                [sam_executable(), "build", "-t", str(template), "--base-dir", str(root), "--build-dir", str(out),
                 "--cached", "--cache-dir", str(work / "cache")],
                cwd=work, env=sam_environment(python312), stdout=output, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, timeout=1800)
        if proc.returncode != 0:
            raise Failed(f"sam build failed: {_last_error(log)} (all of its output: {log})")
    return out


def _last_error(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[-1][:300]


# ---------------------------------------------------------------------------
# The base image
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Image:
    """The image the functions run on: `name` for --invoke-image, or None for
    AWS's, which the SAM CLI pulls itself."""

    name: str | None
    description: str

    def sam_args(self) -> list[str]:
        return [] if self.name is None else ["--invoke-image", self.name, "--skip-pull-image"]


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True, timeout=60).returncode == 0


def registry_reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(AWS_REGISTRY, timeout=timeout).close()
        return True
    except OSError:
        return False


#: --image's words; anything else is an image name.
IMAGE_CHOICES = ("auto", "aws", "stand-in")
# A first component is a registry only with a dot or a port, or as localhost (Docker's rule).
_IMAGE_REFERENCE = re.compile(r"^(?:(?:localhost|[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)+)(?::\d+)?/|[a-zA-Z0-9-]+:\d+/)?"
                              r"[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::\w[\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


def is_image_reference(text: str) -> bool:
    """Whether `text` reads as a Docker image reference ([registry/]name[:tag][@digest])."""
    return bool(_IMAGE_REFERENCE.match(text))


def choose_image(choice: str, root: Path, python312: str, *, echo: Callable[[str], None]) -> Image:
    """`auto`: AWS's image when it is here or its registry answers, else the
    stand-in; `aws`, `stand-in`: that one; anything else: an image of this
    Docker engine, by name (LookupError when it has none)."""
    if choice not in IMAGE_CHOICES:
        if not image_exists(choice):
            raise LookupError(f"Docker has no image {choice} here")
        return Image(choice, f"{choice} (given)")
    if choice in ("auto", "aws") and image_exists(AWS_IMAGE):
        return Image(AWS_IMAGE, f"AWS's {AWS_IMAGE}, pulled before")
    if choice == "aws" or (choice == "auto" and registry_reachable()):
        return Image(None, f"AWS's {AWS_IMAGE} (the SAM CLI pulls it)")
    return Image(stand_in_image(root, python312, echo=echo), "the stand-in for AWS's image "
                 "(no image registry answers; infra/lambda-image/build.sh)")


def stand_in_image(root: Path, python312: str, *, echo: Callable[[str], None] = lambda line: None) -> str:
    """infra/lambda-image/build.sh's image for this interpreter: reused when
    Docker has it, else built (root and debootstrap needed, about a minute)."""
    script = root / "infra" / "lambda-image" / "build.sh"
    named = subprocess.run(["bash", str(script), "--name", python312], capture_output=True, text=True, timeout=60)
    if named.returncode != 0:
        raise Failed(f"infra/lambda-image/build.sh --name: {named.stderr.strip()[-300:]}")
    name = named.stdout.strip()
    if image_exists(name):
        echo(f"reusing the stand-in image {name}")
        return name
    if os.geteuid() != 0:
        raise Unavailable("building the stand-in Lambda image needs root (debootstrap makes its file system): "
                          "run the command once as root, or give an image with --image")
    if shutil.which("debootstrap") is None and not os.access("/usr/sbin/debootstrap", os.X_OK):
        raise Unavailable("building the stand-in Lambda image needs debootstrap: apt-get install debootstrap")
    log = work_dir(root) / "image.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    echo(f"building the stand-in image {name} (about a minute; log: {log})")
    env = {**os.environ, "PATH": f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin{os.pathsep}/sbin"}
    with log.open("w") as output:
        built = subprocess.run(["bash", str(script), python312], stdout=subprocess.PIPE, stderr=output, text=True,
                               env=env, stdin=subprocess.DEVNULL, timeout=1800)
    if built.returncode != 0:
        raise Failed(f"the stand-in image did not build: {_last_error(log)} (log: {log})")
    return built.stdout.strip().splitlines()[-1]
