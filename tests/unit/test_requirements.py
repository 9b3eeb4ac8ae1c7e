"""shared/requirements.txt (what `sam build` installs into the layer) agrees
with [project].dependencies in pyproject.toml (what pip installs here)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _normalised(lines: list[str]) -> dict[str, tuple[frozenset[str], str, str]]:
    out: dict[str, tuple[frozenset[str], str, str]] = {}
    for line in lines:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in out, f"{req.name} listed twice"
        out[name] = (frozenset(canonicalize_name(e) for e in req.extras), str(req.specifier), str(req.marker or ""))
    return out


def _requirements_txt() -> list[str]:
    text = (ROOT / "shared" / "requirements.txt").read_text(encoding="utf-8")
    return [s for line in text.splitlines() if (s := line.split("#", 1)[0].strip())]


def test_layer_requirements_equal_the_project_dependencies() -> None:
    # Given the two lists
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    layer = _requirements_txt()

    # Then they name the same packages, extras, version ranges and markers
    assert _normalised(layer) == _normalised(project)


def test_every_layer_requirement_has_a_lower_bound() -> None:
    for line in _requirements_txt():
        req = Requirement(line)
        assert any(spec.operator in (">=", "==", "~=") for spec in req.specifier), line


def test_requirements_sit_where_the_layer_build_reads_them() -> None:
    # BuildMethod python3.12 copies ContentUri into python/ and installs the
    # requirements.txt found directly in it: shared/, beside the package.
    assert (ROOT / "shared" / "requirements.txt").is_file()
    assert (ROOT / "shared" / "outbox_relay" / "invocation.py").is_file()
    assert not (ROOT / "shared" / "python").exists()
