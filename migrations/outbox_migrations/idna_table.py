"""The IDNA data of each code point, for migration 0011's table
outbox_idna_codepoint: one row per range of code points alike, with
email-validator's uts46_valid_char, the idna package's UTS 46 status and
mapping, IDNA 2008 class (PVALID, CONTEXTJ, CONTEXTO), joining type and the
scripts its CONTEXTO rules name, and unicodedata's category, bidirectional
class and combining class: what the SQL email function needs to check a domain
as the Python API does, from the same libraries (docs/decisions/0052).

A module of its own, imported once a process: alembic loads a migration's file
anew each time it runs, and the walk over every code point takes a second."""

from __future__ import annotations

import functools
import json
import unicodedata

from email_validator.syntax import uts46_valid_char
from idna import idnadata, uts46data

_COLUMNS = ("lo", "uts46_valid", "status", "replacement", "category", "idna_class", "bidi", "joining", "ccc",
            "unnamed", "script")


def _fill(table: list, ranges: tuple, code: str) -> None:
    # idna's ranges are integers, start << 32 | end (end excluded).
    for r in ranges:
        lo, hi = r >> 32, r & 0xFFFFFFFF
        table[lo:hi] = [code] * (hi - lo)


@functools.lru_cache(maxsize=1)
def codepoint_rows() -> str:
    """The rows of outbox_idna_codepoint as JSON (computed once a process: it walks every code point)."""
    n = 0x110000
    cls = [None] * n
    for k, name in (("P", "PVALID"), ("J", "CONTEXTJ"), ("O", "CONTEXTO")):
        _fill(cls, idnadata.codepoint_classes[name], k)
    script = [None] * n
    for k in ("Greek", "Hebrew", "Hiragana", "Katakana", "Han"):
        _fill(script, idnadata.scripts[k], k)
    joining = [None] * n
    for k, r in idnadata.joining_types.items():
        _fill(joining, r, k)
    status = [None] * n
    repl = [None] * n
    starts = list(uts46data.uts46_starts) + [n]
    for i in range(len(uts46data.uts46_starts)):
        lo, hi = starts[i], starts[i + 1]
        s = chr(uts46data.uts46_statuses[i])
        status[lo:hi] = [s] * (hi - lo)
        if s == "M":
            repl[lo:hi] = [uts46data.uts46_replacements[i]] * (hi - lo)
    out = []
    prev = None
    cat_, bidi_, comb_, name_ = unicodedata.category, unicodedata.bidirectional, unicodedata.combining, unicodedata.name
    for cp in range(n):
        ch = chr(cp)
        comb = comb_(ch)
        t = (uts46_valid_char(ch), status[cp], repl[cp], cat_(ch), cls[cp], bidi_(ch) or None, joining[cp], comb,
             comb == 0 and not name_(ch, ""), script[cp])
        if t != prev:
            out.append(dict(zip(_COLUMNS, (cp,) + t)))
            prev = t
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))
