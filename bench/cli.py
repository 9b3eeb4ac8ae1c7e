"""`python -m bench`: the relay's figures from one command.

    python -m bench all                 # everything, default sizes (several minutes)
    python -m bench all --quick         # a short smoke run
    python -m bench drain --n 50000     # one section
    python -m bench drain --batch-sizes 1000 --n 20000

Results go to bench/results/latest.json (sections run replace their own
section there; `--out` writes elsewhere) and are printed as tables.
"""

from __future__ import annotations

import math
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

SECTIONS = ("limit", "drain", "latency", "ordering", "batches", "baseline", "phases", "concurrency", "recovery",
            "growth", "memory", "ses", "sqs", "sns", "eventbridge", "kinesis")
#: Sections whose invocations (and minimal loops) are held to Lambda's CPU at the function's
#: memory: in processes of their own, or the bench's process while their timed part runs.
#: The others measure what the share does not change (memory, instructions, SES's send rate
#: against moto in this process, the feedback handler's recording).
HELD_SECTIONS = ("limit", "drain", "latency", "ordering", "batches", "baseline", "phases", "concurrency",
                 "recovery", "sqs", "sns", "eventbridge", "kinesis", "redis", "pollers", "catchup",
                 "autoscale")
#: The template's bounds of FunctionMemoryMB.
MEMORY_MB = (128, 10240)


def _ints(value: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in value.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise click.BadParameter(f"expected comma-separated positive integers, got {value!r}")
    return values


class _Number(click.ParamType):
    """A finite number within bounds; refused with one line naming the option (exit status 2)."""

    def __init__(self, what: str, *, at_most: float | None = None, positive: bool = False,
                 integer: bool = False) -> None:
        self.name = what
        self.at_most, self.positive, self.integer = at_most, positive, integer

    def convert(self, value: Any, param: Any, ctx: Any) -> float | int:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value)) if self.integer else float(str(value))
            except ValueError:
                number = None
        low = "greater than 0" if self.positive else "0 or more"
        high = "" if self.at_most is None else f" and at most {self.at_most:g}"
        if number is None or not math.isfinite(number) or (number <= 0 if self.positive else number < 0) \
                or (self.at_most is not None and number > self.at_most):
            self.fail(f"expected {self.name}, {low}{high}, got {value!r}", param, ctx)
        return number


SECONDS = _Number("a number of seconds")
POSITIVE_SECONDS = _Number("a number of seconds", positive=True)
FRACTION = _Number("a fraction", at_most=1.0)
COUNT = _Number("a whole number", positive=True, integer=True)
SEED = _Number("a whole number", integer=True)


class Config:
    """Sizes of every section; `--quick` shrinks them all."""

    def __init__(self, quick: bool, n: int | None, batch_sizes: str | None, baseline_n: int | None,
                 processes: str | None, streams: int, rates: str | None = None,
                 latency_seconds: float | None = None, scheduler: dict[str, Any] | None = None,
                 delivered: list[int] | None = None) -> None:
        self.quick = quick
        self.n = n or (1_000 if quick else 50_000)
        self.batch_sizes = _ints(batch_sizes) if batch_sizes else [10, 100, 500, 1000, 5000]
        self.baseline_n = baseline_n or (200 if quick else min(self.n, 5_000))
        self.processes = _ints(processes) if processes else ([1, 2] if quick else [1, 2, 4, 8])
        self.concurrency_batch = 1000
        self.limit_batch = 1000
        self.drain_batch_sizes = _ints(batch_sizes) if batch_sizes else [100, 1000]
        self.ordering = dict(batch_size=max(self.batch_sizes) if batch_sizes else 1000, key_counts=[10_000, 100, 1],
                             rounds=1 if quick else 5)
        self.latency = dict(
            rates=_ints(rates) if rates else ([100, 1000] if quick else [100, 1000, 10000]),
            seconds=latency_seconds or (8.0 if quick else 130.0),
            model=scheduler_model(quick, **(scheduler or {})), producers=(scheduler or {}).get("producers"),
            batch_size=1000, idle_seconds=2.0 if quick else 10.0, idle_history=5_000 if quick else 100_000)
        self.streams = payloads.STREAMS[:max(1, min(streams, len(payloads.STREAMS)))]
        extra = scheduler or {}
        try:
            counts = _ints(extra["pollers"]) if extra.get("pollers") else [1, 2, 4]
        except click.BadParameter as exc:
            raise click.BadParameter(exc.message, param_hint="'--pollers'") from None
        self.pollers = dict(counts=counts, start_rate=_ints(rates)[0] if rates else (100 if quick else 1000),
                            seconds=latency_seconds or (5.0 if quick else 30.0),
                            max_runs=extra.get("search_runs") or (1 if quick else 6),
                            backlog=500 if quick else 60_000,
                            model=self.latency["model"], batch_size=1000)
        self.catchup = dict(pollers=max(counts), outage=60.0 * (extra.get("outage_minutes") or
                                                                 (0.1 if quick else 15.0)),
                            lead=3.0 if quick else 20.0, tail_at_least=10.0 if quick else 60.0,
                            backlog=self.pollers["backlog"], model=self.latency["model"], batch_size=1000)
        self.autoscale = dict(step_seconds=extra.get("step_seconds") or (10.0 if quick else 240.0),
                              pollers=counts[0] if extra.get("pollers") else 1,
                              pollers_max=extra.get("pollers_max") or 4,
                              add_age_seconds=extra.get("add_age_seconds") or 1.0,
                              model=self.latency["model"], batch_size=1000)
        if self.autoscale["pollers_max"] < self.autoscale["pollers"]:
            raise click.BadParameter(f"must be at least the pollers kept ({self.autoscale['pollers']}), got "
                                     f"{self.autoscale['pollers_max']}", param_hint="'--pollers-max'")
        self.r1 = extra.get("r1")
        self.previous: dict[str, Any] = {}
        self.growth = (dict(delivered=delivered or [1_000, 5_000], pending=200, claims=10, claim_batch=10,
                            enqueues=20, drain=200) if quick else
                       dict(delivered=delivered or [10_000, 10_000_000], pending=1_000, claims=500, claim_batch=100,
                            enqueues=1_000, drain=20_000))
        self.growth |= dict(soak_minutes=extra.get("soak_minutes"), rate=extra.get("rate") or 1000)
        self.soak_only = bool(extra.get("soak_only"))
        if self.soak_only and not self.growth["soak_minutes"]:
            raise click.BadParameter("runs the soak alone: give --soak-minutes too", param_hint="'--soak-only'")
        if self.soak_only and delivered:
            raise click.BadParameter("runs no case: leave --delivered out", param_hint="'--soak-only'")
        self.memory_batch_sizes = [10, 1000] if quick and not batch_sizes else self.batch_sizes
        self.ses_n = 30 if quick else 500
        self.aws = dict(n=n or (100 if quick else 3_000),
                        batch_size=max(self.batch_sizes) if batch_sizes else (100 if quick else 1000),
                        rounds=1 if quick else 5)
        self.feedback = dict(events=200 if quick else 5_000, sends=200 if quick else 2_000, rounds=2 if quick else 4)
        self.recovery = dict(n=n or (2_000 if quick else 100_000),
                             batch_size=max(self.batch_sizes) if batch_sizes else 1000, invocations=4,
                             rounds=1 if quick else 2)
        self.instruction_batch_sizes = self.batch_sizes if batch_sizes else ([10, 100] if quick else [10, 1000])
        self.instruction_messages = n or (200 if quick else 5_000)
        self.phases_batch = 1000 if not batch_sizes else max(self.batch_sizes)
        self.phases_n = n or (2_000 if quick else 20_000)
        self.redis = dict(n=n or (2_000 if quick else 20_000),
                          batch_size=max(self.batch_sizes) if batch_sizes else 1000,
                          streams=10 if quick else 100, failover_n=n or (2_000 if quick else 20_000),
                          wait_samples=50 if quick else 500)


