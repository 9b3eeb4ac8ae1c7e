"""The documents stay true: every setting documented, the CI runs the README's
test command, every relative link leads somewhere, the README stays short."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from outbox_relay.config import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
#: Written by `python -m bench`, so it may not exist yet in a fresh checkout.
BENCHMARK = ROOT / "docs" / "benchmark.md"
MAX_README_LINES = 300

# [text](target) and [text](target "title"); images too. Not inside code.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def variables() -> set[str]:
    names = set()
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        names.add(alias if isinstance(alias, str) else f"OUTBOX_{name.upper()}")
    return names


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """Link targets that point into the repository (no scheme, not only an anchor)."""
    prose = _CODE_SPAN.sub("", _FENCE.sub("", text))
    targets = []
    for target in _LINK.findall(prose):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "//")):
            continue
        targets.append(target)
    return targets


def test_every_environment_variable_is_documented():
    missing = sorted(v for v in variables() if f"`{v}`" not in CONFIGURATION)
    assert missing == []


def test_ci_runs_the_readme_test_command():
    quick_start = README.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    test_command = quick_start.strip().splitlines()[-1].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(test_command)}\s*$", ci, re.M), test_command


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_of_the_repository(document: Path):
    # Given the relative links of one document
    links = relative_links(document.read_text(encoding="utf-8"))

    # Then each leads to a file or directory of the repository (the benchmark page may not be written yet)
    broken = []
    for target in links:
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        resolved = (document.parent / path).resolve()
        if resolved == BENCHMARK.resolve():
            continue
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    assert broken == []


def test_the_readme_is_short():
    lines = len(README.splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; details belong in docs/"


# A pointer from code into a document: `docs/design.md, "The claim"`, `(README, "Deploy")`,
# `README "Operate"`, `the README ("Operating", …)`, `README, section Benchmark`.
_POINTER = re.compile(r'(\bREADME(?:\.md)?|(?<![\w/])[\w./-]+\.md)\b(?:\'s)?(?:,\s*|\s+|\s*\(\s*)'
                      r'(?:"([^"\n]{1,80}(?:\n[^"\n]{1,80})?)"|section (\w+))')
_MENTION = re.compile(r"(?<![\w/.-])([\w/.-]*\w\.md)\b")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)


def _headings(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return {h.replace("`", "") for h in _HEADING.findall(text)}


def _code_files() -> list[Path]:
    import subprocess

    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if n != "tests/unit/test_readme.py"
            and n.endswith((".py", ".yaml", ".yml", ".toml", ".sql", ".json", ".ini", ".mako")) or n == ".ci/run"]


def _document(name: str, source: Path) -> Path | None:
    """The markdown file a pointer names: README, a path from the root or from the
    pointing file's directory, or a page of docs/."""
    if name in ("README", "README.md"):
        return ROOT / "README.md"
    for candidate in (ROOT / name, source.parent / name, ROOT / "docs" / name):
        if candidate.is_file():
            return candidate
    return None


def test_pointers_from_code_into_the_documents_lead_to_a_section_that_exists():
    # Given every pointer from code, templates and tests to a document and its section
    broken = []
    for path in _code_files():
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        for mention in _MENTION.findall(text):
            if _document(mention, path) is None:
                broken.append(f"{where}: {mention} does not exist")
        for name, quoted, word in _POINTER.findall(text):
            document = _document(name, path)
            # across a line break of a comment: drop the comment marker; headings are compared without backticks
            section = re.sub(r"\s*\n\s*(?:#|--)?\s*", " ", quoted or word).replace("`", "").strip()
            if document is not None and section not in _headings(document):
                broken.append(f"{where}: {name} has no section {section!r}")
    # Then each names a file of the repository and a heading of that file
    assert broken == []


def test_the_readme_wheel_build_leaves_nothing_untracked():
    import subprocess

    # The README's `python -m build --wheel` writes build/ and dist/: both ignored, so a clean
    # checkout stays clean after it (git check-ignore answers 0 for an ignored path)
    built = re.search(r"writes (dist/\S+\.whl)", README)
    assert built, "the README says where the wheel is written"
    for path in ("build/lib/outbox_relay/__init__.py", built[1].replace("<version>", "0.1.0")):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path
