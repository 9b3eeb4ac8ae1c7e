"""`python -m bench`: the relay's figures from one command.

    python -m bench all                 # everything, default sizes (several minutes)
    python -m bench all --quick         # a short smoke run
    python -m bench drain --n 50000     # one section
    python -m bench drain --batch-sizes 1000 --n 20000

Results go to bench/results/latest.json (sections run replace their own
section there; `--out` writes elsewhere) and are printed as tables.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console

from . import payloads, report
from .env import BenchEnv, machine_info

SECTIONS = ("drain", "baseline", "phases", "concurrency", "growth", "memory", "ses")


def _ints(value: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in value.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise click.BadParameter(f"expected comma-separated positive integers, got {value!r}")
    return values


class Config:
    """Sizes of every section; `--quick` shrinks them all."""

    def __init__(self, quick: bool, n: int | None, batch_sizes: str | None, baseline_n: int | None,
                 processes: str | None, streams: int) -> None:
        self.quick = quick
        self.n = n or (1_000 if quick else 50_000)
        self.batch_sizes = _ints(batch_sizes) if batch_sizes else [10, 100, 500, 1000, 5000]
        self.baseline_n = baseline_n or (200 if quick else min(self.n, 5_000))
        self.processes = _ints(processes) if processes else ([1, 2] if quick else [1, 2, 4, 8])
        self.concurrency_batch = 1000
        self.streams = payloads.STREAMS[:max(1, min(streams, len(payloads.STREAMS)))]
        self.growth = (dict(small=1_000, large=5_000, pending_small=200, pending_large=200, many_pending=2_000,
                            claims=10, claim_batch=10) if quick else
                       dict(small=10_000, large=1_000_000, pending_small=1_000, pending_large=1_000,
                            many_pending=100_000, claims=500, claim_batch=100))
        self.memory_batch_sizes = [10, 1000] if quick and not batch_sizes else self.batch_sizes
        self.ses_n = 30 if quick else 500
        self.instruction_batch_sizes = self.batch_sizes if batch_sizes else ([10, 100] if quick else [10, 1000])
        self.instruction_messages = n or (200 if quick else 5_000)
        self.phases_batch = 1000 if not batch_sizes else max(self.batch_sizes)
        self.phases_n = n or (2_000 if quick else 20_000)


def run_sections(cfg: Config, sections: list[str], *, database_name: str, prefix: str, keep: bool,
                 out: Path, console: Console) -> dict[str, Any]:
    results: dict[str, Any] = {}
    started = time.perf_counter()
    with BenchEnv.open(database_name=database_name, prefix=prefix, keep=keep) as env:
        results["machine"] = machine_info() | env.server_versions()
        results["command"] = "python -m bench " + " ".join(sys.argv[1:])
        steps: dict[str, Callable[[], Any]] = {
            "drain": lambda: _drain(env, cfg, console),
            "baseline": lambda: _baseline(env, cfg, console),
            "concurrency": lambda: _concurrency(env, cfg, console),
            "growth": lambda: _growth(env, cfg, console),
            "memory": lambda: _memory(env, cfg, console),
            "ses": lambda: _ses(env, cfg, console),
            "instructions": lambda: _instructions(env, cfg, console),
            "phases": lambda: _phases(env, cfg, console),
        }
        for name in sections:
            console.print(f"[bold]{name}[/bold] …")
            t = time.perf_counter()
            load = _load_average()
            started_at = results["machine"]["date"] if name == sections[0] else _now()
            results[name] = steps[name]()
            results[name]["section_seconds"] = round(time.perf_counter() - t, 1)
            results[name]["started_at"] = started_at
            results[name]["load_average_at_start"] = load
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    path = report.write(results, out)
    merged = report.json.loads(path.read_text())
    report.show({k: v for k, v in merged.items() if k in results or k in ("targets",)}, console)
    console.print(f"results written to {path}")
    return merged


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _drain(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .drain import drain

    runs = []
    for b in cfg.batch_sizes:
        run = drain(env, n=cfg.n, batch_size=b, streams=cfg.streams)
        console.print(f"  batch {b:>5,}: {run['messages_per_second']:>9,.1f} msg/s "
                      f"({run['statements_per_batch']['max']} statements, "
                      f"{run['redis_round_trips_per_batch']['max']} Redis round trips per batch)")
        runs.append(run)
    return {"messages": cfg.n, "streams": list(cfg.streams), "level": "real handler (functions/relay/app.py)",
            "runs": runs}


def _baseline(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .baseline import run_baseline

    result = run_baseline(env, n=cfg.baseline_n, streams=cfg.streams)
    console.print(f"  per-row worker: {result['messages_per_second']:,.1f} msg/s")
    return result


def _phases(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .phases import run_phases

    result = run_phases(env, n=cfg.phases_n, batch_size=cfg.phases_batch, streams=cfg.streams)
    console.print(f"  batch {result['batch_size']:>5,}: {result['sum_wall_us']} µs per message in "
                  f"{len(result['steps'])} steps")
    return result


def _concurrency(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .concurrency import run_concurrency

    result = run_concurrency(env, n=cfg.n, batch_size=cfg.concurrency_batch, processes=cfg.processes,
                             streams=cfg.streams)
    for r in result["runs"]:
        console.print(f"  {r['processes']} processes: {r['messages_per_second']:,.1f} msg/s, "
                      f"duplicates {r['check']['duplicates']}")
    return result


def _growth(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .growth import run_growth

    result = run_growth(env, **cfg.growth)
    for c in result["cases"]:
        console.print(f"  {c['case']}: median {c['median_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms")
    return result


def _memory(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .memory import run_memory

    result = run_memory(env, batch_sizes=cfg.memory_batch_sizes, streams=cfg.streams)
    for r in result["runs"]:
        console.print(f"  batch {r['batch_size']:>5,}: peak RSS {r['peak_rss_mb']} MB")
    return result


def _ses(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .ses import run_ses

    result = run_ses(env, n=cfg.ses_n)
    console.print(f"  {result['sends_per_second']:.2f} sends/s against MaxSendRate {result['max_send_rate']:g}")
    return result


def _instructions(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .instructions import run_instructions

    result = run_instructions(env, batch_sizes=cfg.instruction_batch_sizes, messages=cfg.instruction_messages,
                              streams=cfg.streams)
    if result.get("skipped"):
        console.print(f"  skipped: {result['skipped']}")
    for r in result["runs"]:
        console.print(f"  batch {r['batch_size']:>5,}: {r['instructions_per_message']:,} instructions per message")
    return result


def _common(f: Callable) -> Callable:
    options = [
        click.option("--quick", is_flag=True, help="Small sizes: a smoke run of every part (about a minute)."),
        click.option("--n", type=int, default=None, help="Messages per drain (default 50,000; quick 1,000)."),
        click.option("--batch-sizes", default=None, help="Comma-separated (default 10,100,500,1000,5000)."),
        click.option("--baseline-n", type=int, default=None, help="Messages for the per-row baseline "
                     "(default min(n, 5,000); its rate does not depend on the backlog size)."),
        click.option("--processes", default=None, help="Process counts for concurrency (default 1,2,4,8)."),
        click.option("--streams", type=int, default=1, show_default=True,
                     help="Number of destination streams the messages are spread over."),
        click.option("--database-name", default="outbox_bench", show_default=True,
                     help="The bench's own database (created, migrated, dropped after)."),
        click.option("--prefix", default="bench.", show_default=True, help="Redis key prefix of every stream."),
        click.option("--keep", is_flag=True, help="Keep the bench database afterwards."),
        click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=report.LATEST,
                     show_default=True, help="JSON results file."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.group()
def main() -> None:
    """Benchmarks of the outbox relay (see the README, section Benchmark)."""


def _make(name: str, sections: tuple[str, ...], help_text: str) -> None:
    @main.command(name=name, help=help_text)
    @_common
    def command(quick: bool, n: int | None, batch_sizes: str | None, baseline_n: int | None,
                processes: str | None, streams: int, database_name: str, prefix: str, keep: bool,
                out: Path) -> None:
        cfg = Config(quick, n, batch_sizes, baseline_n, processes, streams)
        merged = run_sections(cfg, list(sections), database_name=database_name, prefix=prefix, keep=keep,
                              out=out, console=_console())
        failed = [s for s in sections if isinstance(merged.get(s), dict) and not _checks_ok(merged[s])]
        if failed:
            raise click.ClickException(f"correctness check failed in: {', '.join(failed)}")


def _console() -> Console:
    """A console wide enough for the tables, also when the output is not a terminal."""
    console = Console()
    if not console.is_terminal or console.width < 140:
        console = Console(width=160)
    return console


def _checks_ok(section: dict[str, Any]) -> bool:
    if "check" in section:
        return bool(section["check"]["ok"])
    runs = section.get("runs") or []
    return all(r.get("check", {}).get("ok", True) for r in runs)


_make("all", SECTIONS, "Every section: drain, baseline, phases, concurrency, growth, memory, SES.")
_make("drain", ("drain",), "Drain throughput of the Redis channel per batch size.")
_make("baseline", ("baseline",), "The per-row worker this project replaces.")
_make("compare", ("drain", "baseline"), "Drain per batch size and the per-row baseline, in one run.")
_make("phases", ("phases",), "Where one invocation's time goes, step by step: batch 1,000 (or the largest "
      "of --batch-sizes), 20,000 messages (or --n; 2,000 with --quick).")
_make("concurrency", ("concurrency",), "1, 2, 4, 8 processes draining one backlog; duplicates checked.")
_make("growth", ("growth",), "Claim latency with 10,000 vs 1,000,000 rows and 100,000 pending; plans.")
_make("memory", ("memory",), "Peak resident memory of one invocation per batch size.")
_make("ses", ("ses",), "SES through moto: sends per second against MaxSendRate.")
_make("instructions", ("instructions",), "Relay-process instructions per message (valgrind callgrind; "
      "default batch 10 and 1,000, 5,000 messages); not part of all.")


@main.command(name="instructions-probe", hidden=True)
@click.option("--database-url", required=True)
@click.option("--redis-url", required=True)
@click.option("--batch-size", type=int, required=True)
@click.option("--signals", type=click.Path(file_okay=False, path_type=Path), required=True)
def instructions_probe(database_url: str, redis_url: str, batch_size: int, signals: Path) -> None:
    """(internal) The process callgrind counts (see bench/instructions.py)."""
    from .instructions import probe

    probe(database_url, redis_url, batch_size, signals)


@main.command(name="show")
@click.option("--file", "path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=report.LATEST,
              show_default=True)
@click.option("--markdown", is_flag=True, help="Markdown tables, as quoted in the README (Benchmark, Latest figures).")
def show(path: Path, markdown: bool) -> None:
    """Print the figures of a results file (default: the latest run)."""
    results = report.json.loads(path.read_text())
    results["targets"] = report.evaluate(results)
    if markdown:
        click.echo(report.markdown(results))
    else:
        report.show(results, _console())


@main.command(name="memory-probe", hidden=True)
@click.option("--database-url", required=True)
@click.option("--redis-url", required=True)
@click.option("--batch-size", type=int, required=True)
def memory_probe(database_url: str, redis_url: str, batch_size: int) -> None:
    """(internal) One cold invocation in this fresh process; prints its memory as JSON."""
    import json

    from .memory import probe

    click.echo(json.dumps(probe(database_url, redis_url, batch_size)))