def scheduler_model(quick: bool, *, start_jitter: float = 0.0, missed_runs: float = 0.0, cold_start: float = 0.0,
                    reserved_concurrency: int = 3, period: float | None = None, function_timeout: float | None = None,
                    lease: float | None = None, deadline_margin: float | None = None, seed: int | None = None,
                    **_: Any) -> Any:
    """The latency section's scheduler and function settings: the template's defaults
    (rate(1 minute), timeout 150 s, lease 180 s, margin 5 s) unless options say otherwise;
    `--quick` shortens them (a poller still outlives a period, so no successor is needed)."""
    from .lambda_model import SchedulerModel

    timeout = function_timeout or (10.0 if quick else 150.0)
    margin = deadline_margin if deadline_margin is not None else (1.0 if quick else 5.0)
    if margin >= timeout:
        raise click.BadParameter(f"must be shorter than the function timeout ({timeout:g} s), got {margin:g}",
                                 param_hint="'--deadline-margin'")
    lease = lease or timeout + 30.0
    if lease <= timeout:
        raise click.BadParameter(f"must be longer than the function timeout ({timeout:g} s), got {lease:g}",
                                 param_hint="'--lease'")
    return SchedulerModel(period=period or (3.0 if quick else 60.0), start_jitter=start_jitter,
                          missed_runs=missed_runs, cold_start=cold_start, reserved_concurrency=reserved_concurrency,
                          timeout=timeout, lease=lease, margin=margin, seed=seed)


def _delivered(value: str | None) -> list[int] | None:
    """`--delivered`: the growth section's counts of delivered rows."""
    if value is None:
        return None
    try:
        counts = _ints(value)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint="'--delivered'") from None
    if max(counts) > 100_000_000:
        raise click.BadParameter(f"expected at most 100,000,000 rows, got {value!r}", param_hint="'--delivered'")
    return counts


def _memories(value: str | None) -> list[int]:
    """`--function-memory-mb`: one memory, or several for a sweep (default: the template's)."""
    from .lambda_model import template_function_memory_mb

    if value is None:
        return [template_function_memory_mb()]
    low, high = MEMORY_MB
    try:
        memories = _ints(value)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint="'--function-memory-mb'") from None
    if any(not low <= v <= high for v in memories) or len(set(memories)) < len(memories):
        raise click.BadParameter(f"expected distinct MB between {low:,} and {high:,} (the template's bounds), "
                                 f"got {value!r}", param_hint="'--function-memory-mb'")
    return memories


