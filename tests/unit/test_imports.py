"""The packages' import graph (built by grimp): no import cycle anywhere, and
the relay's layer imports nothing of the workstation tools or the migrations,
nor click, rich or alembic, which the layer does not ship."""

from __future__ import annotations

import graphlib

import grimp
import pytest

PACKAGES = ("outbox_relay", "outbox_tools", "outbox_migrations")


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
