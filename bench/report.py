"""Results: the targets checked, a table on the terminal, and a JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LATEST = RESULTS_DIR / "latest.json"

#: The issue's targets on the reference machine (2 cores, PostgreSQL and Redis on the same host).
TARGETS = {
    "redis_batch_1000_messages_per_second": 25_000,
    "redis_batch_1000_vs_baseline": 60.0,
    "claim_p99_growth_1m_vs_10k": 1.5,
    "peak_rss_mb_batch_5000": 256,
    "ses_fraction_of_max_send_rate": 0.90,
}


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it was met (None: not measured)."""
    checks: list[dict[str, Any]] = []

    def add(name: str, target: str, value: Any, met: bool | None) -> None:
        checks.append({"target": name, "goal": target, "measured": value, "met": met})

    drain = {d["batch_size"]: d for d in results.get("drain", {}).get("runs", [])}
    at_1000 = drain.get(1000)
    rate = at_1000["messages_per_second"] if at_1000 else None
    add("Redis, one invocation, batch 1,000", f">= {TARGETS['redis_batch_1000_messages_per_second']:,} msg/s",
        rate, None if rate is None else rate >= TARGETS["redis_batch_1000_messages_per_second"])
    base = results.get("baseline", {}).get("messages_per_second")
    ratio = round(rate / base, 1) if rate and base else None
    add("... against the per-row baseline (same run)", f">= {TARGETS['redis_batch_1000_vs_baseline']:g}x",
        None if ratio is None else f"{ratio:g}x",
        None if ratio is None else ratio >= TARGETS["redis_batch_1000_vs_baseline"])
    if drain:
        stmts = {b: d["statements_per_batch"]["max"] for b, d in drain.items()}
        trips = {b: d["redis_round_trips_per_batch"]["max"] for b, d in drain.items()}
        flat = len(set(stmts.values())) == 1 and len(set(trips.values())) == 1
        add("Round trips per batch constant over batch sizes",
            "same count at every batch size",
            {"statements": stmts, "redis": trips}, flat)
    growth = results.get("growth", {})
    g = growth.get("p99_ratio_1m_vs_10k")
    add("Claim p99 at 1,000,000 rows vs 10,000", f"<= {TARGETS['claim_p99_growth_1m_vs_10k']:g}x",
        None if g is None else f"{g:g}x (median {growth.get('median_ratio_1m_vs_10k'):g}x)",
        None if g is None else g <= TARGETS["claim_p99_growth_1m_vs_10k"])
    if growth:
        add("Claim plan uses the partial indexes in every case", "both branches on their index, no Seq Scan",
            growth.get("plans_ok"), growth.get("plans_ok"))
    memory = {m["batch_size"]: m for m in results.get("memory", {}).get("runs", [])}
    peak = memory.get(5000, {}).get("peak_rss_mb")
    add("Peak RSS of an invocation at batch 5,000", f"< {TARGETS['peak_rss_mb_batch_5000']} MB",
        peak, None if peak is None else peak < TARGETS["peak_rss_mb_batch_5000"])
    ses = results.get("ses", {})
    frac = ses.get("fraction_of_max_send_rate")
    add("SES sends per second vs MaxSendRate", ">= 90% and never above it",
        None if frac is None else f"{frac:.1%} (busiest second {ses.get('busiest_second')})",
        None if frac is None else (frac >= TARGETS["ses_fraction_of_max_send_rate"]
                                   and ses.get("busiest_second", 0) <= ses.get("max_send_rate", 0)))
    concurrency = results.get("concurrency", {})
    if concurrency:
        ok = all(r["check"]["ok"] for r in concurrency.get("runs", []))
        add("Concurrent invocations deliver each message once", "no duplicate entry, every row delivered", ok, ok)
    return checks


