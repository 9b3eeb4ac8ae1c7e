"""The README stays true: every setting documented, the CI runs its test command."""

import re
from pathlib import Path

from outbox_relay.config import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def variables() -> set[str]:
    names = set()
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        names.add(alias if isinstance(alias, str) else f"OUTBOX_{name.upper()}")
    return names


def test_every_environment_variable_is_documented():
    missing = sorted(v for v in variables() if f"`{v}`" not in README)
    assert missing == []


def test_ci_runs_the_readme_test_command():
    quick_start = README.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    test_command = quick_start.strip().splitlines()[-1].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(test_command)}\s*$", ci, re.M), test_command