def run_sections(cfg: Config, sections: list[str], *, database_name: str, prefix: str, keep: bool,
                 out: Path, console: Console, memories: list[int] | None = None,
                 capped: bool = True) -> dict[str, Any]:
    """Run `sections` at each memory of `memories` in turn (default: the template's); the
    results keep the sections at the template's memory, or at the first one when it is not
    among them, and with several memories a summary of each (`memory_sweep`)."""
    from . import lambda_model

    template_mb = lambda_model.template_function_memory_mb()
    memories = memories or [template_mb]
    cpus = [lambda_model.LambdaCpu(mb, capped=capped) for mb in memories]  # refused here, before any work
    kept = template_mb if template_mb in memories else memories[0]
    results: dict[str, Any] = {}
    sweep: list[dict[str, Any]] = []
    started = time.perf_counter()
    if out.exists():  # what a section may take from an earlier run (catchup: the pollers' rates)
        try:
            cfg.previous = report.json.loads(out.read_text())
        except ValueError:
            cfg.previous = {}
    with BenchEnv.open(database_name=database_name, prefix=prefix, keep=keep) as env:
        results["machine"] = machine_info() | env.server_versions()
        results["command"] = "python -m bench " + " ".join(sys.argv[1:])
        for cpu in cpus:
            lambda_model.use(cpu)
            if len(cpus) > 1:
                console.print(f"[bold]{cpu.label()}[/bold]")
            got = _run_each(env, cfg, sections, results["machine"]["date"], console)
            if cpu.memory_mb == kept:
                results.update(got)
            if len(cpus) > 1:
                sweep.append(report.sweep_entry(got, cpu.record()))
        if sweep:
            results["memory_sweep"] = {"run": results["machine"]["date"], "command": results["command"],
                                       "sections": sections, "kept_mb": kept, "memories": sweep}
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    path = report.write(results, out)
    merged = report.json.loads(path.read_text())
    report.show({k: v for k, v in merged.items() if k in results or k in ("targets",)}, console)
    console.print(f"results written to {path}")
    if out.resolve() == report.LATEST.resolve():
        console.print(f"{report.write_docs(merged)} written from them")
    return merged


