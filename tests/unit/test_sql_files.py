"""The SQL loader: statements by name, includes expanded, mistakes refused by name."""

from __future__ import annotations

import re

import pytest

from outbox_relay import sql


def test_statements_are_read_by_name_without_their_description():
    statements = sql.parse("-- the file\n-- name: one\n-- what it does\nSELECT 1\n\n-- name: two\nSELECT {{one}}\n")
    assert statements == {"one": "SELECT 1", "two": "SELECT {{one}}"}
    assert sql.expand(statements) == {"one": "SELECT 1", "two": "SELECT SELECT 1"}


@pytest.mark.parametrize(("source", "problem"), [
    ("SELECT 1\n-- name: one\nSELECT 1\n", "SQL before the first '-- name:' header"),
    ("-- name: one\nSELECT 1\n-- name: one\nSELECT 2\n", "'one' is defined twice"),
    ("-- name: one\n-- only a description\n", "'one' has no SQL"),
])
def test_a_malformed_file_is_refused_naming_the_problem(source, problem):
    with pytest.raises(ValueError, match="^" + re.escape(f"x.sql: {problem}") + "$"):
        sql.parse(source, "x.sql")


@pytest.mark.parametrize(("statements", "problem"), [
    ({"one": "SELECT {{missing}}"}, "SQL include of an unknown statement: missing"),
    ({"a": "{{b}}", "b": "{{a}}"}, "SQL include cycle: a -> b -> a"),
])
def test_a_bad_include_is_refused_naming_it(statements, problem):
    with pytest.raises(ValueError, match="^" + re.escape(problem) + "$"):
        sql.expand(statements)


def test_every_statement_of_the_package_is_loaded_and_expanded():
    assert sql.relay.claim.text.startswith("WITH expired AS")  # the header's description is not sent
    for area in sql.AREAS:
        assert all("{{" not in body for body in sql._TEXTS[area].values())
