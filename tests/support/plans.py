"""EXPLAIN plans read as the schema declares them: a partition (outbox_message_live, a day's) and
its indexes named as the partitioned table and index they belong to, and the scans of empty day
partitions (days ahead: nothing to read, pruned at run time by `day`) left out (docs/decisions/0066)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

_TOPS = text("""
    WITH RECURSIVE up(child, top) AS (
        SELECT inhrelid, inhparent FROM pg_inherits
        UNION ALL
        SELECT u.child, i.inhparent FROM up u JOIN pg_inherits i ON i.inhrelid = u.top)
    SELECT c.relname, t.relname FROM up u JOIN pg_class c ON c.oid = u.child JOIN pg_class t ON t.oid = u.top
     WHERE NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = u.top)""")


_EMPTY = text("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
              "WHERE c.relkind = 'r' AND c.relname ~ '_d[0-9]+$' AND c.reltuples <= 0 AND c.relpages = 0")


def declared(engine: Any, plan: dict) -> dict:
    """`plan` with every relation and index name a partition's replaced by its partitioned one's."""
    with engine.connect() as conn:
        names = dict(conn.execute(_TOPS).fetchall())
        empty = set(conn.execute(_EMPTY).scalars())

    def walk(node: dict) -> None:
        node["Plans"] = [c for c in node.get("Plans", []) if c.get("Relation Name") not in empty]
        for key in ("Relation Name", "Index Name"):
            if node.get(key) in names:
                node[key] = names[node[key]]
        for child in node["Plans"]:
            walk(child)

    walk(plan)
    return plan
