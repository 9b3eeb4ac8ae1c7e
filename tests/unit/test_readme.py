"""The documents stay true: every setting documented, the CI runs the README's
test command, every relative link leads somewhere, the README stays short."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from outbox_relay import config

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
    return set(config.variables())


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


# The README says what the project is and lets a newcomer run it at once; the design page
# stays one a maintainer reads whole, reference material living in the page of its topic.
QUICK_START_WITHIN = 40
MAX_DESIGN_LINES = 600


def test_the_readme_quick_start_comes_first():
    headings = [n for n, line in enumerate(README.splitlines(), 1) if line == "## Quick start"]
    assert headings and headings[0] <= QUICK_START_WITHIN, headings


def test_the_design_page_stays_short():
    lines = len((ROOT / "docs" / "design.md").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_DESIGN_LINES, f"docs/design.md has {lines} lines; reference material belongs in the topic's page"


DECISIONS = ROOT / "docs" / "decisions"
_RECORD_FILE = re.compile(r"^(\d{4})-[a-z0-9-]+\.md$")
_INDEX_ROW = re.compile(r"^\| \[(\d{4})\]\(([^)]+)\) \| (.+) \|$", re.M)
# The line that ends a record another one changed, and the line that opens the one that changed it.
_CHANGED_BY = re.compile(r"^(?:Superseded(?: in part)? by|Amended by) \[(\d{4})\]", re.M)
_AMENDED_WITHOUT_RECORD = re.compile(r"^Amended\b(?! by)", re.M)
_CHANGES = re.compile(r"^(?:Supersedes|Amends)\b.*?(?:\n\n|\Z)", re.M | re.S)


def _records() -> dict[str, str]:
    return {m[1]: m[0] for p in DECISIONS.iterdir() if (m := _RECORD_FILE.match(p.name))}


def _index() -> str:
    return (DECISIONS / "README.md").read_text(encoding="utf-8")


def _rows() -> dict[str, tuple[str, str]]:
    rows: dict[str, tuple[str, str]] = {}
    for number, target, text in _INDEX_ROW.findall(_index()):
        assert number not in rows, f"two index rows for {number}"
        rows[number] = (target, text)
    return rows


def test_every_decision_record_has_an_index_row_and_every_row_a_record():
    records, rows = _records(), _rows()
    assert sorted(records) == sorted(rows)
    assert {n: target for n, (target, _) in rows.items()} == records


def test_the_decision_index_explains_every_unused_number():
    # Given the numbers below the highest record that no record holds
    numbers = {int(n) for n in _records()}
    unused = set(range(1, max(numbers) + 1)) - numbers

    # Then the index's list of numbers without a record names exactly those (a number listed
    # there that has a record since is stale too); "0016–0019" stands for the four
    note = _index().split("Numbers without a record", 1)[1]
    listed: set[int] = set()
    for first, last in re.findall(r"\*\*(\d{4})(?:[–-](\d{4}))?\*\*", note):
        listed |= set(range(int(first), int(last or first) + 1))
    assert listed == unused


def test_a_superseded_or_amended_record_says_by_which_in_its_index_row():
    records, rows = _records(), _rows()
    wrong = []
    for number, name in sorted(records.items()):
        text = (DECISIONS / name).read_text(encoding="utf-8")
        row = rows[number][1].lower()
        changed_by = _CHANGED_BY.findall(text)
        marked = bool(changed_by or _AMENDED_WITHOUT_RECORD.search(text))
        # the row says superseded or amended exactly when the record ends with the line saying so,
        # and names the record that made the change
        if marked != bool(re.search(r"\b(superseded|amended)\b", row)):
            wrong.append(f"{number}: the record and its row disagree on whether it was changed")
        wrong += [f"{number}: its row does not name {by}" for by in changed_by if by not in row]
        # a record that supersedes or amends others: each of them ends with the line naming it
        for paragraph in _CHANGES.findall(text):
            for other in re.findall(r"\[(\d{4})\]", paragraph):
                if other not in records or number not in _CHANGED_BY.findall(
                        (DECISIONS / records[other]).read_text(encoding="utf-8")):
                    wrong.append(f"{number} changes {other}, which does not say so")
    assert wrong == []
