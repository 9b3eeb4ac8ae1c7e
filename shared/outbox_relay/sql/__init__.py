"""Every SQL statement, from the `.sql` files beside this module, each under a ``-- name:`` header,
as a namespace of `text()` clauses per file (``relay.claim``). ``{{name}}`` includes another
statement or fragment of any file, so a shared condition is written once."""

from __future__ import annotations

import re
from importlib import resources
from types import SimpleNamespace

from sqlalchemy import text

_HEADER = re.compile(r"^-- name: *([a-z][a-z0-9_]*) *$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{([a-z][a-z0-9_]*)\}\}")
AREAS = ("relay", "producer", "operations", "feedback")


def parse(source: str, filename: str = "<sql>") -> dict[str, str]:
    """Statements by name, without the comment lines before them."""
    parts = _HEADER.split(source)
    preamble, pairs = parts[0], parts[1:]
    if any(line.strip() and not line.lstrip().startswith("--") for line in preamble.splitlines()):
        raise ValueError(f"{filename}: SQL before the first '-- name:' header")
    out: dict[str, str] = {}
    for name, body in zip(pairs[::2], pairs[1::2]):
        if name in out:
            raise ValueError(f"{filename}: '{name}' is defined twice")
        lines = body.strip().splitlines()
        while lines and lines[0].lstrip().startswith("--"):
            lines.pop(0)
        if not lines:
            raise ValueError(f"{filename}: '{name}' has no SQL")
        out[name] = "\n".join(lines).strip()
    return out


def expand(statements: dict[str, str]) -> dict[str, str]:
    done: dict[str, str] = {}

    def resolve(name: str, stack: tuple[str, ...]) -> str:
        if name in done:
            return done[name]
        if name in stack:
            raise ValueError(f"SQL include cycle: {' -> '.join(stack + (name,))}")
        if name not in statements:
            raise ValueError(f"SQL include of an unknown statement: {name}")
        body = _INCLUDE.sub(lambda m: resolve(m.group(1), stack + (name,)), statements[name])
        done[name] = body
        return body

    for name in statements:
        resolve(name, ())
    return done


def _load() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    files = {area: parse(resources.files(__name__).joinpath(f"{area}.sql").read_text(encoding="utf-8"),
                         f"{area}.sql") for area in AREAS}
    everything: dict[str, str] = {}
    for area, statements in files.items():
        for name, body in statements.items():
            if name in everything:
                raise ValueError(f"{area}.sql: '{name}' is also defined in another file")
            everything[name] = body
    expanded = expand(everything)
    return {area: {name: expanded[name] for name in statements} for area, statements in files.items()}, expanded


_TEXTS, _EXPANDED = _load()
relay, producer, operations, feedback = (SimpleNamespace(**{name: text(body) for name, body in _TEXTS[area].items()})
                                         for area in AREAS)


def statement_text(name: str) -> str:
    return _EXPANDED[name]
