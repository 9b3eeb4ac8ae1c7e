"""The producer examples that CI does not run (Go, C#, Java) are at least
well-formed, checked by each language's own tool where it is installed
(.ci/run installs them from Debian's packages); the Node one runs in
tests/e2e/test_examples.py, and here its syntax is checked too."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from outbox_tools.lambda_local import project_root

EXAMPLES = project_root() / "examples"

CHECKS = {
    # tool, arguments: syntax only, no packages needed (pgx, Npgsql and the JDBC driver are not here)
    "go": ("gofmt", ["-e", "-l", "go/enqueue.go"]),
    "csharp": ("mcs", ["--parse", "csharp/Enqueue.cs"]),
    "java": ("javac", ["-d", "{tmp}", "java/Enqueue.java"]),  # java.sql only: a full compile
    "node": ("node", ["--check", "node/enqueue.js"]),
}


@pytest.mark.parametrize("language", sorted(CHECKS))
def test_the_example_is_well_formed(language, tmp_path):
    tool, args = CHECKS[language]
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed: the {language} example is not checked here")
    done = subprocess.run([tool, *(a.format(tmp=tmp_path) for a in args)], cwd=EXAMPLES, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