def write(results: dict[str, Any], path: Path = LATEST) -> Path:
    """Write `results` as JSON, merging into sections already in the file (a
    subcommand run alone replaces only its own section)."""
    merged: dict[str, Any] = {}
    if path.exists():
        try:
            merged = json.loads(path.read_text())
        except ValueError:
            merged = {}
    merged.update(results)
    merged["targets"] = evaluate(merged)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2, sort_keys=False) + "\n")
    return path


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def show(results: dict[str, Any], console: Console | None = None) -> None:
    """Print the sections present in `results` as tables."""
    console = console or Console()
    m = results.get("machine")
    if m:
        console.print(f"[bold]Machine[/bold]: {m['nproc']} CPU ({m['cpu_model']}), {m.get('memory_mb')} MB, "
                      f"PostgreSQL {m.get('postgresql')}, Redis {m.get('redis')}, Python {m['python']}, "
                      f"load average at start {m.get('load_average_at_start')}, {m['date']}")
    drain = results.get("drain")
    if drain:
        t = Table(title=f"Drain, Redis channel: {drain['messages']:,} messages, real handler, back to back")
        for col in ("batch", "msg/s", "wall s", "invocations", "stmts/batch", "redis RT/batch",
                    "CPU µs/msg client", "PostgreSQL", "Redis", "GC µs/msg", "check"):
            t.add_column(col, justify="right")
        for d in drain["runs"]:
            cpu = d["cpu_us_per_message"]
            t.add_row(_fmt(d["batch_size"]), _fmt(d["messages_per_second"]), _fmt(d["wall_seconds"]),
                      _fmt(d["invocations"]),
                      f"{d['statements_per_batch']['min']}–{d['statements_per_batch']['max']}",
                      f"{d['redis_round_trips_per_batch']['min']}–{d['redis_round_trips_per_batch']['max']}",
                      _fmt(cpu.get("client")), _fmt(cpu.get("postgresql")), _fmt(cpu.get("redis")),
                      _fmt(d.get("gc", {}).get("us_per_message")),
                      "ok" if d["check"]["ok"] else "FAILED")
        console.print(t)
    base = results.get("baseline")
    if base:
        t = Table(title=f"Baseline: per-row worker, {base['messages']:,} messages")
        for col in ("msg/s", "statements/msg", "transactions/msg", "redis RT/msg",
                    "CPU µs/msg client", "PostgreSQL", "Redis", "check"):
            t.add_column(col, justify="right")
        cpu = base["cpu_us_per_message"]
        t.add_row(_fmt(base["messages_per_second"]), _fmt(base["statements_per_message"]),
                  _fmt(base["transactions_per_message"]), _fmt(base["redis_round_trips_per_message"]),
                  _fmt(cpu.get("client")), _fmt(cpu.get("postgresql")), _fmt(cpu.get("redis")),
                  "ok" if base["check"]["ok"] else "FAILED")
        console.print(t)
    conc = results.get("concurrency")
    if conc:
        t = Table(title=f"Concurrency: {conc['messages']:,} messages, batch {conc['batch_size']:,}, "
                        f"one process per invocation loop")
        for col in ("processes", "msg/s", "wall s", "invocations", "delivered", "stream entries",
                    "distinct ids", "duplicates", "check"):
            t.add_column(col, justify="right")
        for r in conc["runs"]:
            c = r["check"]
            t.add_row(_fmt(r["processes"]), _fmt(r["messages_per_second"]), _fmt(r["wall_seconds"]),
                      _fmt(r["invocations"]), _fmt(r["delivered"]), _fmt(c["stream_entries"]),
                      _fmt(c["distinct_ids"]), _fmt(c["duplicates"]), "ok" if c["ok"] else "FAILED")
        console.print(t)
    growth = results.get("growth")
    if growth:
        t = Table(title=f"Claim latency as the table grows: {growth['claims']} claims of "
                        f"{growth['claim_batch']} per case")
        for col in ("case", "rows", "pending", "median ms", "p99 ms", "max ms", "plan"):
            t.add_column(col, justify="right")
        for c in growth["cases"]:
            t.add_row(c["case"], _fmt(c["rows"]), _fmt(c["pending"]), f"{c['median_ms']:.2f}",
                      f"{c['p99_ms']:.2f}", f"{c['max_ms']:.2f}", "indexes" if c["plan"]["ok"] else "FAILED")
        console.print(t)
    mem = results.get("memory")
    if mem:
        t = Table(title="Memory: peak resident set of one cold invocation in a fresh process")
        for col in ("batch", "peak RSS MB", "RSS before MB", "growth MB", "delivered"):
            t.add_column(col, justify="right")
        for r in mem["runs"]:
            t.add_row(_fmt(r["batch_size"]), _fmt(r["peak_rss_mb"]), _fmt(r["rss_before_mb"]),
                      _fmt(r["growth_mb"]), _fmt(r["delivered"]))
        console.print(t)
    ses = results.get("ses")
    if ses:
        t = Table(title=f"SES (moto, {ses['latency_ms']:g} ms per SendEmail, MaxSendRate {ses['max_send_rate']:g})")
        for col in ("emails", "sends/s", "fraction of rate", "busiest second", "invocations", "check"):
            t.add_column(col, justify="right")
        t.add_row(_fmt(ses["messages"]), _fmt(ses["sends_per_second"]), f"{ses['fraction_of_max_send_rate']:.3f}",
                  _fmt(ses["busiest_second"]), _fmt(ses["invocations"]), "ok" if ses["check"]["ok"] else "FAILED")
        console.print(t)
    ins = results.get("instructions")
    if ins:
        t = Table(title="Relay-process instructions per message (valgrind callgrind)"
                  + (f": skipped, {ins['skipped']}" if ins.get("skipped") else ""))
        for col in ("batch", "messages", "invocations", "instructions", "per message"):
            t.add_column(col, justify="right")
        for r in ins["runs"]:
            t.add_row(_fmt(r["batch_size"]), _fmt(r["messages"]), _fmt(r["invocations"]), _fmt(r["instructions"]),
                      _fmt(r["instructions_per_message"]))
        console.print(t)
    ph = _phases(results)
    if ph:
        t = Table(title=f"Phases of one invocation: batch {ph['batch_size']:,}, {ph['messages']:,} messages, "
                        f"{_fmt(ph['messages_per_second'])} msg/s with the hooks; µs per message")
        for col in ("step", "wall", "relay CPU", "PostgreSQL CPU"):
            t.add_column(col, justify="right")
        for st in ph["steps"]:
            t.add_row(st["step"], _fmt(st["wall_us"]), _fmt(st["relay_cpu_us"]), _fmt(st["postgresql_cpu_us"]))
        t.add_row("sum", _fmt(ph["sum_wall_us"]), "", f"Redis CPU {_fmt(ph['redis_cpu_us'])}")
        console.print(t)
        console.print(f"  claims of a full batch ({ph['batch_size']:,}): first row after "
                      f"{_fmt(ph['claim_first_row_ms_median'])} ms, statement returned "
                      f"{_fmt(ph['claim_rows_ms_median'])} ms later (medians); the claim's PostgreSQL CPU, "
                      f"for the whole statement, is on its first line")
    checks = results.get("targets")
    if checks:
        t = Table(title="Targets")
        for col in ("target", "goal", "measured", "met"):
            t.add_column(col)
        for c in checks:
            met = c["met"]
            t.add_row(c["target"], c["goal"], _fmt(c["measured"]),
                      "–" if met is None else ("[green]yes[/green]" if met else "[red]no[/red]"))
        console.print(t)


