"""Every Python snippet in README.md and docs/ against the package: each compiles,
each of its imports runs, and each call of a function it imports from the project
binds to that function's signature. A doc and the package cannot disagree on a
name. The snippets write to an application's own database (its `engine`, its
`orders`), so they are not run whole; the examples in examples/ are
(tests/e2e/test_examples.py)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from outbox_relay import __all__ as exported
from outbox_relay.publishers.registry import CHANNELS

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("outbox_relay", "outbox_tools", "outbox_migrations")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
_HEREDOC = re.compile(r"python3? - <<'(\w+)'\n(.*?)^\1$", re.M | re.S)
_DASH_C = re.compile(r"`python3? -c '([^']*)'`", re.S)


def snippets() -> list[tuple[str, str]]:
    """(where, source) of every Python snippet: ```python fences, `python - <<'PY'`
    heredocs in shell fences, and `python -c '…'` code spans."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        name = doc.relative_to(ROOT).as_posix()

        def where(pos: int) -> str:
            return f"{name}:{text.count(chr(10), 0, pos) + 1}"  # noqa: B023 - used at once

        for fence in _FENCE.finditer(text):
            if fence.group(1) in ("python", "py"):
                found.append((where(fence.start()), fence.group(2)))
            elif fence.group(1) in ("sh", "bash", "console"):
                found += [(where(fence.start(2) + h.start()), h.group(2)) for h in _HEREDOC.finditer(fence.group(2))]
        fences = [range(*f.span()) for f in _FENCE.finditer(text)]
        # A code span's line breaks are spaces in the rendered text a reader copies.
        found += [(where(c.start()), " ".join(c.group(1).split("\n"))) for c in _DASH_C.finditer(text)
                  if not any(c.start() in f for f in fences)]
    return found


SNIPPETS = snippets()


def test_the_docs_have_the_snippets_this_checks():
    # The producer API of each AWS channel is shown in docs/channels.md: a parser that
    # found nothing would pass every test below.
    calls = {node.func.id for _, source in SNIPPETS for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert {"enqueue_event", "enqueue_email", "enqueue_sqs", "enqueue_sns", "enqueue_eventbridge"} <= calls


@pytest.mark.parametrize(("where", "source"), SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_the_snippet_compiles_its_imports_run_and_its_calls_bind(where, source):
    # Given the snippet, as a reader copies it
    tree = ast.parse(compile(source, where, "exec", ast.PyCF_ONLY_AST))

    # When each of its imports runs
    namespace: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            exec(compile(ast.Module([node], type_ignores=[]), where, "exec"), namespace)

    # Then every call of a project function names only arguments it takes
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        function = namespace.get(node.func.id)
        if not callable(function) or not getattr(function, "__module__", "").startswith(PROJECT):
            continue
        keywords = {k.arg: None for k in node.keywords if k.arg is not None}
        try:
            inspect.signature(function).bind(*[None] * len(node.args), **keywords)
        except TypeError as exc:
            pytest.fail(f"{where}: {node.func.id}(…) line {node.lineno}: {exc}")


def test_every_channels_producer_function_is_exported_from_the_package():
    producers = {spec.producer for spec in CHANNELS}
    assert producers <= set(exported)
    package = importlib.import_module("outbox_relay")
    assert all(callable(getattr(package, name)) for name in exported)


def test_the_package_the_command_and_the_distribution_name_every_channel():
    import tomllib

    from click.testing import CliRunner

    import outbox_relay
    from outbox_tools.cli import main

    descriptions = {
        "the package docstring": outbox_relay.__doc__,
        "outbox --help": CliRunner().invoke(main, ["--help"]).output,
        "pyproject.toml": tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"],
    }
    for what, text in descriptions.items():
        missing = [s.name for s in CHANNELS if not re.search(rf"\b{s.name}\b", text, re.I)]
        assert missing == [], f"{what} does not name {missing}"


def test_every_exported_database_url_is_read_by_psql_and_by_the_relay():
    # docs/producers.md runs `psql "$DATABASE_URL"`: libpq reads postgresql:// and postgres://
    # only, and the relay and the `outbox` command read them as pg8000.
    from outbox_relay.urls import parse_database_url

    exported = [(doc.name, m.group(1)) for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
                for m in re.finditer(r"export DATABASE_URL=(\S+)", doc.read_text(encoding="utf-8"))]
    assert len(exported) >= 3
    for where, url in exported:
        assert url.startswith(("postgresql://", "postgres://")), (where, url)
        assert parse_database_url(url).drivername == "postgresql+pg8000"


def _commands() -> list[str]:
    """Every command of `outbox`, as typed: `stats`, `dead list`, `local invoke`, …"""
    import click

    from outbox_tools.cli import main

    found = []

    def walk(command: click.Command, path: str) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}".strip())
        else:
            found.append(path)

    walk(main, "")
    return found


def test_operating_md_lists_every_command():
    operating = (ROOT / "docs" / "operating.md").read_text(encoding="utf-8")
    listed, rest = operating.split("`outbox` (console script):", 1)[1].split("| command | what it does |", 1)
    table = "\n".join(line for line in rest.splitlines() if line.startswith("|"))
    assert [c for c in _commands() if f"`outbox {c}" not in table] == []
    assert [c for c in _commands() if not re.search(rf"`{re.escape(c)}[` ]", listed)] == []


def test_operating_md_explains_every_field_of_the_relay_summary():
    from outbox_relay.summary import Summary

    section = (ROOT / "docs" / "operating.md").read_text(encoding="utf-8").split("## Handler summary", 1)[1]
    table = "\n".join(line for line in section.split("| field | meaning |", 1)[1].split("\n\n", 1)[0].splitlines())
    fields = {*Summary(channel="redis").as_dict(), "downstream", "handover", "interrupted"}
    assert sorted(f for f in fields if f"`{f}`" not in table) == []
