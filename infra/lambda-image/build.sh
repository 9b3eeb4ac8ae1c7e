#!/usr/bin/env bash
# A stand-in for AWS's Lambda base image public.ecr.aws/lambda/python:3.12, for
# `sam local invoke --invoke-image IMAGE --skip-pull-image` and `sam local
# start-lambda` on a machine that reaches no image registry (CI here).
#
# On a developer's machine with internet access none of this is needed:
# `sam local invoke` pulls AWS's own image. The stand-in has what the SAM CLI's
# emulator expects of that image and nothing more: a Debian root file system
# (debootstrap, Debian's packages), CPython 3.12 under /var/lang, AWS's runtime
# interface client (awslambdaric, from PyPI) under /var/runtime, and a
# /var/runtime/bootstrap that starts it with the import path Lambda gives a
# function (/var/task, then the layers under /opt/python). The SAM CLI adds
# its runtime interface emulator and the function's layers on top.
#
# Neither Debian bookworm nor PyPI ships a CPython 3.12 build, so the
# interpreter is copied from this machine: the python3.12 that `sam build`
# needs anyway (the same interpreter then builds the layers and runs them).
#
# Usage: infra/lambda-image/build.sh [--name] [PYTHON3.12]
#   Prints the image name on its last line. Reuses the image when it exists:
#   its tag is a hash of this directory and of the interpreter's version, so a
#   change to either makes a new one. Needs root and debootstrap (apt-get
#   install debootstrap; `outbox local` and .ci/run check for both first) and
#   Docker. --name prints the name and builds nothing. DEBIAN_MIRROR
#   overrides the Debian mirror.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

name_only=false
if [ "${1:-}" = "--name" ]; then name_only=true; shift; fi
python="${1:-$(command -v python3.12 || true)}"
if [ -z "$python" ] || ! "$python" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
  echo "lambda-image: need a python3.12 interpreter (argument 1 or on PATH), got '${python}'" >&2
  exit 2
fi
case "$(uname -m)" in
  x86_64) arch=x86_64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "lambda-image: unsupported machine $(uname -m)" >&2; exit 2 ;;
esac

version="$("$python" -c 'import platform; print(platform.python_version())')"
digest="$( (cat "$here/build.sh" "$here/bootstrap" "$here/bootstrap.py"; echo "$version $arch") | sha256sum | cut -c1-12)"
image="outbox-relay/lambda-python3.12:${arch}-${digest}"
if $name_only; then echo "$image"; exit 0; fi

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "lambda-image: reusing $image" >&2
  echo "$image"
  exit 0
fi

if ! command -v debootstrap >/dev/null; then
  echo "lambda-image: needs debootstrap to make the root file system: apt-get install debootstrap" >&2
  exit 2
fi

# Intermediate files (the root file system, a few hundred MB) stay outside the checkout.
work="$(mktemp -d "${TMPDIR:-/var/tmp}/outbox-lambda-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"

echo "lambda-image: building $image (debootstrap bookworm, CPython $version from $python)" >&2
# The shared libraries CPython's extension modules link against (ssl, ctypes,
# sqlite3, bz2, expat, readline, curses), and the CA certificates TLS verifies with.
debootstrap --variant=minbase \
  --include=ca-certificates,libssl3,libffi8,libsqlite3-0,libbz2-1.0,libexpat1,libreadline8,libncursesw6 \
  bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*

# The interpreter and its standard library, without the host's installed
# packages or the test suite (Lambda's image has neither).
prefix="$("$python" -c 'import sys; print(sys.base_prefix)')"
mkdir -p "$root/var/lang" "$root/var/runtime" "$root/var/task" "$root/opt"
tar -C "$prefix" --exclude='./lib/python3.12/test' --exclude='./lib/python3.12/site-packages/*' \
  --exclude='__pycache__' -cf - bin/python3.12 lib include \
  | tar -C "$root/var/lang" -xf -
ln -sf python3.12 "$root/var/lang/bin/python3"
ln -sf python3.12 "$root/var/lang/bin/python"

"$python" -m pip install --quiet --disable-pip-version-check --no-compile --target "$root/var/runtime" awslambdaric >&2
install -m 0755 "$here/bootstrap" "$root/var/runtime/bootstrap"
install -m 0644 "$here/bootstrap.py" "$root/var/runtime/bootstrap.py"

# The environment AWS's image sets; LD_LIBRARY_PATH also finds libpython,
# which the copied interpreter no longer finds through its build-time path.
tar -C "$root" -cf - . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV TZ=:/etc/localtime' \
  --change 'ENV PATH=/var/lang/bin:/usr/local/bin:/usr/bin:/bin:/opt/bin' \
  --change 'ENV LD_LIBRARY_PATH=/var/lang/lib:/lib64:/usr/lib64:/var/runtime:/var/runtime/lib:/var/task:/var/task/lib:/opt/lib' \
  --change 'ENV LAMBDA_TASK_ROOT=/var/task' \
  --change 'ENV LAMBDA_RUNTIME_DIR=/var/runtime' \
  --change 'WORKDIR /var/task' \
  --change 'ENTRYPOINT ["/var/runtime/bootstrap"]' \
  --message "stand-in for public.ecr.aws/lambda/python:3.12 (infra/lambda-image/build.sh)" \
  - "$image" >/dev/null

# A smoke test of the interpreter and the runtime client; a broken image is not kept.
docker run --rm --entrypoint /var/lang/bin/python3.12 -e PYTHONPATH=/var/runtime "$image" \
  -c 'import ssl, ctypes, sqlite3, awslambdaric' >&2 \
  || { docker image rm "$image" >/dev/null; echo "lambda-image: $image does not start python" >&2; exit 1; }
echo "lambda-image: built $image" >&2
echo "$image"