def _phases(results: dict[str, Any]) -> dict[str, Any] | None:
    """The phases section, unless it comes from a results file written before
    its steps were renamed (its figures meant something else)."""
    ph = results.get("phases")
    return ph if ph and ph["steps"][1]["step"] == "claim, first row" else None


def _when(section: dict[str, Any]) -> str:
    if not section.get("started_at"):
        return ""
    return f"; run {section['started_at']}, load average {section.get('load_average_at_start')}"


def markdown(results: dict[str, Any]) -> str:
    """The latest figures as Markdown tables (quoted in the README, section Benchmark)."""
    out: list[str] = []
    m = results.get("machine", {})
    if m:
        out.append(f"Machine: {m.get('nproc')} CPU ({m.get('cpu_model')}), {m.get('memory_mb')} MB RAM, "
                   f"{m.get('os')}; PostgreSQL {m.get('postgresql')}, Redis {m.get('redis')}, both on the same "
                   f"host; Python {m.get('python')}, SQLAlchemy {m.get('sqlalchemy')}, pg8000 {m.get('pg8000')}, "
                   f"redis-py {m.get('redis_py')}. Date {m.get('date')}; load average at start "
                   f"{m.get('load_average_at_start')}. Command: `{results.get('command', 'python -m bench all')}`.")
        out.append("")
    drain = results.get("drain")
    if drain:
        out.append(f"Drain, Redis channel ({drain['messages']:,} messages of about 1 KB, {drain['level']}"
                   f"{_when(drain)}):")
        out.append("")
        out.append("| batch | msg/s | statements per batch | Redis round trips per batch "
                   "| CPU µs/msg: relay process | PostgreSQL backend | Redis server | relay's GC µs/msg |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for d in drain["runs"]:
            cpu = d["cpu_us_per_message"]
            out.append(f"| {d['batch_size']:,} | {d['messages_per_second']:,.0f} | {d['statements_per_batch']['max']} "
                       f"| {d['redis_round_trips_per_batch']['max']} | {_fmt(cpu.get('client'))} "
                       f"| {_fmt(cpu.get('postgresql'))} | {_fmt(cpu.get('redis'))} "
                       f"| {_fmt(d.get('gc', {}).get('us_per_message'))} |")
        out.append("")
    base = results.get("baseline")
    if base:
        cpu = base["cpu_us_per_message"]
        out.append(f"Per-row baseline ({base['messages']:,} messages{_when(base)}): "
                   f"{base['messages_per_second']:,.0f} msg/s, "
                   f"{base['statements_per_message']:g} statements in {base['transactions_per_message']} "
                   f"transactions and {base['redis_round_trips_per_message']:g} Redis round trip per message; "
                   f"CPU µs/msg {_fmt(cpu.get('client'))} / {_fmt(cpu.get('postgresql'))} / {_fmt(cpu.get('redis'))}.")
        out.append("")
    conc = results.get("concurrency")
    if conc:
        out.append(f"Concurrency ({conc['messages']:,} messages, batch {conc['batch_size']:,}{_when(conc)}):")
        out.append("")
        out.append("| processes | msg/s | invocations | stream entries | distinct message ids | duplicates |")
        out.append("|---:|---:|---:|---:|---:|---:|")
        for r in conc["runs"]:
            c = r["check"]
            out.append(f"| {r['processes']} | {r['messages_per_second']:,.0f} | {r['invocations']:,} "
                       f"| {c['stream_entries']:,} | {c['distinct_ids']:,} | {c['duplicates']} |")
        out.append("")
    growth = results.get("growth")
    if growth:
        out.append(f"Claim latency ({growth['claims']} claims of {growth['claim_batch']} per case; "
                   f"plans on the partial indexes in every case: {_fmt(growth['plans_ok'])}{_when(growth)}):")
        out.append("")
        out.append("| case | rows present | pending | median ms | p99 ms |")
        out.append("|---|---:|---:|---:|---:|")
        for c in growth["cases"]:
            out.append(f"| {c['case']} | {c['rows']:,} | {c['pending']:,} | {c['median_ms']:.1f} | {c['p99_ms']:.1f} |")
        out.append("")
    mem = results.get("memory")
    if mem:
        out.append("Peak resident memory of one cold invocation (fresh process): " + ", ".join(
            f"batch {r['batch_size']:,}: {r['peak_rss_mb']:.0f} MB" for r in mem["runs"]) + ".")
        out.append("")
    ses = results.get("ses")
    if ses:
        out.append(f"SES (moto, {ses['latency_ms']:g} ms per SendEmail, MaxSendRate {ses['max_send_rate']:g}): "
                   f"{ses['sends_per_second']:.1f} sends/s = {ses['fraction_of_max_send_rate']:.1%} of the rate; "
                   f"busiest one-second window {ses['busiest_second']} sends; {ses['messages']} emails.")
        out.append("")
    ins = results.get("instructions")
    if ins and ins.get("runs"):
        out.append("Relay-process instructions per message (valgrind callgrind; `python -m bench instructions`"
                   f"{_when(ins)}): " + ", ".join(
                       f"batch {r['batch_size']:,}: {r['instructions_per_message']:,}" for r in ins["runs"]) + ".")
        out.append("")
    ph = _phases(results)
    if ph:
        out.append(f"Phases of one invocation (`python -m bench phases`; batch {ph['batch_size']:,}, "
                   f"{ph['messages']:,} messages, {ph['messages_per_second']:,.0f} msg/s with the hooks"
                   f"{_when(ph)}), µs per message; in the claims of a full batch the first row arrived after "
                   f"{_fmt(ph['claim_first_row_ms_median'])} ms and the statement returned "
                   f"{_fmt(ph['claim_rows_ms_median'])} ms later (medians); the claim's PostgreSQL CPU, "
                   f"for the whole statement, is on its first line:")
        out.append("")
        out.append("| step | wall | relay CPU | PostgreSQL CPU |")
        out.append("|---|---:|---:|---:|")
        for st in ph["steps"]:
            out.append(f"| {st['step']} | {_fmt(st['wall_us'])} | {_fmt(st['relay_cpu_us'])} "
                       f"| {_fmt(st['postgresql_cpu_us'])} |")
        out.append(f"| sum (Redis CPU {_fmt(ph['redis_cpu_us'])}, all in publish) | {_fmt(ph['sum_wall_us'])} | | |")
        out.append("")
    checks = results.get("targets")
    if checks:
        out.append("| target | goal | measured | met |")
        out.append("|---|---|---|---|")
        for c in checks:
            measured = c["measured"]
            if isinstance(measured, dict):
                measured = "; ".join(f"{k}: {', '.join(str(x) for x in v.values())}" for k, v in measured.items())
            met = "–" if c["met"] is None else ("yes" if c["met"] else "**no**")
            out.append(f"| {c['target']} | {c['goal']} | {_fmt(measured)} | {met} |")
        out.append("")
    return "\n".join(out)
