"""What each layer installs agrees with what pip installs here:
shared/requirements.txt (the relay's layer) and migrations/requirements.txt
(the migration function's layer) are, together, the first entries of
[project].dependencies; the rest is the workstation tools' (click, rich), and
none of the tools' or migrations' packages is in the relay's layer."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
WORKSTATION_ONLY = {"click", "rich"}


def _normalised(lines: list[str]) -> dict[str, tuple[frozenset[str], str, str]]:
    out: dict[str, tuple[frozenset[str], str, str]] = {}
    for line in lines:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in out, f"{req.name} listed twice"
        out[name] = (frozenset(canonicalize_name(e) for e in req.extras), str(req.specifier), str(req.marker or ""))
    return out


def _requirements_txt(folder: str) -> list[str]:
    text = (ROOT / folder / "requirements.txt").read_text(encoding="utf-8")
    return [s for line in text.splitlines() if (s := line.split("#", 1)[0].strip())]


def _project() -> dict[str, tuple[frozenset[str], str, str]]:
    return _normalised(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"])


def test_layers_hold_the_project_dependencies_but_the_workstations() -> None:
    # Given the three lists
    layer, migrations, project = _normalised(_requirements_txt("shared")), \
        _normalised(_requirements_txt("migrations")), _project()

    # Then the layers' requirements are the project's, at the same ranges, and what is
    # left is only what the workstation tools use
    assert {**layer, **migrations}.items() <= project.items()
    assert set(project) - set(layer) - set(migrations) == WORKSTATION_ONLY


def test_the_relay_layer_holds_no_workstation_or_migration_package() -> None:
    layer = set(_normalised(_requirements_txt("shared")))
    assert not layer & (WORKSTATION_ONLY | {"alembic"})


def test_every_layer_requirement_has_a_lower_bound() -> None:
    for folder in ("shared", "migrations"):
        for line in _requirements_txt(folder):
            req = Requirement(line)
            assert any(spec.operator in (">=", "==", "~=") for spec in req.specifier), line


def test_requirements_sit_where_the_layer_build_reads_them() -> None:
    # BuildMethod python3.12 copies ContentUri into python/ and installs the
    # requirements.txt found directly in it, beside the package.
    assert (ROOT / "shared" / "requirements.txt").is_file()
    assert (ROOT / "shared" / "outbox_relay" / "invocation.py").is_file()
    assert (ROOT / "migrations" / "requirements.txt").is_file()
    assert (ROOT / "migrations" / "outbox_migrations" / "env.py").is_file()
    assert not (ROOT / "shared" / "python").exists()