def _run_each(env: BenchEnv, cfg: Config, sections: list[str], run: str, console: Console) -> dict[str, Any]:
    """Each section once, at the CPU `lambda_model.use` set."""
    from . import lambda_model

    results: dict[str, Any] = {}
    steps: dict[str, Callable[[], Any]] = {
        "limit": lambda: _limit(env, cfg, console),
        "drain": lambda: _drain(env, cfg, console),
        "latency": lambda: _latency(env, cfg, console),
        "ordering": lambda: _ordering(env, cfg, console),
        "batches": lambda: _batches(env, cfg, console),
        "baseline": lambda: _baseline(env, cfg, console),
        "concurrency": lambda: _concurrency(env, cfg, console),
        "recovery": lambda: _recovery(env, cfg, console),
        "growth": lambda: _growth(env, cfg, console),
        "memory": lambda: _memory(env, cfg, console),
        "ses": lambda: _ses(env, cfg, console),
        "sqs": lambda: _aws(env, cfg, console, "sqs"),
        "sns": lambda: _aws(env, cfg, console, "sns"),
        "eventbridge": lambda: _aws(env, cfg, console, "eventbridge"),
        "kinesis": lambda: _aws(env, cfg, console, "kinesis"),
        "feedback": lambda: _feedback(env, cfg, console),
        "instructions": lambda: _instructions(env, cfg, console),
        "phases": lambda: _phases(env, cfg, console),
        "redis": lambda: _redis(env, cfg, console),
        "pollers": lambda: _pollers(env, cfg, console),
        "catchup": lambda: _catchup(env, cfg, console, results),
        "autoscale": lambda: _autoscale(env, cfg, console, results),
    }
    for name in sections:
        console.print(f"[bold]{name}[/bold] …")
        t = time.perf_counter()
        load = _load_average()
        started_at = _now()
        lambda_model.CPU.record()  # counts start with the section
        results[name] = steps[name]()
        results[name]["section_seconds"] = round(time.perf_counter() - t, 1)
        results[name]["started_at"] = started_at
        results[name]["load_average_at_start"] = load
        results[name]["run"] = run
        results[name]["cpu"] = lambda_model.CPU.record() if name in HELD_SECTIONS else \
            {"function_memory_mb": lambda_model.CPU.memory_mb, "capped": False, "label": "uncapped"}
        if name == "latency":  # its models are kept across runs: each says how it ran
            for entry in results[name]["models"].values():
                entry["cpu"] = results[name]["cpu"]
    return results


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _limit(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .limit import run_limit

    result = run_limit(env, n=cfg.n, batch_size=cfg.limit_batch, streams=cfg.streams)
    for r in result["runs"]:
        console.print(f"  {r['processes']} process{'es' if r['processes'] > 1 else ''}: "
                      f"{r['messages_per_second']:,.1f} msg/s")
    return result


def _drain(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .drain import run_drain

    result = run_drain(env, n=cfg.n, batch_sizes=cfg.drain_batch_sizes, streams=cfg.streams)
    for r in result["runs"]:
        console.print(f"  drain mode, batch {r['batch_size']:>5,}: {r['messages_per_second']:>9,.1f} msg/s "
                      f"in one invocation ({r['batches']} batches)")
    two = result["two_invocations"]
    console.print(f"  two invocations at once, batch {two['batch_size']:,}: {two['messages_per_second']:,.1f} msg/s")
    lay = result["layouts"]
    console.print(f"  entry layouts, traced messages, batch {lay['batch_size']:,} (median of {lay['rounds']}): "
                  f"cloudevents / fields = {lay['cloudevents_vs_fields']}x "
                  f"({lay['cloudevents']['messages_per_second']:,.1f} / {lay['fields']['messages_per_second']:,.1f} "
                  f"msg/s; Redis round trips per batch {lay['cloudevents']['redis_round_trips_per_batch']} / "
                  f"{lay['fields']['redis_round_trips_per_batch']})")
    return result


def _latency(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .latency import run_latency

    result = run_latency(env, streams=cfg.streams, **cfg.latency)
    for entry in result["models"].values():
        console.print(f"  {entry['label']}:")
        for r in entry["runs"]:
            lag, inv, gap = r["lag_ms"], r["invocations"], r["without_poller"]
            console.print(
                f"  offered {r['offered_per_second']:>6,}/s: delivered {r['delivered_per_second']:,.1f}/s, "
                f"lag p50 {lag['p50']} ms, p99 {lag['p99']} ms, max {lag['max']} ms; "
                f"{gap.get('registry_seconds', '–')} s without a poller (bench: {gap['bench_seconds']} s); "
                f"{r['poller_seconds_per_second']} poller-s/s; started by schedule {inv['by_schedule']}, "
                f"by self-invoke {inv['by_self_invoke']}, missed {inv['missed']}, throttled {inv['throttled']}; "
                f"duplicates {r['duplicates']}, lost {r['lost']}{'' if r['sustained'] else ' (not sustained)'}")
    idle = result["idle"]
    console.print(f"  idle: {idle['statements_per_poll']} statements and {idle['redis_round_trips_per_poll']} Redis "
                  f"round trips per poll, {idle['polls_per_second']} polls/s, "
                  f"{idle.get('registry_statements_per_second')} registry statements/s")
    return result


def _pollers(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .scaling import run_pollers

    result = run_pollers(env, streams=cfg.streams, **cfg.pollers)
    for c in result["counts"]:
        for r in c["runs"]:
            cpu = r["cpu_cores"] or {}
            console.print(f"  {c['pollers']} poller{'s' if c['pollers'] > 1 else ''}, offered "
                          f"{r['offered_per_second']:>6,}/s: delivered {r['delivered_per_second']:,.1f}/s, lag p99 "
                          f"{r['lag_ms']['p99']} ms; PostgreSQL {cpu.get('postgresql_all')} cores, machine "
                          f"{cpu.get('machine_busy')} of {cpu.get('machine_cores')}; {r['keys_out_of_order']} keys "
                          f"out of order, {r['lost']} lost, {r['duplicates']} duplicates"
                          f"{'' if r['sustained'] else ' (not sustained)'}")
        d = c["drain"]
        console.print(f"  {c['pollers']} poller{'s' if c['pollers'] > 1 else ''}: sustained "
                      f"{_fmt_rate(c['sustained_per_second'])}/s ({c['vs_one'] or '–'}x one); a backlog of "
                      f"{d['messages']:,} drained at {_fmt_rate(d['drain_per_second'])}/s ({d['vs_one'] or '–'}x one), "
                      f"{d['run']['keys_out_of_order']} keys out of order, {d['run']['lost']} lost")
    return result


def _fmt_rate(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}"


def _catchup(env: BenchEnv, cfg: Config, console: Console, results: dict[str, Any]) -> dict[str, Any]:
    """R1: `--r1`, else one poller's sustained rate of this run's pollers section, else the results file's."""
    from .scaling import run_catchup

    n = cfg.catchup["pollers"]
    pollers = results.get("pollers") or cfg.previous.get("pollers")
    counts = {c["pollers"]: c for c in (pollers or {}).get("counts", [])}
    r1 = cfg.r1 or (counts.get(1) or {}).get("sustained_per_second")
    if not r1:
        raise click.ClickException("catchup needs one poller's sustained rate: run `python -m bench pollers` "
                                   "first, or pass --r1")
    result = run_catchup(env, r1=r1, streams=cfg.streams, **cfg.catchup)
    if "skipped" in result:
        console.print(f"  skipped: {result['skipped']}")
        return result
    console.print(f"  {n} pollers, {result['offered_per_second']:,}/s offered, downstream down "
                  f"{result['outage_seconds']:g} s: {result['backlog_at_restart']:,} waiting at the restart, drained "
                  f"in {result['backlog_drained_seconds']} s at {_fmt_rate(result['drain_per_second'])}/s "
                  f"({result['drain_vs_reference'] or '–'}x {n} pollers' drain of as large a backlog under the same "
                  f"load, {result['drain_vs_unloaded'] or '–'}x their drain with no producer); lag normal again "
                  f"after {result['caught_up_after_seconds'] or '(not while the producers ran)'} s; "
                  f"{result['check']['keys_out_of_order']} keys out "
                  f"of order, {result['check']['lost']} lost, {result['check']['duplicates']} duplicates")
    return result


def _autoscale(env: BenchEnv, cfg: Config, console: Console, results: dict[str, Any]) -> dict[str, Any]:
    """R1: `--r1`, else one poller's sustained rate of this run's pollers section, else the results file's."""
    from .autoscale import run_autoscale

    pollers, source = results.get("pollers"), "this run's pollers section"
    if not pollers and cfg.previous.get("pollers"):
        pollers, source = cfg.previous["pollers"], f"the pollers section of {cfg.previous['pollers'].get('run')}"
    r1 = (cfg.r1, "--r1") if cfg.r1 else ((pollers or {}).get("r1_per_second"), source)
    if not r1[0]:
        raise click.ClickException("autoscale needs one poller's sustained rate: run `python -m bench pollers` "
                                   "first, or pass --r1")
    result = run_autoscale(env, r1=r1[0], r1_from=r1[1], streams=cfg.streams, **cfg.autoscale)
    for s in result["steps"]:
        console.print(f"  {s['fraction']:g} x R1, {s['offered_per_second']:,}/s offered: delivered "
                      f"{_fmt_rate(s['delivered_per_second'])}/s, most pollers {s['live_pollers_most']}, "
                      f"{s['poller_seconds_per_second']} poller-seconds/s ({s['vs_needs']}x the {s['needs']} needed)")
    for c in result["changes"]:
        console.print(f"  step {c['direction']} at {c['at_second']:g} s: pollers at {c['needs_after']} after "
                      f"{c['followed_after_seconds'] if c['followed_after_seconds'] is not None else '(never)'} s")
    lag, check = result["lag_outside_steps_ms"], result["check"]
    console.print(f"  lag outside the steps p50 {lag['p50']} ms, p99 {lag['p99']} ms; {result['vs_needs']}x the "
                  f"poller-seconds needed; {check['keys_out_of_order']} keys out of order, {check['lost']} lost, "
                  f"{check['duplicates']} duplicates")
    return result


def _ordering(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .ordering import run_ordering

    result = run_ordering(env, n=cfg.n, streams=cfg.streams, **cfg.ordering)
    for r in result["runs"]:
        keys = "no keys" if r["keys"] is None else f"{r['keys']:,} key{'s' if r['keys'] > 1 else ''}"
        console.print(f"  {keys:>12}: {r['messages_per_second']:>9,.1f} msg/s ({r['vs_keyless']:.2f}x keyless), "
                      f"{r['check']['order_violations']} out of order")
    two = result["two_invocations"]
    console.print(f"  two invocations over {two['keys']:,} keys: {two['messages_per_second']:,.1f} msg/s "
                  f"({two['vs_one_invocation']:.2f}x one), {two['check']['order_violations']} out of order")
    return result


def _batches(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .drain import batches

    runs = []
    for b in cfg.batch_sizes:
        run = batches(env, n=cfg.n, batch_size=b, streams=cfg.streams)
        console.print(f"  batch {b:>5,}: {run['messages_per_second']:>9,.1f} msg/s "
                      f"({run['statements_per_batch']['max']} statements, "
                      f"{run['redis_round_trips_per_batch']['max']} Redis round trips per batch)")
        runs.append(run)
    return {"messages": cfg.n, "streams": list(cfg.streams), "mode": "batch",
            "level": "real handler (functions/relay/app.py)", "runs": runs}


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


def _recovery(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .recovery import run_recovery

    result = run_recovery(env, streams=cfg.streams, **cfg.recovery)
    for r in result["runs"]:
        console.print(f"  {r['kind']:>8}: {r['wall_seconds']:,.2f} s ({r['messages_per_second']:,.1f} msg/s), "
                      f"{r['invocations']} invocations, {r['claims']} claims, {r['suspects']} suspects"
                      f"{'' if r['check']['ok'] else ' (check FAILED)'}")
    console.print(f"  recovery / drain: {result['recovery_vs_drain']:.2f}x")
    p = result["poison"]
    c = p["check"]
    console.print(f"  a poison among them: dead {c['poison_dead']} after {c['poison_attempts']} of "
                  f"{c['max_attempts']} attempts, {c['invocations_killed']} invocations killed over "
                  f"{len(p['passes'])} passes, other dead {c['other_dead']}, duplicates {c['duplicates']}, "
                  f"lost {c['lost']}; first pass {p['first_pass_seconds']:,.2f} s")
    return result


def _growth(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .growth import run_growth, run_soak_alone, section_ok

    # A run of one half (the cases, or the soak alone) keeps the other half of the results file,
    # each labelled with its own run.
    previous = cfg.previous.get("growth") or {}
    if cfg.soak_only:
        if not previous.get("cases"):
            raise click.UsageError("--soak-only: the results file has no growth cases to keep; run "
                                   "`python -m bench growth` first")
        cases_run = previous.get("cases_run") or {k: previous.get(k) for k in ("started_at", "load_average_at_start")}
        soak = run_soak_alone(env, minutes=cfg.growth["soak_minutes"], rate=cfg.growth["rate"])
        result = previous | {"cases_run": cases_run, "soak": soak}
    else:
        result = run_growth(env, **cfg.growth)
        if result["soak"] is None and (previous.get("soak") or {}).get("started_at"):
            result["soak"] = previous["soak"]
    result["check"] = {"ok": section_ok(result["cases"], result["soak"])}
    for c in result["cases"]:
        drop, delete = c["retention"]["drop"], c["retention"]["delete"]
        console.print(f"  {c['case']}: claim p99 {c['p99_ms']:.2f} ms (planning p99 {c['planning']['p99_ms']:.2f} ms), "
                      f"enqueue p99 {c['enqueue']['p99_ms']:.2f} ms, drain {c['drain']['messages_per_second']:,.0f} "
                      f"msg/s, {c['size']['total_bytes'] / 2**20:,.0f} MiB; a day of {delete['purged']:,} rows: drop "
                      f"{drop['seconds']:,.2f} s, {drop['wal_bytes'] / 2**20:,.2f} MiB WAL, producer waited at most "
                      f"{drop['producer'].get('max_ms', 0):,.0f} ms; DELETE {delete['seconds']:,.2f} s, "
                      f"{delete['wal_bytes'] / 2**20:,.2f} MiB WAL, {sum(delete['dead_rows'].values()):,} dead rows")
    soak = result.get("soak")
    if soak:
        console.print(f"  soak {soak['minutes']:g} min at {soak['offered_per_second']:,.0f} msg/s: claim p99 "
                      f"{soak['claim_p99_ratio']}x last/first, lag p99 {soak['lag_p99_ratio']}x, size after drops "
                      f"max/min {soak['bytes_after_drops_max_over_min']}, rows lost {soak['rows_lost']}")
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


def _aws(env: BenchEnv, cfg: Config, console: Console, channel: str) -> dict[str, Any]:
    from .aws_channels import run_aws_channel

    result = run_aws_channel(env, channel, **cfg.aws)
    for r in result["runs"]:
        m, d = r["minimal"], r["relay"]
        console.print(f"  {r['variant']:>8}: relay {d['messages_per_second']:,.1f} msg/s, minimal loop "
                      f"{m['messages_per_second']:,.1f} msg/s ({r['vs_minimal']:.2f}x); {d['calls_per_batch']} "
                      f"{result['service']} calls and {d['statements_per_batch']} statements per batch"
                      f"{'' if r['check']['ok'] else ' (check FAILED)'}")
    return result


def _feedback(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .feedback import run_feedback

    result = run_feedback(env, **cfg.feedback)
    console.print(f"  {result['recording']['events_per_second']:,} feedback events recorded/s; send path with "
                  f"suppression on: {result['send_path']['ratio_on_to_off']:.3f}x off")
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


def _redis(env: BenchEnv, cfg: Config, console: Console) -> dict[str, Any]:
    from .redis_on_aws import run_redis

    result = run_redis(env, **cfg.redis)
    if result.get("skipped"):
        console.print(f"  skipped: {result['skipped']}")
        return result
    for r in result["runs"]:
        console.print(f"  {r['topology']}, WAIT {r['wait_replicas']}: {r['messages_per_second']:,.1f} msg/s "
                      f"({r['redis_round_trips_per_batch']} Redis round trips per batch)")
    f = result["failover"]
    console.print(f"  failover mid-drain, WAIT 1: {f['recorded_delivered_and_missing']} recorded delivered and "
                  f"missing, {f['duplicate_entries']} duplicate entries")
    return result


def _common(f: Callable) -> Callable:
    options = [
        click.option("--quick", is_flag=True, help="Small sizes: a smoke run of every part (about a minute)."),
        click.option("--n", type=int, default=None, help="Messages per drain (default 50,000; quick 1,000)."),
        click.option("--batch-sizes", default=None, help="Comma-separated (default 10,100,500,1000,5000)."),
        click.option("--baseline-n", type=int, default=None, help="Messages for the per-row baseline "
                     "(default min(n, 5,000); its rate does not depend on the backlog size)."),
        click.option("--processes", default=None, help="Process counts for concurrency (default 1,2,4,8)."),
        click.option("--rates", default=None, help="Offered rates of the latency section, msg/s (default "
                     "100,1000,10000; the highest is lowered until the machine sustains it)."),
        click.option("--latency-seconds", type=float, default=None,
                     help="How long the producer runs at each rate (default 130; quick 8)."),
        click.option("--period", type=POSITIVE_SECONDS, default=None, metavar="SECONDS",
                     help="Latency: seconds between scheduled slots (default 60, the template's rate(1 minute); "
                     "quick 3)."),
        click.option("--start-jitter", type=SECONDS, default=0.0, metavar="SECONDS",
                     help="Latency: each scheduled run starts uniformly at random within this many seconds after "
                     "its slot (default 0: on its slot)."),
        click.option("--missed-runs", type=FRACTION, default=0.0, metavar="FRACTION",
                     help="Latency: this share of the scheduled runs never starts, chosen at random (default 0)."),
        click.option("--cold-start", type=SECONDS, default=0.0, metavar="SECONDS",
                     help="Latency: each invocation waits this long before its handler runs, counted against its "
                     "timeout (default 0)."),
        click.option("--reserved-concurrency", type=COUNT, default=3, show_default=True, metavar="N",
                     help="Latency: invocations at once; one more is throttled (retried within 60 s)."),
        click.option("--function-timeout", type=POSITIVE_SECONDS, default=None, metavar="SECONDS",
                     help="Latency: the function's timeout (default 150, the template's; quick 10)."),
        click.option("--lease", type=POSITIVE_SECONDS, default=None, metavar="SECONDS",
                     help="Latency: OUTBOX_LEASE_SECONDS (default the timeout + 30, as the template's 180)."),
        click.option("--deadline-margin", type=SECONDS, default=None, metavar="SECONDS",
                     help="Latency: OUTBOX_DEADLINE_MARGIN_SECONDS (default 5; quick 1)."),
        click.option("--producers", type=COUNT, default=None, metavar="N",
                     help="Latency: producer processes sharing the offered rate (default one per 500 msg/s, "
                     "at most 4)."),
        click.option("--pollers", default=None, metavar="N[,N...]",
                     help="Pollers: OUTBOX_POLLERS counts whose sustained rate is searched (default 1,2,4); "
                     "catchup: the largest is the channel's pollers (default 4)."),
        click.option("--search-runs", type=COUNT, default=None, metavar="N",
                     help="Pollers: offered rates tried per count at most (default 6; quick 1); --rates gives "
                     "the first (default 1,000)."),
        click.option("--outage-minutes", type=_Number("a number of minutes", positive=True), default=None,
                     metavar="MINUTES", help="Catchup: how long the downstream is down (default 15; quick 0.1)."),
        click.option("--r1", type=_Number("messages per second", positive=True), default=None, metavar="MSG/S",
                     help="Catchup, autoscale: one poller's sustained rate (default: the pollers section of this "
                     "run or of the results file); catchup offers half of it."),
        click.option("--step-seconds", type=POSITIVE_SECONDS, default=None, metavar="SECONDS",
                     help="Autoscale: how long each step of the offered load lasts (default 240; quick 10)."),
        click.option("--pollers-max", type=COUNT, default=None, metavar="N",
                     help="Autoscale: OUTBOX_POLLERS_MAX (default 4); OUTBOX_POLLERS is --pollers (default 1)."),
        click.option("--add-age-seconds", type=POSITIVE_SECONDS, default=None, metavar="SECONDS",
                     help="Autoscale: OUTBOX_POLLERS_ADD_AGE_SECONDS (default 1, the template's)."),
        click.option("--seed", type=SEED, default=None, metavar="N",
                     help="Latency: seed of the scheduler's random draws (default: a new one, recorded)."),
        click.option("--function-memory-mb", default=None, metavar="MB[,MB...]",
                     help="The function's memory: every process that runs invocations, and the minimal loop's, is "
                     "held to Lambda's CPU share at it (memory / 1,769 MB of a core, at most the machine's). "
                     "Default: the template's FunctionMemoryMB. Several (e.g. 512,1024,1769) run the sections at "
                     "each in turn; the results keep the template's memory and a summary of each."),
        click.option("--uncapped", is_flag=True,
                     help="Hold no process to Lambda's CPU share (the figures are labelled uncapped)."),
        click.option("--delivered", default=None, metavar="N[,N...]",
                     help="Growth: delivered rows present, one case each (default 10,000 and 10,000,000; "
                     "quick 1,000 and 5,000; at most 100,000,000)."),
        click.option("--soak-minutes", type=_Number("a number of minutes", positive=True), default=None,
                     metavar="MINUTES", help="Growth: also run producers and a relay this long with the delivered "
                     "window compressed into the run, days dropped during it (default: no soak)."),
        click.option("--soak-only", is_flag=True,
                     help="Growth: run the soak alone; the cases stay those of the results file. A run without "
                     "--soak-minutes keeps the results file's soak alike. Each is labelled with its own run."),
        click.option("--rate", type=COUNT, default=None, metavar="MSG/S",
                     help="Growth: the soak's offered rate (default 1,000)."),
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
    """Benchmarks of the outbox relay (docs/benchmark.md)."""


def _make(name: str, sections: tuple[str, ...], help_text: str) -> None:
    @main.command(name=name, help=help_text)
    @_common
    def command(quick: bool, n: int | None, batch_sizes: str | None, baseline_n: int | None,
                processes: str | None, rates: str | None, latency_seconds: float | None, streams: int,
                database_name: str, prefix: str, keep: bool, out: Path, function_memory_mb: str | None,
                uncapped: bool, delivered: str | None, **scheduler: Any) -> None:
        from .lambda_model import CpuCapError

        cfg = Config(quick, n, batch_sizes, baseline_n, processes, streams, rates, latency_seconds, scheduler,
                     _delivered(delivered))
        try:
            merged = run_sections(cfg, list(sections), database_name=database_name, prefix=prefix, keep=keep,
                                  out=out, console=_console(), memories=_memories(function_memory_mb),
                                  capped=not uncapped)
        except CpuCapError as exc:
            raise click.ClickException(str(exc)) from None
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
    layouts = section.get("layouts") or {}
    return all(r.get("check", {}).get("ok", True) for r in runs) \
        and all(v.get("ok", True) for v in layouts.values() if isinstance(v, dict))


_make("all", SECTIONS, "Every section: limit, drain, latency, ordering, batches, baseline, phases, concurrency, "
      "recovery, growth, memory, SES, SQS, SNS, EventBridge.")
_make("limit", ("limit",), "The minimal loop (claim 1,000, pipelined XADD, one UPDATE), one process and two.")
_make("drain", ("limit", "drain"), "The minimal loop, then drain mode in one invocation at batch 100 and 1,000 "
      "(or --batch-sizes) and in two at once, as ratios to it; the two entry layouts (OUTBOX_REDIS_FORMAT) "
      "on traced messages, as a ratio.")
_make("latency", ("limit", "latency"), "Commit-to-stream lag under a steady offered rate with latency-mode "
      "pollers handing over, started as AWS's scheduler starts them (--start-jitter, --missed-runs, --cold-start) "
      "or themselves, seconds without a poller, and the idle cost.")
_make("ordering", ("limit", "ordering"), "Per-key ordering's cost: one drain-mode invocation at batch 1,000 "
      "without keys and over 10,000, 100 and 1 keys (median of 3 interleaved rounds), and two at once over "
      "10,000 keys; order checked in the stream.")
_make("throughput", ("limit", "drain", "ordering", "batches"), "The minimal loop, drain mode, ordering keys and "
      "batch mode in one run, so every throughput figure has its ratio to the same run's minimal loop.")
_make("batches", ("limit", "batches"), "Batch mode (one batch per invocation) back to back, per batch size.")
_make("baseline", ("baseline",), "The per-row worker this project replaces.")
_make("pollers", ("pollers",), "Sustained latency-mode rate (lag p99 <= 500 ms) of 1, 2 and 4 pollers "
      "(OUTBOX_POLLERS, or --pollers) held to Lambda's CPU, as ratios to one; PostgreSQL's CPU; per-key order "
      "checked; not part of all.")
_make("catchup", ("catchup",), "A downstream outage (the bench's own Redis killed for --outage-minutes, default 15) "
      "under half of one poller's rate with ordering keys, then the backlog drained by --pollers (default 4): "
      "drain rate vs the same pollers' drain into that Redis of as large a backlog on the producers' keys while "
      "they offer as much (and vs their drain with no producer), on a PostgreSQL of the section's own, time until "
      "lag is normal, order, lost, duplicates; not part of all.")
_make("scaling", ("pollers", "catchup"), "pollers, then catchup, in one run (its ratios within it).")
_make("autoscale", ("autoscale",), "Offered load stepped from 10 % of one poller's sustained rate (R1: --r1, or "
      "the pollers section) to 300 % and back (--step-seconds each), OUTBOX_POLLERS_MAX --pollers-max: how soon "
      "the live pollers follow each step, lag p99 outside the steps, poller-seconds vs what the load needs; order, "
      "lost, duplicates checked; not part of all.")
_make("compare", ("limit", "batches", "baseline"), "Batch mode per batch size and the per-row baseline, in one run.")
_make("phases", ("phases",), "Where one invocation's time goes, step by step: batch 1,000 (or the largest "
      "of --batch-sizes), 20,000 messages (or --n; 2,000 with --quick).")
_make("concurrency", ("concurrency",), "1, 2, 4, 8 processes draining one backlog; duplicates checked.")
_make("recovery", ("recovery",), "Recovery after a fleet-wide crash: 4 drain-mode invocations at once over 100,000 "
      "expired leases (or --n; 2,000 with --quick) vs the same over 100,000 fresh messages, in interleaved rounds; "
      "then with a poison message among them, which must die alone after exactly its attempts.")
_make("growth", ("growth",), "On a PostgreSQL of its own with autovacuum on, with 10,000 and 10,000,000 delivered "
      "rows (--delivered): claim and enqueue p99, drain rate, size on disk, and a day's retention purge.")
_make("memory", ("memory",), "Peak resident memory of one invocation per batch size.")
_make("ses", ("ses",), "SES through moto: sends per second against MaxSendRate.")
for _channel, _what in (("sqs", "SQS through moto (standard and FIFO queues)"),
                        ("sns", "SNS through moto (standard and FIFO topics)"),
                        ("eventbridge", "EventBridge through moto (a bus)"),
                        ("kinesis", "Kinesis through moto (a stream of 4 shards, keyless and 1,000 keys)")):
    _make(_channel, (_channel,), f"{_what}: drain-mode msg/s as a ratio to the channel's minimal loop on the same "
          "server, HTTP calls and statements per batch.")
_make("aws", ("sqs", "sns", "eventbridge", "kinesis"), "SQS, SNS, EventBridge and Kinesis through one moto server, "
      "in one run.")
_make("feedback", ("feedback",), "SES feedback: events recorded per second through the feedback handler, and "
      "the SES send path with the suppression list on as a ratio to off (interleaved rounds); not part of all.")
_make("redis", ("redis",), "Redis as on AWS, on servers of its own: one node vs a cluster of 3 primaries, WAIT 1 vs "
      "none (batch 1,000 over 100 streams, 20,000 messages), a primary killed mid-drain with WAIT 1; not part of all.")
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
@click.option("--markdown", is_flag=True, help='Markdown tables, as in docs/benchmark.md, "Latest figures".')
def show(path: Path, markdown: bool) -> None:
    """Print the figures of a results file (default: the latest run)."""
    results = report.json.loads(path.read_text())
    results["targets"] = report.evaluate(results)
    if markdown:
        click.echo(report.markdown(results))
    else:
        report.show(results, _console())


@main.command(name="docs")
@click.option("--file", "path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=report.LATEST,
              show_default=True)
def docs(path: Path) -> None:
    """Write docs/benchmark.md again from a results file (after editing bench/method.md)."""
    written = report.write_docs(report.json.loads(path.read_text()))
    click.echo(f"{written} written from {path}")


@main.command(name="aws-server", hidden=True)
def aws_server() -> None:
    """(internal) moto in server mode for the SQS, SNS, EventBridge and Kinesis sections (see bench/aws_channels.py)."""
    from .aws_channels import serve

    serve()


@main.command(name="memory-probe", hidden=True)
@click.option("--database-url", required=True)
@click.option("--redis-url", required=True)
@click.option("--batch-size", type=int, required=True)
def memory_probe(database_url: str, redis_url: str, batch_size: int) -> None:
    """(internal) One cold invocation in this fresh process; prints its memory as JSON."""
    import json

    from .memory import probe

    click.echo(json.dumps(probe(database_url, redis_url, batch_size)))


@main.command(name="enqueue-sql")
@click.option("--n", "n", type=COUNT, default=5_000, show_default=True, metavar="N",
              help="Messages per way (event and email, Python API and SQL function), one per transaction.")
@click.option("--rounds", type=COUNT, default=5, show_default=True, metavar="N",
              help="Alternating rounds; a rate is the median round's.")
@click.option("--database-name", default="outbox_bench", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=report.LATEST, show_default=True,
              help="JSON results file (section enqueue_sql merged into it).")
def enqueue_sql(n: int, rounds: int, database_name: str, out: Path) -> None:
    """Enqueue per second through the SQL functions against the Python producer API, in one run."""
    from .enqueue_sql import run_enqueue_sql

    load = _load_average()
    with BenchEnv.open(database_name=database_name) as env:
        machine = machine_info() | env.server_versions()
        t = time.perf_counter()
        result = run_enqueue_sql(env, n=n, rounds=rounds)
    result.update(section_seconds=round(time.perf_counter() - t, 1), started_at=machine["date"],
                  load_average_at_start=load, run=machine["date"])
    rates, ratio = result["messages_per_second"], result["sql_vs_python"]
    for kind in ("event", "email"):
        click.echo(f"{kind}: SQL function {rates[kind + '_sql']:,.1f} msg/s, Python API "
                   f"{rates[kind + '_python']:,.1f} msg/s: SQL / Python {ratio[kind]:.2f}x "
                   f"({result['messages_per_way']:,} each, one per transaction, median of {rounds} rounds)")
    path = report.write({"machine": machine, "command": "python -m bench " + " ".join(sys.argv[1:]),
                         "enqueue_sql": result}, out)
    click.echo(f"results written to {path}")
    if out.resolve() == report.LATEST.resolve():
        click.echo(f"{report.write_docs(report.json.loads(path.read_text()))} written from them")
    if not result["check"]["ok"]:
        raise click.ClickException(f"correctness check failed: {result['check']}")
