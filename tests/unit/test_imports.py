"""The packages' import graph (built by grimp): no import cycle anywhere, and
the relay's layer imports nothing of the workstation tools or the migrations,
nor click, rich or alembic, which the layer does not ship; and no migration
imports the library or a dependency whose data it could copy."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import grimp
import pytest

from outbox_migrations import script_location

PACKAGES = ("outbox_relay", "outbox_tools", "outbox_migrations")
#: What no migration may depend on.
FROZEN_OUT = ("outbox_relay", "idna", "email_validator")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)


def test_no_module_imports_itself_through_others(graph) -> None:
    # Given every import between the project's modules, lazy ones inside functions included
    modules = {m for m in graph.modules if m.split(".")[0] in PACKAGES}
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules} for m in modules}
    # A package's __init__ importing its own submodule is not a cycle of concepts.
    for m, imported in edges.items():
        imported.discard(m)

    # Then they form a DAG
    try:
        list(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


@pytest.mark.parametrize("forbidden", ["outbox_tools", "outbox_migrations", "click", "rich", "alembic"])
def test_the_layer_does_not_import_workstation_code(graph, forbidden) -> None:
    importers = {m for m in graph.find_downstream_modules(forbidden, as_package=True)
                 if m.startswith("outbox_relay")}
    assert importers == set(), f"outbox_relay modules depend on {forbidden}: {sorted(importers)}"



def test_no_migration_imports_the_library_or_a_dependency_s_data(graph) -> None:
    # A migration makes the same schema forever: what it writes cannot follow the library
    # (outbox_relay) or the data of a package it was computed from (idna, email_validator).
    scripts = sorted(Path(script_location(), "versions").glob("*.py")) + [Path(script_location(), "env.py")]
    imported = set()
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {(path.name, a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add((path.name, node.module))
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "import_module":
                imported.add((path.name, node.args[0].value))
    # and what a script imports of outbox_migrations itself (VERSION_TABLE, grants) brings none in either
    for name, module in list(imported):
        if module.startswith("outbox_migrations") and module in graph.modules:
            imported |= {(f"{name} via {module}", m) for m in graph.find_upstream_modules(module)}
    found = sorted((name, m) for name, m in imported if m.split(".")[0] in FROZEN_OUT)
    assert len(scripts) > 12 and found == [], f"migrations import {found}"
