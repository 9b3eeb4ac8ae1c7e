"""The bench's figures: drawn from a results file beside the page's tables when
matplotlib is installed, skipped in one line (the tables still written) when it
is not; the page's links do not depend on which."""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

import pytest

from bench import plots, report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _latency_run(rate: int, lags: list[float]) -> dict:
    starts = [-1.0, 9.0, 19.5]
    timeline = [{"source": source, "slot": k, "began": began, "ended": began + 10.5, "container": k % 2,
                 "error": None} for k, (began, source) in enumerate(zip(starts, ("schedule", "schedule",
                                                                                   "self-invoke")))]
    return {"offered_per_second": rate, "seconds": 30.0, "sent": rate * 30, "delivered_per_second": float(rate),
            "handovers": 2, "lag_ms": {"p50": 10.0, "p99": 80.0, "max": 300.0, "mean": 12.0},
            "handover_max_lag_ms": [120.0, 300.0], "without_poller": {"bench_seconds": 0}, "invocations": {},
            "duplicates": 0, "lost": 0, "sustained": True, "check": {"ok": True}, "timeline": timeline,
            "lag_per_second_ms": {"second": list(range(len(lags))), "p50": [v / 4 for v in lags],
                                  "p99": [v / 2 for v in lags], "max": lags}}


def _growth_case(delivered: int, p99: float) -> dict:
    tables = {t: {"table_bytes": delivered * 100, "index_bytes": delivered * 40}
              for t in ("outbox_message", "outbox_message_body", "outbox_message_history")}
    zero = dict.fromkeys(tables, 0)
    return {"case": f"{delivered:,} delivered", "delivered": delivered, "rows": delivered + 100, "pending": 100,
            "seed_seconds": delivered / 10_000,
            "median_ms": 1.0, "p99_ms": p99, "max_ms": p99 + 1, "plan": {"ok": True},
            "size": {"tables": tables, "total_bytes": delivered * 420},
            "enqueue": {"median_ms": 1.0, "p99_ms": 2.0}, "drain": {"messages_per_second": 5000.0},
            "retention": {"purged": delivered // 7, "seconds": 0.5, "wal_bytes": delivered * 100,
                          "wal_bytes_per_row": 700.0, "dead_rows": dict.fromkeys(tables, delivered // 7),
                          "dead_rows_before": zero, "autovacuum_ran": dict.fromkeys(tables, False),
                          "producer": {"p99_ms": 3.0, "max_ms": 4.0}, "vacuum_seconds": 0.2,
                          "vacuum_wal_bytes": 1000}}


def synthetic_results() -> dict:
    """A small results file with every section that has a figure."""
    punctual = {"model": {"key": "punctual"}, "label": "punctual: each run starts on its slot, every 10 s",
                "timeout_seconds": 12.0, "lease_seconds": 40.0, "margin_seconds": 1.0, "seconds": 30.0,
                "runs": [_latency_run(100, [10.0 + (s % 10) for s in range(30)]),
                         _latency_run(1000, [20.0 + 10 * (s % 10) for s in range(30)])]}
    older = dict(punctual, model={"key": "jitter 5 s, missed 0.1"}, label="starts within 5 s, 10% missed",
                 runs=[dict(_latency_run(100, []), lag_per_second_ms=None)])  # a run from before the series
    batch = {"statements_per_batch": {"min": 2, "max": 2}, "redis_round_trips_per_batch": {"min": 1, "max": 1},
             "cpu_us_per_message": {"client": 30.0}}
    return {
        "latency": {"models": {"punctual": punctual, "jitter": older}},
        "batches": {"messages": 1000, "runs": [dict(batch, batch_size=b, messages_per_second=r)
                                               for b, r in ((10, 900.0), (100, 4000.0), (1000, 9000.0))]},
        "concurrency": {"messages": 1000, "batch_size": 100, "runs": [
            {"processes": p, "messages_per_second": r, "invocations": 11,
             "check": {"stream_entries": 1000, "distinct_ids": 1000, "duplicates": 0, "ok": True}}
            for p, r in ((1, 5000.0), (2, 7000.0))]},
        "growth": {"claims": 10, "claim_batch": 10, "plans_ok": True, "days": 7, "enqueues": 20,
                   "drain_messages": 200, "claim_p99_ratio": 1.25, "enqueue_p99_ratio": 1.1, "drain_ratio": 0.9,
                   "server": {"server_version": "15.2", "autovacuum": "on", "shared_buffers": "256MB"},
                   "cases": [_growth_case(1000, 2.0), _growth_case(5000, 2.5)]},
    }


def _links(page: str) -> list[str]:
    return re.findall(r"!\[[^\]]+\]\((img/[^)]+\.png)\)", page)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_the_render_draws_a_png_beside_each_table_it_links(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    page = report.write_docs(synthetic_results(), tmp_path / "benchmark.md")

    links = _links(page.read_text(encoding="utf-8"))
    assert links == ["img/latency-punctual.png", "img/latency-jitter-5-s-missed-0-1.png",
                     "img/throughput-per-batch-size.png", "img/throughput-per-process-count.png",
                     "img/claim-time-as-the-table-grows.png"]
    assert sorted(p.name for p in (tmp_path / "img").iterdir()) == sorted(Path(link).name for link in links)
    for link in links:
        path = tmp_path / link
        assert path.stat().st_size > 0
        width, height = _png_size(path)
        assert width >= 600 and height >= 300, (link, width, height)
    assert "plots skipped" not in capsys.readouterr().out


def test_without_matplotlib_the_tables_are_written_and_one_line_says_plots_were_skipped(tmp_path, monkeypatch,
                                                                                         capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError

    page = report.write_docs(synthetic_results(), tmp_path / "benchmark.md")

    text = page.read_text(encoding="utf-8")
    assert "| batch | msg/s |" in text and "| delivered rows | on disk (message" in text
    assert not (tmp_path / "img").exists()
    out = capsys.readouterr().out.splitlines()
    assert out == [plots.skipped_line()] and "pip install -e '.[plots]'" in out[0]
    # the page is the same as with the figures: its links depend on the results file alone
    assert text == report.docs(synthetic_results())


def test_the_committed_page_links_only_committed_pngs():
    page = report.DOCS.read_text(encoding="utf-8")
    links = _links(page)
    assert links, "docs/benchmark.md links no figure"
    for link in links:
        path = report.DOCS.parent / link
        assert path.exists(), f"{link} is missing: run `python -m bench docs` with the plots extra"
        assert _png_size(path) > (0, 0)
