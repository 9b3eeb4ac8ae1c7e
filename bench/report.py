"""Results: the targets checked, a table on the terminal, and a JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import plots

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LATEST = RESULTS_DIR / "latest.json"
METHOD = Path(__file__).resolve().parent / "method.md"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmark.md"

#: The targets on the reference machine (2 cores, PostgreSQL and Redis on the same host).
TARGETS = {
    "latency_1000_p50_ms": 100,
    "latency_1000_p99_ms": 500,
    "latency_1000_max_ms": 2000,
    "latency_top_p99_ms": 1000,
    "drain_1_vs_limit": 1.0,
    "drain_2_vs_limit": 0.9,
    "ordering_10000_keys_vs_keyless": 0.8,
    "ordering_100_keys_vs_keyless": 0.5,
    "ordering_two_vs_one_10000_keys": 1.5,
    "idle_statements_per_poll": 1.0,
    "claim_p99_growth": 1.2,
    "enqueue_p99_growth": 1.2,
    "retention_drop_seconds": 1.0,
    "retention_drop_vs_delete_wal": 0.1,
    "soak_last_vs_first": 1.2,
    "soak_size_max_over_min": 1.2,
    "peak_rss_mb_batch_5000": 256,
    "ses_fraction_of_max_send_rate": 0.90,
    "redis_cluster_vs_single": 0.7,
    "redis_wait1_vs_none": 0.8,
    "redis_failover_missing": 0,
    "redis_failover_duplicates": 0,
    "recovery_vs_drain": 2.0,
    "pollers_2_vs_1": 1.8,
    "pollers_4_vs_1": 3.2,
    "catchup_vs_pollers": 0.9,
    "autoscale_follow_seconds": 60,
    "autoscale_lag_p99_ms": 1000,
    "autoscale_vs_needs": 1.1,
}


def latency_models(section: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The latency section's scheduler models, punctual first. A section written
    before the poller registry (one punctual schedule, each invocation running to
    its deadline) is read as one punctual model."""
    if not section:
        return []
    if "models" in section:
        entries = list(section["models"].values())
    elif section.get("runs"):
        entries = [{"model": {"key": "punctual", "punctual": True}, "before_registry": True,
                    "label": f"punctual: each run starts on its slot, every {section['period_seconds']:g} s "
                             f"(before the poller registry: each invocation ran until its deadline, overlapping "
                             f"the next by {section['overlap_seconds']:g} s)",
                    "period_seconds": section["period_seconds"], "timeout_seconds": section["timeout_seconds"],
                    "margin_seconds": section["margin_seconds"], "lease_seconds": section["timeout_seconds"] + 60,
                    "reserved_concurrency": None, "batch_size": section.get("batch_size"),
                    "seconds": max((r["seconds"] for r in section["runs"]), default=None),
                    "runs": section["runs"], "started_at": section.get("started_at"),
                    "load_average_at_start": section.get("load_average_at_start")}]
    else:
        entries = []
    return sorted(entries, key=lambda e: (e["model"]["key"] != "punctual", e["model"]["key"]))


def merge_latency(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The latency section of a new run with the models of `old` it did not run
    (a run replaces only its own scheduler model's figures)."""
    models = {e["model"]["key"]: e for e in latency_models(old)}
    models.update(new.get("models", {}))
    return dict(new, models=models)


def model_tag(entry: dict[str, Any]) -> str:
    """A short name of a scheduler model, for target lines."""
    m = entry["model"]
    if m["key"] == "punctual":
        return "punctual schedule"
    parts = []
    if m.get("start_jitter"):
        parts.append(f"starts within {m['start_jitter']:g} s")
    if m.get("missed_runs"):
        parts.append(f"{m['missed_runs']:.0%} missed")
    if m.get("cold_start"):
        parts.append(f"{m['cold_start']:g} s cold starts")
    return ", ".join(parts)


def _latency_run(entry: dict[str, Any], rate: int | None = None) -> dict[str, Any] | None:
    """A model's latency run at `rate`, or (None) the highest rate that was sustained."""
    runs = entry.get("runs", [])
    if rate is not None:
        return next((r for r in runs if r["offered_per_second"] == rate), None)
    sustained = [r for r in runs if r["sustained"]]
    return max(sustained, key=lambda r: r["offered_per_second"]) if sustained else None


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it was met (None: not measured)."""
    checks: list[dict[str, Any]] = []

    def add(name: str, target: str, value: Any, met: bool | None) -> None:
        checks.append({"target": name, "goal": target, "measured": value, "met": met})

    for entry in latency_models(results.get("latency")):
        tag = model_tag(entry)
        at_1000 = _latency_run(entry, 1000)
        if at_1000:
            lag = at_1000["lag_ms"]
            add(f"Latency mode at 1,000 msg/s ({tag}): commit-to-entry lag p50",
                f"<= {TARGETS['latency_1000_p50_ms']} ms",
                lag["p50"], lag["p50"] is not None and lag["p50"] <= TARGETS["latency_1000_p50_ms"])
            add("... p99", f"<= {TARGETS['latency_1000_p99_ms']} ms",
                lag["p99"], lag["p99"] is not None and lag["p99"] <= TARGETS["latency_1000_p99_ms"])
            add("... max, across invocation handovers", f"<= {TARGETS['latency_1000_max_ms']:,} ms",
                lag["max"], lag["max"] is not None and lag["max"] <= TARGETS["latency_1000_max_ms"])
        runs = entry.get("runs", [])
        if runs:
            top = _latency_run(entry)
            asked = max(r["offered_per_second"] for r in runs)
            measured = None if top is None else (f"{top['offered_per_second']:,} msg/s sustained, "
                                                 f"p99 {top['lag_ms']['p99']} ms")
            add(f"Latency mode at {asked:,} msg/s (or the highest sustained; {tag}): p99, and delivered = offered",
                f"<= {TARGETS['latency_top_p99_ms']:,} ms", measured,
                None if top is None else (top["lag_ms"]["p99"] <= TARGETS["latency_top_p99_ms"]
                                          and top["offered_per_second"] == asked))
    idle = (results.get("latency") or {}).get("idle") or {}
    per_poll = idle.get("statements_per_poll")
    if idle:
        heartbeat = idle.get("registry_statements_per_second")
        add("Idle latency-mode invocation: statements per poll (the registry's heartbeat apart), claim without "
            "Seq Scan", f"<= {TARGETS['idle_statements_per_poll']:g}, index scans only",
            None if per_poll is None else f"{per_poll:g} ({idle.get('polls_per_second')} polls/s"
                                          + ("" if heartbeat is None else f", {heartbeat:g} registry statements/s")
                                          + f"; {', '.join(idle.get('claim_plan_index_scans', []))})",
            None if per_poll is None else (per_poll <= TARGETS["idle_statements_per_poll"]
                                           and not idle.get("claim_plan_seq_scans")))
    drain = results.get("drain", {})
    if drain.get("mode") == "drain":
        one = next((r for r in drain["runs"] if r["batch_size"] == 1000), None)
        reference = limit_rate(results, drain)
        if one:
            value = one["messages_per_second"] / reference if reference else None
            add("Drain mode, one invocation, batch 1,000, vs the minimal loop (same run)",
                f">= {TARGETS['drain_1_vs_limit']:g}x", None if value is None else f"{value:.2f}x",
                None if value is None else value >= TARGETS["drain_1_vs_limit"])
        two = drain.get("two_invocations")
        reference2 = limit_rate(results, drain, processes=2)
        if two:
            value = two["messages_per_second"] / reference2 if reference2 else None
            add("Drain mode, two invocations, vs the two-process minimal loop (same run)",
                f">= {TARGETS['drain_2_vs_limit']:g}x", None if value is None else f"{value:.2f}x",
                None if value is None else value >= TARGETS["drain_2_vs_limit"])
    ordering = results.get("ordering", {})
    if ordering:
        by_keys = {r["keys"]: r for r in ordering["runs"]}
        for keys, target in ((10_000, "ordering_10000_keys_vs_keyless"), (100, "ordering_100_keys_vs_keyless")):
            run = by_keys.get(keys)
            if run:
                add(f"Ordering keys: {keys:,} keys vs none, one invocation, batch {ordering['batch_size']:,}",
                    f">= {TARGETS[target]:g}x", f"{run['vs_keyless']:.2f}x",
                    run["vs_keyless"] >= TARGETS[target] and run["check"]["ok"])
        if 1 in by_keys:
            run = by_keys[1]
            add("Ordering keys: one key for every message (reported, order checked)", "in order",
                f"{run['vs_keyless']:.2f}x, {run['check']['order_violations']} out of order", run["check"]["ok"])
        two = ordering.get("two_invocations")
        if two:
            add(f"Ordering keys: two invocations at once over {two['keys']:,} keys vs one",
                f">= {TARGETS['ordering_two_vs_one_10000_keys']:g}x, in order",
                f"{two['vs_one_invocation']:.2f}x, {two['check']['order_violations']} out of order",
                two["vs_one_invocation"] >= TARGETS["ordering_two_vs_one_10000_keys"] and two["check"]["ok"])
    batch_runs = {d["batch_size"]: d for d in results.get("batches", {}).get("runs", [])}
    if batch_runs:
        stmts = {b: d["statements_per_batch"]["max"] for b, d in batch_runs.items()}
        trips = {b: d["redis_round_trips_per_batch"]["max"] for b, d in batch_runs.items()}
        flat = len(set(stmts.values())) == 1 and len(set(trips.values())) == 1
        add("Round trips per batch constant over batch sizes",
            "same count at every batch size",
            {"statements": stmts, "redis": trips}, flat)
    growth = results.get("growth", {})
    if growth.get("cases"):
        small, large = growth["cases"][0]["delivered"], growth["cases"][-1]["delivered"]
        for what, key in (("Claim", "claim_p99_ratio"), ("Enqueue", "enqueue_p99_ratio")):
            g, goal = growth.get(key), TARGETS[what.lower() + "_p99_growth"]
            add(f"{what} p99 with {large:,} delivered rows vs {small:,}", f"<= {goal:g}x",
                None if g is None else f"{g:g}x", None if g is None else g <= goal)
        add("Claim plan uses the partial indexes in every case", "both branches on their index, no Seq Scan",
            growth.get("plans_ok"), growth.get("plans_ok"))
        biggest = growth["cases"][-1]
        drop, delete = biggest["retention"].get("drop"), biggest["retention"].get("delete")
        if drop and delete:
            wal = drop["wal_bytes"] / delete["wal_bytes"] if delete["wal_bytes"] else None
            dead = sum(drop["dead_rows"].values())
            met = (drop["seconds"] <= TARGETS["retention_drop_seconds"] and dead == 0 and wal is not None
                   and wal <= TARGETS["retention_drop_vs_delete_wal"])
            add(f"A day's retention with {large:,} delivered rows: drop's seconds, dead rows, WAL vs "
                "the old DELETE's", f"<= {TARGETS['retention_drop_seconds']:g} s, 0, "
                f"<= {TARGETS['retention_drop_vs_delete_wal']:g}x",
                f"{drop['seconds']:g} s, {dead:,}, " + ("-" if wal is None else f"{wal:.3f}x"), met)
        soak = growth.get("soak")
        if soak:
            goal = TARGETS["soak_last_vs_first"]
            for what, key in (("claim", "claim_p99_ratio"), ("lag", "lag_p99_ratio")):
                g = soak.get(key)
                add(f"Soak of {soak['minutes']:g} min at {soak['rate']:,} msg/s, days dropped: {what} p99 in the "
                    "last 5 min vs the first", f"<= {goal:g}x", None if g is None else f"{g:g}x",
                    None if g is None else g <= goal)
            size = soak.get("bytes_after_drops_max_over_min")
            add("... the three tables' size once days are dropped, largest vs smallest (a day's rows apart)",
                f"<= {TARGETS['soak_size_max_over_min']:g}x", None if size is None else f"{size:g}x",
                None if size is None else size <= TARGETS["soak_size_max_over_min"])
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
    for channel in AWS_CHANNELS:
        section = results.get(channel)
        if not section or not section.get("runs"):
            continue
        relayed = [r["relay"] for r in section["runs"]]
        per_call = section.get("bytes_per_call", 256 * 1024)
        size = f"{per_call // 1024} KiB" if per_call < 1024 * 1024 else f"{per_call // (1024 * 1024)} MiB"
        add(f"{section['service']} through moto: every message accepted once, in its key's order, no call over "
            f"{section.get('entries_per_call', 10)} entries or {size}", "all runs checked",
            "; ".join(f"{_aws_variant(r)}: {r['relay']['max_entries_per_call']} entries, "
                      f"{r['relay']['max_bytes_per_call']:,} bytes at most, {r['relay']['check']['out_of_order']} "
                      f"out of order" for r in section["runs"]),
            all(r["check"]["ok"] for r in section["runs"]) and all(d["check"]["ok"] for d in relayed))
    rd = results.get("redis", {})
    if rd.get("runs"):
        value = rd.get("cluster_vs_single")
        add(f"Redis Cluster, 3 primaries, vs one node: drain at batch {rd['batch_size']:,} over {rd['streams']} "
            "streams (same run)", f">= {TARGETS['redis_cluster_vs_single']:g}x",
            None if value is None else f"{value:.2f}x", None if value is None else
            value >= TARGETS["redis_cluster_vs_single"])
        value = rd.get("wait1_vs_none_single")
        add(f"WAIT 1 vs none, one node with a replica, batch {rd['batch_size']:,} (same run)",
            f">= {TARGETS['redis_wait1_vs_none']:g}x", None if value is None else f"{value:.2f}x",
            None if value is None else value >= TARGETS["redis_wait1_vs_none"])
        f = rd["failover"]
        add(f"A primary killed mid-drain of {f['messages']:,} with WAIT 1: recorded delivered and missing, "
            "duplicate entries", f"{TARGETS['redis_failover_missing']}, {TARGETS['redis_failover_duplicates']}",
            f"{f['recorded_delivered_and_missing']}, {f['duplicate_entries']}",
            f["recorded_delivered_and_missing"] == TARGETS["redis_failover_missing"]
            and f["duplicate_entries"] == TARGETS["redis_failover_duplicates"] and f["check"]["ok"])
    rec = results.get("recovery", {})
    if rec:
        ok = all(r["check"]["ok"] for r in rec["runs"])
        add(f"Recovery after a fleet-wide crash: {rec['messages']:,} expired leases by {rec['invocations']} "
            f"drain-mode invocations at once vs a drain of {rec['messages']:,} fresh messages (same run)",
            f"<= {TARGETS['recovery_vs_drain']:g}x the time, every message once",
            f"{rec['recovery_vs_drain']:.2f}x ({rec['recovery_seconds']:,.2f} s vs {rec['drain_seconds']:,.2f} s)",
            rec["recovery_vs_drain"] <= TARGETS["recovery_vs_drain"] and ok)
        c = rec["poison"]["check"]
        add("... with a message among them that kills its invocation: dead alone after exactly its attempts",
            "dead after max attempts; nothing else dead, lost or twice in a stream",
            f"dead after {c['poison_attempts']} of {c['max_attempts']} attempts, {c['invocations_killed']} "
            f"invocations killed; other dead {c['other_dead']}, lost {c['lost']}, duplicates {c['duplicates']}",
            c["ok"])
    pol = results.get("pollers") or {}
    for c in pol.get("counts", []):
        goal = TARGETS.get(f"pollers_{c['pollers']}_vs_1")
        if goal is None:
            continue
        cpu = c.get("cpu_cores_at_sustained") or {}
        add(f"{c['pollers']} pollers' sustained latency-mode rate vs one's (lag p99 <= {pol['lag_p99_limit_ms']:g} "
            "ms), or PostgreSQL saturated", f">= {goal:g}x, 0 keys out of order",
            None if c.get("vs_one") is None else f"{c['vs_one']:.2f}x (backlog drain "
            f"{(c.get('drain') or {}).get('vs_one')}x); PostgreSQL {cpu.get('postgresql_all')} "
            f"cores, machine {cpu.get('machine_busy')} of {cpu.get('machine_cores')} busy",
            None if c.get("vs_one") is None else c["vs_one"] >= goal and pol["check"]["keys_out_of_order"] == 0)
    cu = results.get("catchup") or {}
    if cu.get("check"):
        add(f"Catch-up after a {cu['outage_seconds'] / 60:g}-minute downstream outage at half of one poller's rate: "
            f"drain rate vs {cu['pollers']} pollers' drain of a backlog as large, while the producers offer as much",
            f">= {TARGETS['catchup_vs_pollers']:g}x, "
            "0 keys out of order, 0 lost",
            None if cu.get("drain_vs_reference") is None else
            f"{cu['drain_vs_reference']:.2f}x; {cu['check']['keys_out_of_order']} out of order, "
            f"{cu['check']['lost']} lost",
            None if cu.get("drain_vs_reference") is None else
            cu["drain_vs_reference"] >= TARGETS["catchup_vs_pollers"] and cu["check"]["keys_out_of_order"] == 0
            and cu["check"]["lost"] == 0)
    au = results.get("autoscale") or {}
    if au.get("check"):
        follows = [c["followed_after_seconds"] for c in au["changes"]]
        goal = TARGETS["autoscale_follow_seconds"]
        add(f"Autoscaling, offered load stepped {' -> '.join(f'{f:g}' for f in au['fractions'])} x R1: pollers "
            "follow each step", f"<= {goal:g} s each way",
            ", ".join(f"{c['direction']} {_fmt(c['followed_after_seconds'])} s" for c in au["changes"]),
            all(f is not None and f <= goal for f in follows))
        p99 = au["lag_outside_steps_ms"]["p99"]
        add("... lag p99 outside the steps", f"<= {TARGETS['autoscale_lag_p99_ms']:g} ms", p99,
            None if p99 is None else p99 <= TARGETS["autoscale_lag_p99_ms"])
        check = au["check"]
        add("... poller-seconds per second vs what the load needs, order kept",
            f"<= {TARGETS['autoscale_vs_needs']:g}x, 0 keys out of order, 0 lost",
            f"{_fmt(au['vs_needs'])}x; {check['keys_out_of_order']} out of order, {check['lost']} lost",
            au["vs_needs"] is not None and au["vs_needs"] <= TARGETS["autoscale_vs_needs"]
            and check["keys_out_of_order"] == 0 and check["lost"] == 0)
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
    if "latency" in results and isinstance(merged.get("latency"), dict):
        results = dict(results, latency=merge_latency(merged["latency"], results["latency"]))
    merged.update(results)
    merged["targets"] = evaluate(merged)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2, sort_keys=False) + "\n")
    return path


def _cpu_key(section: dict[str, Any]) -> tuple[Any, Any]:
    cpu = section.get("cpu") or {}
    return cpu.get("function_memory_mb"), cpu.get("capped")


def limit_rate(results: dict[str, Any], section: dict[str, Any], processes: int = 1) -> float | None:
    """The minimal loop's msg/s with `processes` processes, when it was measured
    in the same run as `section` and held to the same CPU (ratios across runs
    would compare two hosts)."""
    limit = results.get("limit")
    if not limit or not section or limit.get("run") is None or limit.get("run") != section.get("run") \
            or _cpu_key(limit) != _cpu_key(section):
        return None
    for r in limit.get("runs", []):
        if r["processes"] == processes:
            return r["messages_per_second"]
    return None


def ratio(value: float | None, reference: float | None) -> str:
    """`value / reference` as ``0.62×``, or – when either is unknown."""
    if not value or not reference:
        return "–"
    return f"{value / reference:.2f}×"


def _times(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


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
    limit = results.get("limit")
    if limit:
        t = Table(title=f"The minimal loop: {limit['messages']:,} messages, batch {limit['batch_size']:,}"
                        f"{_held(limit)}")
        for col in ("processes", "msg/s", "wall s", "stream entries", "duplicates", "check"):
            t.add_column(col, justify="right")
        for r in limit["runs"]:
            c = r["check"]
            t.add_row(_fmt(r["processes"]), _fmt(r["messages_per_second"]), _fmt(r["wall_seconds"]),
                      _fmt(c["stream_entries"]), _fmt(c["duplicates"]), "ok" if c["ok"] else "FAILED")
        console.print(t)
    drain = results.get("drain")
    if drain and drain.get("mode") == "drain":
        t = Table(title=f"Drain mode, Redis channel: {drain['messages']:,} messages, one invocation{_held(drain)}")
        for col in ("at once", "batch", "msg/s", "× limit", "batches", "stmts/batch", "redis RT/batch",
                    "CPU µs/msg client", "PostgreSQL", "Redis", "check"):
            t.add_column(col, justify="right")
        rows = [(r, limit_rate(results, drain)) for r in drain["runs"]]
        rows.append((drain["two_invocations"], limit_rate(results, drain, processes=2)))
        for r, reference in rows:
            cpu = r.get("cpu_us_per_message", {})
            t.add_row(_fmt(r["processes"]), _fmt(r["batch_size"]), _fmt(r["messages_per_second"]),
                      ratio(r["messages_per_second"], reference), _fmt(r.get("batches")),
                      _fmt(r.get("statements_per_batch")), _fmt(r.get("redis_round_trips_per_batch")),
                      _fmt(cpu.get("client")), _fmt(cpu.get("postgresql")), _fmt(cpu.get("redis")),
                      "ok" if r["check"]["ok"] else "FAILED")
        console.print(t)
    lat = results.get("latency")
    if lat:
        for entry in latency_models(lat):
            t = Table(title=f"Latency mode, {entry['label']}; {_function_settings(entry)}; lag in ms")
            for col in ("offered/s", "committed/s", "delivered/s", "lag p50", "p99", "max", "no poller s",
                        "(bench)", "longest", "pollers", "sched", "self", "missed", "throttled", "dup", "lost",
                        "check"):
                t.add_column(col, justify="right")
            for r in entry["runs"]:
                t.add_row(*_latency_cells(r)[:-1], "ok" if r["check"]["ok"] else "FAILED")
            console.print(t)
        idle = lat.get("idle")
        if idle:
            console.print(f"  idle: {idle['polls']} polls in {idle['seconds']} s, {idle['statements_per_poll']} "
                          f"statements and {idle['redis_round_trips_per_poll']} Redis round trips per poll, "
                          f"{_fmt(idle.get('registry_statements'))} registry statements; "
                          f"claim {idle['claim_execution_ms']} ms on {', '.join(idle['claim_plan_index_scans'])}")
    ordering = results.get("ordering")
    if ordering:
        t = Table(title=f"Ordering keys: {ordering['messages']:,} messages, batch {ordering['batch_size']:,}, "
                        f"drain mode, median of {ordering['rounds']} interleaved rounds")
        for col in ("keys", "at once", "msg/s", "× keyless", "× one", "× limit", "batches", "out of order",
                    "check"):
            t.add_column(col, justify="right")
        reference = limit_rate(results, ordering)
        for r in [*ordering["runs"], ordering["two_invocations"]]:
            t.add_row("none" if r["keys"] is None else _fmt(r["keys"]), _fmt(r["processes"]),
                      _fmt(r["messages_per_second"]), _times(r.get("vs_keyless")), _times(r.get("vs_one_invocation")),
                      ratio(r["messages_per_second"], reference), _fmt(r.get("batches")),
                      _fmt(r["check"]["order_violations"]), "ok" if r["check"]["ok"] else "FAILED")
        console.print(t)
    drain = results.get("batches")
    if drain:
        reference = limit_rate(results, drain)
        t = Table(title=f"Batch mode, Redis channel: {drain['messages']:,} messages, one batch per invocation, "
                        "back to back")
        for col in ("batch", "msg/s", "× limit", "wall s", "invocations", "stmts/batch", "redis RT/batch",
                    "CPU µs/msg client", "PostgreSQL", "Redis", "GC µs/msg", "check"):
            t.add_column(col, justify="right")
        for d in drain["runs"]:
            cpu = d["cpu_us_per_message"]
            t.add_row(_fmt(d["batch_size"]), _fmt(d["messages_per_second"]),
                      ratio(d["messages_per_second"], reference), _fmt(d["wall_seconds"]),
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
    rec = results.get("recovery")
    if rec:
        t = Table(title=f"Recovery after a fleet-wide crash: {rec['messages']:,} messages, batch "
                        f"{rec['batch_size']:,}, {rec['invocations']} drain-mode invocations at once")
        for col in ("pass", "wall s", "msg/s", "× drain", "invocations", "claims", "stmts/batch", "attempts",
                    "check"):
            t.add_column(col, justify="right")
        for r in rec["runs"]:
            t.add_row(r["kind"], _fmt(r["wall_seconds"]), _fmt(r["messages_per_second"]),
                      _times(r["wall_seconds"] / rec["drain_seconds"]), _fmt(r["invocations"]), _fmt(r["claims"]),
                      _fmt(r["statements_per_batch"]), ", ".join(f"{k}: {v:,}" for k, v in r["check"]["attempts"]
                                                                  .items()), "ok" if r["check"]["ok"] else "FAILED")
        console.print(t)
        p, c = rec["poison"], rec["poison"]["check"]
        console.print(f"  a poison among them: dead after {c['poison_attempts']} of {c['max_attempts']} attempts "
                      f"({c['poison_error_class']}), {c['invocations_killed']} invocations killed over "
                      f"{len(p['passes'])} passes; other dead {c['other_dead']}, lost {c['lost']}, duplicates "
                      f"{c['duplicates']}; first pass {_fmt(p['first_pass_seconds'])} s "
                      f"({_times(p['first_pass_vs_drain'])} drain), {'ok' if c['ok'] else 'FAILED'}")
    growth = results.get("growth")
    if growth:
        console.print(_markdown_table(growth_table(growth), "As delivered history grows"))
        console.print(_markdown_table(retention_table(growth), "A day's retention with today's purge"))
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
    for channel in AWS_CHANNELS:
        section = results.get(channel)
        if not section:
            continue
        t = Table(title=f"{_aws_title(section)}; msg/s {_aws_rounds(section)}")
        for col in ("variant", "relay msg/s", "minimal loop", "× minimal", "× limit", "calls/batch",
                    "entries/call", "stmts/batch", "max entries", "max bytes", "out of order", "check"):
            t.add_column(col, justify="right")
        reference = limit_rate(results, section)
        for r in section["runs"]:
            d, m = r["relay"], r["minimal"]
            t.add_row(_aws_variant(r), _fmt(d["messages_per_second"]), _fmt(m["messages_per_second"]),
                      _times(r["vs_minimal"]), ratio(d["messages_per_second"], reference),
                      _aws_calls(section, d), _fmt(d["entries_per_call"]), _fmt(d["statements_per_batch"]),
                      _fmt(d["max_entries_per_call"]), _fmt(d["max_bytes_per_call"]),
                      f"{d['check']['out_of_order']} ({m['check']['out_of_order']})",
                      "ok" if r["check"]["ok"] else "FAILED")
        console.print(t)
    fb = results.get("feedback")
    if fb:
        rec, send = fb["recording"], fb["send_path"]
        t = Table(title="SES feedback (feedback handler; SES relay on moto, suppression off vs on)")
        for col in ("events", "events/s", "emails", "µs/email off", "µs/email on", "on / off", "CPU on / off",
                    "check"):
            t.add_column(col, justify="right")
        t.add_row(_fmt(rec["events"]), _fmt(rec["events_per_second"]), _fmt(send["sends"]),
                  _fmt(send["us_per_email_off"]), _fmt(send["us_per_email_on"]), f"{send['ratio_on_to_off']:.3f}",
                  f"{send.get('cpu_ratio_on_to_off', float('nan')):.3f}", "ok" if fb["check"]["ok"] else "FAILED")
        console.print(t)
    rd = results.get("redis")
    if rd and rd.get("runs"):
        t = Table(title=f"Redis as on AWS: drain mode, batch {rd['batch_size']:,}, {rd['messages']:,} messages "
                        f"over {rd['streams']} streams, servers of the section's own")
        for col in ("topology", "WAIT", "msg/s", "Redis round trips per batch", "batches", "check"):
            t.add_column(col, justify="right")
        for r in rd["runs"]:
            t.add_row(r["topology"], _fmt(r["wait_replicas"]), _fmt(r["messages_per_second"]),
                      _fmt(r["redis_round_trips_per_batch"]), _fmt(r["batches"]),
                      "ok" if r["check"]["ok"] else "FAILED")
        console.print(t)
        w, f = rd["wait_round_trip_ms"], rd["failover"]
        console.print(f"  a pipeline of one XADD: {w['without_p50']} ms p50 / {w['without_p99']} ms p99, with WAIT 1 "
                      f"{w['with_wait_p50']} / {w['with_wait_p99']} ms; a primary killed mid-drain of "
                      f"{f['messages']:,} (WAIT 1): {f['recorded_delivered_and_missing']} recorded delivered and "
                      f"missing, {f['duplicate_entries']} duplicate entries")
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


LATENCY_COLUMNS = ("offered msg/s", "committed msg/s", "delivered msg/s", "lag p50", "p99", "max",
                   "s without a poller: registry", "bench", "longest gap s", "poller-s per s",
                   "started by schedule", "by self-invoke", "missed", "throttled", "duplicates", "lost",
                   "sustained")


def _function_settings(entry: dict[str, Any]) -> str:
    parts = [f"timeout {entry['timeout_seconds']:g} s", f"lease {entry['lease_seconds']:g} s",
             f"deadline margin {entry['margin_seconds']:g} s"]
    if entry.get("reserved_concurrency"):
        parts.append(f"reserved concurrency {entry['reserved_concurrency']}")
    return ", ".join(parts)


def _latency_cells(r: dict[str, Any]) -> list[str]:
    """A latency run's row: the figures of LATENCY_COLUMNS ("–" where a run from
    before the poller registry has none)."""
    lag = r["lag_ms"]
    gap = r.get("without_poller") or {}
    inv = r.get("invocations") if isinstance(r.get("invocations"), dict) else {}
    throttled = inv.get("throttled")
    if throttled is not None and inv.get("dropped"):
        throttled = f"{throttled} ({inv['dropped']} dropped)"
    committed = r.get("sent_per_second") or (round(r["sent"] / r["seconds"], 1) if r.get("seconds") else None)
    return [_fmt(r["offered_per_second"]), _fmt(committed), _fmt(r["delivered_per_second"]),
            _fmt(lag["p50"]), _fmt(lag["p99"]), _fmt(lag["max"]), _fmt(gap.get("registry_seconds")),
            _fmt(gap.get("bench_seconds")),
            _fmt(max((v for v in (gap.get("registry_longest_seconds"), gap.get("bench_longest_seconds"))
                      if v is not None), default=None)),
            _fmt(r.get("poller_seconds_per_second")), _fmt(inv.get("by_schedule")), _fmt(inv.get("by_self_invoke")),
            _fmt(inv.get("missed")), _fmt(throttled), _fmt(r.get("duplicates")), _fmt(r.get("lost")),
            _fmt(r["sustained"])]


def _phases(results: dict[str, Any]) -> dict[str, Any] | None:
    """The phases section, unless it comes from a results file written before
    its steps were renamed (its figures meant something else)."""
    ph = results.get("phases")
    return ph if ph and ph["steps"][1]["step"] == "claim, first row" else None


def _rate(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}"


def _seconds(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def sweep_entry(sections: dict[str, Any], cpu: dict[str, Any]) -> dict[str, Any]:
    """What a memory sweep keeps of one memory's sections: the CPU, the minimal loop's and
    drain mode's rates (one invocation at batch 1,000, or the largest, and two at once) and
    the relay's cold start (the median of the drain runs')."""
    entry: dict[str, Any] = {k: cpu[k] for k in ("function_memory_mb", "share", "capped", "label")}
    limit, drain = sections.get("limit"), sections.get("drain")
    if limit:
        entry["limit"] = {str(r["processes"]): r["messages_per_second"] for r in limit["runs"]}
    if drain:
        one = max(drain["runs"], key=lambda r: (r["batch_size"] == 1000, r["batch_size"]))
        starts = sorted(r["cold_start_seconds"] for r in [*drain["runs"], drain["two_invocations"]])
        entry["drain"] = {"batch_size": one["batch_size"], "one": one["messages_per_second"],
                          "two": drain["two_invocations"]["messages_per_second"],
                          "cold_start_seconds": starts[len(starts) // 2],
                          "throttled_periods": drain["cpu"].get("throttled_periods")}
    for name in ("concurrency", "recovery"):
        if name in sections:
            entry[name] = {str(r["processes"] if name == "concurrency" else r["kind"]): r["messages_per_second"]
                           for r in sections[name]["runs"]}
    return entry


def memory_sweep_lines(results: dict[str, Any]) -> list[str]:
    """docs/benchmark.md's table of how drain mode's throughput and cold start grow with the
    function's memory (the latest `--function-memory-mb` sweep)."""
    sweep = results.get("memory_sweep")
    rows = [e for e in (sweep or {}).get("memories", []) if "drain" in e]
    if not rows:
        return []
    out = [f"How drain mode grows with the function's memory (`{sweep.get('command', 'python -m bench drain')}`; "
           f"every process held to Lambda's CPU at each memory in turn, the minimal loop held alike; run "
           f"{sweep['run']}); cold start: from a container process's fork to its first invocation done "
           f"(imports, dependencies, connections), the median of the section's containers; throttled: the "
           f"100 ms periods in which the kernel held the drain section's processes to their share (few where "
           f"the machine's other load, not the share, limited them):", "",
           "| function memory | CPU, cores | minimal loop msg/s | drain, one invocation msg/s | × minimal loop "
           "| two at once msg/s | × minimal loop (2 processes) | two / one | cold start, s | throttled |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in rows:
        d, loop = e["drain"], e.get("limit", {})
        held = f"{e['share']:.2f}" + ("" if e["capped"] else " (uncapped)")
        out.append(f"| {e['function_memory_mb']:,} MB | {held} | {_rate(loop.get('1'))} | {_rate(d['one'])} "
                   f"| {ratio(d['one'], loop.get('1'))} | {_rate(d['two'])} | {ratio(d['two'], loop.get('2'))} "
                   f"| {ratio(d['two'], d['one'])} | {_seconds(d['cold_start_seconds'])} "
                   f"| {_fmt(d.get('throttled_periods'))} |")
    return [*out, ""]


def memory_growth(results: dict[str, Any]) -> str | None:
    """One sentence for the README: drain mode's rate and cold start at each memory of the sweep."""
    sweep = results.get("memory_sweep") or {}
    rows = [e for e in sweep.get("memories", []) if "drain" in e and e["capped"]]
    if len(rows) < 2:
        return None
    drain = results.get("drain") or {}
    load = drain.get("load_average_at_start") if drain.get("run") == sweep.get("run") else None
    return ("Held to Lambda's CPU at each memory, one drain-mode invocation delivers " + ", ".join(
        f"{e['drain']['one']:,.0f} msg/s at {e['function_memory_mb']:,} MB ({e['share']:.2f} of a core; "
        f"cold start {e['drain']['cold_start_seconds']:.1f} s)" for e in rows)
        + f" (run {sweep['run']}" + ("" if load is None else f", load average {load}") + ").")


def _held(section: dict[str, Any]) -> str:
    """How the section's invocation processes ran: held to Lambda's CPU at a memory, or uncapped."""
    return "; " + (section.get("cpu") or {}).get("label", "uncapped")


def _markdown_table(lines: list[str], title: str) -> Table:
    """A rich table of the rows of a markdown table (its header, separator, rows)."""
    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    t = Table(title=title)
    for col in cells(lines[0]):
        t.add_column(col, justify="right")
    for line in lines[2:]:
        t.add_row(*cells(line))
    return t


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def growth_table(growth: dict[str, Any]) -> list[str]:
    """Per count of delivered rows: size on disk, claim and enqueue latency, drain rate."""
    planned = all("planning" in c for c in growth["cases"])
    out = ["| delivered rows | on disk (message / body / history, tables + indexes) | claim median / p99 ms "
           + ("| claim planning median / p99 ms " if planned else "") + "| enqueue median / p99 ms | drain msg/s |",
           "|---:|---|---:|" + ("---:|" if planned else "") + "---:|---:|"]
    for c in growth["cases"]:
        parts = " / ".join(_size(t["table_bytes"] + t["index_bytes"]) for _, t in sorted(c["size"]["tables"].items()))
        e = c["enqueue"]
        out.append(f"| {c['delivered']:,} | {_size(c['size']['total_bytes'])} ({parts}) | {c['median_ms']:.1f} / "
                   f"{c['p99_ms']:.1f} | " + (f"{_planning(c)} | " if planned else "") + f"{e['median_ms']:.1f} / {e['p99_ms']:.1f} | "
                   f"{c['drain']['messages_per_second']:,.0f} |")
    out.append(f"| ratio | | {_times(growth['claim_p99_ratio'])} p99 | "
               + (f"{_times(growth.get('planning_p99_ratio'))} p99 | " if planned else "")
               + f"{_times(growth['enqueue_p99_ratio'])} p99 | {_times(growth['drain_ratio'])} |")
    small, large = growth["cases"][0], growth["cases"][-1]
    rows = large["delivered"] - small["delivered"]
    if rows > 0:
        def grown(case: dict[str, Any], name: str) -> int:
            return case["size"]["tables"][name]["table_bytes"] + case["size"]["tables"][name]["index_bytes"]

        per_row = (large["size"]["total_bytes"] - small["size"]["total_bytes"]) / rows
        seed = (large["seed_seconds"] - small["seed_seconds"]) / rows
        parts = ", ".join(f"{name.removeprefix('outbox_').removeprefix('message_')} "
                          f"{(grown(large, name) - grown(small, name)) / rows:,.0f}"
                          for name in sorted(large["size"]["tables"]))
        out += ["", f"A delivered row took {per_row:,.0f} bytes on disk with its indexes ({parts}) and "
                f"{seed * 1e6:,.0f} µs of seeding: 10^8 rows {per_row * 1e8 / 2**30:,.0f} GiB and "
                f"{seed * 1e8 / 3600:,.1f} h, 10^9 rows {per_row * 1e9 / 2**30:,.0f} GiB, at these rates."]
    return out


def _purge_table(growth: dict[str, Any]) -> list[str]:
    """Results from before day partitions: the oldest day purged, its time, WAL, dead rows and the producer's wait."""
    out = ["| delivered rows | purged | seconds | WAL (bytes per row) | dead rows after (before) | autovacuum ran by then "
           "| producer enqueue p99 / longest ms | then VACUUM: seconds, WAL |", "|---:|---:|---:|---:|---|---|---:|---:|"]
    for c in growth["cases"]:
        r = c["retention"]
        dead = " / ".join(f"{n:,} ({r['dead_rows_before'][t]:,})" for t, n in sorted(r["dead_rows"].items()))
        ran = " / ".join(_fmt(v) for _, v in sorted(r["autovacuum_ran"].items()))
        p = r["producer"]
        out.append(f"| {c['delivered']:,} | {r['purged']:,} | {r['seconds']:,.1f} | {_size(r['wal_bytes'])} "
                   f"({_fmt(r['wal_bytes_per_row'])}) | {dead} | {ran} | {_fmt(p.get('p99_ms'))} / "
                   f"{_fmt(p.get('max_ms'))} | {_fmt(r.get('vacuum_seconds'))}, {_size(r.get('vacuum_wal_bytes') or 0)} |")
    return out


def _planning(case: dict[str, Any]) -> str:
    p = case.get("planning")
    return f"{p['median_ms']:.2f} / {p['p99_ms']:.2f}" if p else "n/a"


def retention_table(growth: dict[str, Any]) -> list[str]:
    """Per count of delivered rows: one day's rows dropped (the maintenance path) vs as many deleted
    by today's purge, each while a producer enqueues: time, WAL, dead rows, the producer's longest wait."""
    if "drop" not in growth["cases"][0]["retention"]:
        return _purge_table(growth)
    out = ["| delivered rows | a day's rows | way | seconds | WAL | dead rows after (message / body / history) "
           "| producer enqueue p99 / longest ms | enqueues failed | then VACUUM: seconds, WAL |",
           "|---:|---:|---|---:|---:|---|---:|---|---:|"]
    for c in growth["cases"]:
        r = c["retention"]
        for way, w in (("drop", r["drop"]), ("DELETE", r["delete"])):
            dead = " / ".join(f"{n:,}" for _, n in sorted(w["dead_rows"].items()))
            p = w["producer"]
            failed = ", ".join(f"{n} ({state})" for state, n in sorted(w["producer_failed"].items())) or "0"
            vacuum = (f"{_fmt(w.get('vacuum_seconds'))}, {_size(w.get('vacuum_wal_bytes') or 0)}"
                      if "vacuum_seconds" in w else "none needed")
            out.append(f"| {c['delivered']:,} | {w['rows']['outbox_message']:,} | {way} | {w['seconds']:,.2f} | "
                       f"{_size(w['wal_bytes'])} | {dead} | {_fmt(p.get('p99_ms'))} / {_fmt(p.get('max_ms'))} | "
                       f"{failed} | {vacuum} |")
        out.append(f"| | | drop / DELETE | {_times(r['seconds_ratio'])} | {_times(r['wal_ratio'])} | | | | |")
    return out


def soak_table(soak: dict[str, Any]) -> list[str]:
    """The soak: first vs last minutes, size once days are dropped, what failed."""
    edge = f"{soak['edge_seconds'] / 60:g} min"
    failed = ", ".join(f"{n} ({state})" for state, n in sorted(soak["producer_failed"].items())) or "0"
    return ["| | first " + edge + " | last " + edge + " | last / first |", "|---|---:|---:|---:|",
            f"| claim p99 ms | {_fmt(soak['claim_p99_first_ms'])} | {_fmt(soak['claim_p99_last_ms'])} | "
            f"{_times(soak['claim_p99_ratio'])} |",
            f"| lag p99 ms | {_fmt(soak['lag_p99_first_ms'])} | {_fmt(soak['lag_p99_last_ms'])} | "
            f"{_times(soak['lag_p99_ratio'])} |",
            "",
            f"{soak['sent']:,} messages offered ({soak['offered_per_second']:,.0f} msg/s), {soak['rows_lost']} lost, "
            f"{soak['delivered']:,} delivered; {len(soak['maintenance'])} maintenance runs dropped "
            f"{sum(m['dropped'] for m in soak['maintenance'])} days and opened "
            f"{sum(m['opened'] for m in soak['maintenance'])}; partitions {soak['partitions_min_max'][0]} to "
            f"{soak['partitions_min_max'][1]}; the three tables {_size(soak['bytes_at_first_drop'] or 0)} at the "
            f"first drop, {_size(soak['bytes_at_end'] or 0)} at the end (largest / smallest since: "
            f"{_fmt(soak['bytes_after_drops_max_over_min'])}); enqueue transactions failed: {failed}; "
            f"relay invocations failed: {soak['invocations_failed']} of {soak['invocations']:,}."]


def _when(section: dict[str, Any]) -> str:
    if not section.get("started_at"):
        return ""
    return f"; run {section['started_at']}, load average {section.get('load_average_at_start')}"


AWS_CHANNELS = ("sqs", "sns", "eventbridge", "kinesis")


def _aws_title(section: dict[str, Any]) -> str:
    return (f"{section['service']} through moto: {section['messages']:,} messages, batch {section['batch_size']:,}, "
            f"{section['operation']} calls of up to {section.get('entries_per_call', 10)}, {section['concurrency']} at once")


def _aws_rounds(section: dict[str, Any]) -> str:
    rounds = section.get("rounds", 1)
    return "of one round" if rounds == 1 else f"medians of {rounds} interleaved rounds"


def _aws_variant(run: dict[str, Any]) -> str:
    if run["variant"] == "fifo":
        return f"FIFO, {run['keys']:,} keys" if run.get("keys") else "FIFO"
    return "standard" if run.get("keys") is None else f"standard, {run['keys']:,} keys"


def _outcome_writes(run: dict[str, Any]) -> str:
    w = run.get("outcome_writes")
    if not w:
        return "–"
    share = "–" if w["share_of_wall"] is None else f"{w['share_of_wall']:.0%}"
    return f"{_fmt(w['per_batch'])}, {_fmt(w['median_ms'])} ms, {share}"


def _aws_calls(section: dict[str, Any], run: dict[str, Any]) -> str:
    """Calls per batch: all of them, then the batch operation's share."""
    return f"{_fmt(run['calls_per_batch'])} ({_fmt(run['batch_calls_per_batch'])} {section['operation']})"


def aws_summary(results: dict[str, Any]) -> str | None:
    """One sentence on the AWS channels' drain, for the README's modes block (None when not measured)."""
    parts = []
    for channel in AWS_CHANNELS:
        section = results.get(channel)
        if section and section.get("runs"):
            parts.append(f"{section['service']} " + ", ".join(
                f"{_times(r['vs_minimal'])} ({_aws_variant(r)})" for r in section["runs"]))
    if not parts:
        return None
    return ("Drain throughput is the Redis channel's; through moto, which answers faster than AWS, the other relays "
            "drain at " + "; ".join(parts) + " their channel's minimal loop (`python -m bench sqs`, `sns`, "
            "`eventbridge`, `kinesis`).")


def markdown(results: dict[str, Any]) -> str:
    """The latest figures as Markdown tables (docs/benchmark.md, "Latest figures")."""
    out: list[str] = []
    m = results.get("machine", {})
    if m:
        out.append(f"Machine: {m.get('nproc')} CPU ({m.get('cpu_model')}), {m.get('memory_mb')} MB RAM, "
                   f"{m.get('os')}; PostgreSQL {m.get('postgresql')}, Redis {m.get('redis')}, both on the same "
                   f"host; Python {m.get('python')}, SQLAlchemy {m.get('sqlalchemy')}, pg8000 {m.get('pg8000')}, "
                   f"redis-py {m.get('redis_py')}. Date {m.get('date')}; load average at start "
                   f"{m.get('load_average_at_start')}. Command: `{results.get('command', 'python -m bench all')}`.")
        out.append("")
    limit = results.get("limit")
    if limit:
        out.append(f"The minimal loop ({limit['messages']:,} messages, batch {limit['batch_size']:,}"
                   f"{_held(limit)}{_when(limit)}): " + ", ".join(
                       f"{r['processes']} process{'es' if r['processes'] > 1 else ''} "
                       f"{r['messages_per_second']:,.0f} msg/s" for r in limit["runs"]) + ".")
        out.append("")
    drain = results.get("drain")
    if drain and drain.get("mode") == "drain":
        out.append(f"Drain mode, Redis channel ({drain['messages']:,} messages of about 1 KB, the real handler "
                   f"with OUTBOX_MODE=drain, one invocation{_held(drain)}{_when(drain)}):")
        out.append("")
        out.append("| invocations at once | batch | msg/s | × minimal loop (same processes) | batches "
                   "| statements per batch | Redis round trips per batch | cold start, s |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
        rows = [(r, limit_rate(results, drain)) for r in drain["runs"]]
        rows.append((drain["two_invocations"], limit_rate(results, drain, processes=2)))
        for r, reference in rows:
            out.append(f"| {r['processes']} | {r['batch_size']:,} | {r['messages_per_second']:,.0f} "
                       f"| {ratio(r['messages_per_second'], reference)} | {_fmt(r.get('batches'))} "
                       f"| {_fmt(r.get('statements_per_batch'))} | {_fmt(r.get('redis_round_trips_per_batch'))} "
                       f"| {_seconds(r.get('cold_start_seconds'))} |")
        out.append("")
    out += memory_sweep_lines(results)
    lat = results.get("latency")
    if lat:
        for entry in latency_models(lat):
            legacy = entry.get("before_registry")
            out.append(f"Latency mode, {entry['label']} (`python -m bench latency`; {_function_settings(entry)}; "
                       f"{'a producer process commits' if legacy else 'producer processes commit'} at the offered "
                       f"rate for {_fmt(entry.get('seconds'))} s in small transactions; lag from commit to stream "
                       f"entry, ms"
                       + ("" if legacy else "; seconds without a poller in the producer's time, from the registry "
                          "and from when the bench's invocations ran") + f"{_held(entry)}{_when(entry)}):")
            out.append("")
            out.append("| " + " | ".join(LATENCY_COLUMNS) + " |")
            out.append("|" + "---:|" * (len(LATENCY_COLUMNS) - 1) + "---|")
            for r in entry["runs"]:
                out.append("| " + " | ".join(_latency_cells(r)) + " |")
            out.append("")
            if entry["runs"]:
                out += [plots.latency_figure(entry).link(), ""]
        idle = lat.get("idle")
        if idle:
            out.append(f"Idle (one latency-mode invocation, {idle['seconds']} s, nothing to deliver among "
                       f"{idle.get('history_rows', 0):,} delivered rows): "
                       f"{idle['polls']} polls, {_fmt(idle['statements_per_poll'])} statements and "
                       f"{_fmt(idle['redis_round_trips_per_poll'])} Redis round trips per poll"
                       + ("" if idle.get("registry_statements") is None else
                          f", and {idle['registry_statements']} statements of the poller registry (registration, "
                          f"heartbeats, leaving)") + "; the claim ran in "
                       f"{idle['claim_execution_ms']} ms on {', '.join(idle['claim_plan_index_scans'])}, "
                       f"sequential scans: {', '.join(idle['claim_plan_seq_scans']) or 'none'}.")
            out.append("")
    out += scaling_lines(results)
    ordering = results.get("ordering")
    if ordering:
        reference = limit_rate(results, ordering)
        out.append(f"Ordering keys (`python -m bench ordering`; {ordering['messages']:,} messages of about 1 KB, "
                   f"batch {ordering['batch_size']:,}, one drain-mode invocation, the keys drawn at random; "
                   f"median of {ordering['rounds']} interleaved rounds; every run checked in the stream: each "
                   f"message once, each key's messages in enqueue order{_held(ordering)}{_when(ordering)}):")
        out.append("")
        out.append("| keys | invocations at once | msg/s | × keyless | × one invocation | × minimal loop | batches "
                   "| out of order |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in [*ordering["runs"], ordering["two_invocations"]]:
            out.append(f"| {'none' if r['keys'] is None else format(r['keys'], ',')} | {r['processes']} "
                       f"| {r['messages_per_second']:,.0f} | {_times(r.get('vs_keyless'))} "
                       f"| {_times(r.get('vs_one_invocation'))} | {ratio(r['messages_per_second'], reference)} "
                       f"| {_fmt(r.get('batches'))} | {r['check']['order_violations']} |")
        out.append("")
    drain = results.get("batches")
    if drain:
        reference = limit_rate(results, drain)
        out.append(f"Batch mode, Redis channel ({drain['messages']:,} messages of about 1 KB, one batch per "
                   f"invocation, back to back{_held(drain)}{_when(drain)}):")
        out.append("")
        out.append("| batch | msg/s | × minimal loop | statements per batch | Redis round trips per batch "
                   "| CPU µs/msg: relay process | PostgreSQL backend | Redis server | relay's GC µs/msg |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for d in drain["runs"]:
            cpu = d["cpu_us_per_message"]
            out.append(f"| {d['batch_size']:,} | {d['messages_per_second']:,.0f} "
                       f"| {ratio(d['messages_per_second'], reference)} | {d['statements_per_batch']['max']} "
                       f"| {d['redis_round_trips_per_batch']['max']} | {_fmt(cpu.get('client'))} "
                       f"| {_fmt(cpu.get('postgresql'))} | {_fmt(cpu.get('redis'))} "
                       f"| {_fmt(d.get('gc', {}).get('us_per_message'))} |")
        out.append("")
        if drain["runs"]:
            out += [plots.batches_figure(results).link(), ""]
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
        out.append(f"Concurrency ({conc['messages']:,} messages, batch {conc['batch_size']:,}{_held(conc)}{_when(conc)}):")
        out.append("")
        out.append("| processes | msg/s | invocations | stream entries | distinct message ids | duplicates |")
        out.append("|---:|---:|---:|---:|---:|---:|")
        for r in conc["runs"]:
            c = r["check"]
            out.append(f"| {r['processes']} | {r['messages_per_second']:,.0f} | {r['invocations']:,} "
                       f"| {c['stream_entries']:,} | {c['distinct_ids']:,} | {c['duplicates']} |")
        out.append("")
        if conc["runs"]:
            out += [plots.concurrency_figure(results).link(), ""]
    rec = results.get("recovery")
    if rec:
        p, c = rec["poison"], rec["poison"]["check"]
        out.append(f"Recovery after a fleet-wide crash (`python -m bench recovery`; {rec['messages']:,} messages "
                   f"of about 1 KB, batch {rec['batch_size']:,}, {rec['invocations']} drain-mode invocations at "
                   f"once, each container invoking again until an invocation claims nothing; passes in the order "
                   f"{', '.join(rec['order'])}, the median of each kind compared{_held(rec)}{_when(rec)}):")
        out.append("")
        out.append("| pass | s | msg/s | × drain | invocations | claims | statements per batch "
                   "| attempts of the delivered | stream entries | duplicates |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
        for r in rec["runs"]:
            out.append(f"| {r['kind']} | {r['wall_seconds']:,.2f} | {r['messages_per_second']:,.0f} "
                       f"| {_times(r['wall_seconds'] / rec['drain_seconds'])} | {r['invocations']} | {r['claims']} "
                       f"| {_fmt(r['statements_per_batch'])} | "
                       + ", ".join(f"{k}: {v:,}" for k, v in r["check"]["attempts"].items())
                       + f" | {r['check']['stream_entries']:,} | {r['check']['duplicates']} |")
        out.append("")
        out.append(f"Recovery takes {_times(rec['recovery_vs_drain'])} the drain's time "
                   f"({rec['recovery_seconds']:,.2f} s against {rec['drain_seconds']:,.2f} s, medians). With one "
                   f"message among the {p['messages']:,} that kills its invocation whenever it is about to be "
                   f"published: the first pass delivered {p['first_pass_delivered']:,} in "
                   f"{p['first_pass_seconds']:,.2f} s ({_times(p['first_pass_vs_drain'])} the drain's time, one "
                   f"container fewer once it died); then {len(p['passes']) - 1} more passes, each after the dead "
                   f"invocation's leases ran out, recovered its batches one suspect at a time and met the poison "
                   f"alone, until it was dead after {c['poison_attempts']} of its {c['max_attempts']} attempts "
                   f"({c['poison_error_class']}), {c['invocations_killed']} invocations killed in all. Other "
                   f"messages dead: {c['other_dead']}; delivered {c['rows_delivered']:,}, each once in the stream "
                   f"({c['stream_entries']:,} entries, {c['duplicates']} duplicates, {c['lost']} lost); attempts of "
                   f"the delivered: " + ", ".join(f"{k}: {v:,}" for k, v in c["innocent_attempts"].items()) + ".")
        out.append("")
    growth = results.get("growth")
    if growth and growth.get("server"):
        server = growth["server"]
        out.append(f"As delivered history grows, on a PostgreSQL {server['server_version'].split()[0]} of the "
                   f"bench's own (autovacuum {server['autovacuum']}, shared_buffers {server['shared_buffers']}; "
                   f"history over {growth['days']} days; {growth['claims']} claims of {growth['claim_batch']}, "
                   f"{growth['enqueues']:,} enqueues of one message, a drain of {growth['drain_messages']:,}; "
                   f"claim plans on the partial indexes in every case: {_fmt(growth['plans_ok'])}"
                   + (f", delivered days pruned from them: {_fmt(growth['plans_prune_history'])}"
                      if "plans_prune_history" in growth else "") + f"{_when(growth.get('cases_run') or growth)}):")
        out += [""] + growth_table(growth) + [""]
        if "drop" in growth["cases"][0]["retention"]:
            out.append("A day's retention both ways on the same server in the same run, each right after a "
                       "CHECKPOINT while a producer enqueues one message per transaction: the oldest day dropped by "
                       "the maintenance function's path (`manage_days`), and as many rows seeded into day 0 deleted "
                       "by today's purge (`operations.purge`, batches of DELETE, day 0's path); dead rows read from "
                       "`pg_stat_user_tables` two seconds after, then the VACUUM the DELETE's call for:")
        else:
            out.append("A day's retention with today's purge (`operations.purge`, batches of DELETE, the maintenance "
                       "function's path) while a producer enqueues one message per transaction; dead rows read "
                       "from `pg_stat_user_tables` two seconds after, per table (message / body / history), then "
                       "the VACUUM they call for:")
        out += [""] + retention_table(growth) + [""]
        out += [plots.growth_figure(results).link(), ""]
        soak = growth.get("soak")
        if soak:
            when = (f" (run {soak['started_at']}, load average {soak.get('load_average_at_start')})"
                    if soak.get("started_at") else "")
            out.append(f"The soak{when}: {soak['minutes']:g} minutes, producers offering {soak['rate']:,} msg/s and a relay "
                       f"({soak['relay_cpu']}; drain-mode invocations every second or at once after a full batch), "
                       f"the delivered window compressed: a day keeps its real length, so {soak['seeded_days']} past "
                       f"days were seeded with {soak['rows_per_seeded_day']:,} rows each (what the producers offer "
                       f"in {soak['seconds_per_day']:g} s) and a maintenance run every {soak['seconds_per_day']:g} s "
                       "(`manage_days`, then the day-0 purge) dropped the oldest and opened one more day ahead; "
                       "claim p99 from the relay's claims, lag from created to delivered:")
            out += [""] + soak_table(soak) + [""]
            out += [plots.soak_figure(results).link(), ""]
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
    for channel in AWS_CHANNELS:
        section = results.get(channel)
        if not section:
            continue
        out.append(f"{_aws_title(section)} (`python -m bench {channel}`; drain mode, one invocation of the real "
                   f"handler; msg/s {_aws_rounds(section)}, as a ratio to the channel's "
                   f"minimal loop on the same moto server, which answers faster than AWS: the ratios are the "
                   f"figures{_held(section)}{_when(section)}):")
        out.append("")
        out.append("| variant | relay msg/s | minimal loop msg/s | × minimal loop | × Redis minimal loop | batches "
                   f"| {section['service']} calls per batch | entries per call | statements per batch "
                   "| outcome writes per batch, ms each (median), share of the wall "
                   "| most entries, bytes in a call | out of order: relay (minimal loop) "
                   "| CPU µs/msg: relay (minimal loop) | moto's CPU µs/msg: relay (minimal loop) |")
        out.append("|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|---|---|")
        reference = limit_rate(results, section)
        for r in section["runs"]:
            d, m = r["relay"], r["minimal"]
            cpu, loop_cpu = d.get("cpu_us_per_message", {}), m.get("cpu_us_per_message", {})
            out.append(f"| {_aws_variant(r)} | {_fmt(d['messages_per_second'])} | {_fmt(m['messages_per_second'])} "
                       f"| {_times(r['vs_minimal'])} | {ratio(d['messages_per_second'], reference)} "
                       f"| {_fmt(d['batches'])} | {_aws_calls(section, d)} | {_fmt(d['entries_per_call'])} "
                       f"| {_fmt(d['statements_per_batch'])} | {_outcome_writes(d)} | {d['max_entries_per_call']}, "
                       f"{d['max_bytes_per_call']:,} | {d['check']['out_of_order']} ({m['check']['out_of_order']}) "
                       f"| {_fmt(cpu.get('client'))} ({_fmt(loop_cpu.get('client'))}) "
                       f"| {_fmt(cpu.get('moto'))} ({_fmt(loop_cpu.get('moto'))}) |")
        out.append("")
    eq = results.get("enqueue_sql")
    if eq:
        rates, sql_ratio = eq["messages_per_second"], eq["sql_vs_python"]
        out.append(f"Enqueue from SQL (`python -m bench enqueue-sql`; {eq['messages_per_way']:,} messages each way, "
                   f"{eq['transaction']}, the four ways alternating in {eq['rounds']} rounds, the median round's "
                   f"rate{_when(eq)}): an event {_fmt(rates['event_sql'])} msg/s through "
                   f"`outbox_enqueue_event_v1` against {_fmt(rates['event_python'])} through the Python API "
                   f"({sql_ratio['event']:.2f}×); an email {_fmt(rates['email_sql'])} through "
                   f"`outbox_enqueue_email_v1` against {_fmt(rates['email_python'])} ({sql_ratio['email']:.2f}×).")
        out.append("")
    fb = results.get("feedback")
    if fb:
        rec, send = fb["recording"], fb["send_path"]
        out.append(f"SES feedback (`python -m bench feedback`{_held(fb)}{_when(fb)}): {rec['events_per_second']:,.1f} events "
                   f"recorded per second through the feedback handler, one SNS event per invocation "
                   f"({rec['events']:,} events, a tenth of them permanent bounces; {rec['redelivered']} redelivered, "
                   f"all duplicates, nothing changed). The SES relay on moto with the suppression list on "
                   f"({send['listed_addresses']:,} addresses listed, none a recipient) against off: "
                   f"{send['us_per_email_on']:,.0f} vs {send['us_per_email_off']:,.0f} µs per email, "
                   f"a ratio of {send['ratio_on_to_off']:.3f}; in this process's CPU time "
                   f"{send.get('cpu_ratio_on_to_off', float('nan')):.3f} (medians of {send['rounds']} rounds "
                   f"alternating which goes first, {send['sends']:,} emails each, batch {send['batch_size']}).")
        out.append("")
    rd = results.get("redis")
    if rd and rd.get("runs"):
        out.append(f"Redis as on AWS (`python -m bench redis`, servers of the section's own on loopback: a primary "
                   f"with a replica, and a cluster of 3 primaries with a replica each; drain mode, batch "
                   f"{rd['batch_size']:,}, {rd['messages']:,} messages over {rd['streams']} streams{_held(rd)}{_when(rd)}):")
        out.append("")
        out.append("| topology | WAIT | msg/s | Redis round trips per batch |")
        out.append("|---|---:|---:|---:|")
        for r in rd["runs"]:
            out.append(f"| {r['topology']} | {r['wait_replicas']} | {_fmt(r['messages_per_second'])} "
                       f"| {_fmt(r['redis_round_trips_per_batch'])} |")
        w, f = rd["wait_round_trip_ms"], rd["failover"]
        out.append("")
        out.append(f"A pipeline of one `XADD` took {w['without_p50']} ms (p50; p99 {w['without_p99']} ms), with "
                   f"`WAIT 1` after it {w['with_wait_p50']} ms (p99 {w['with_wait_p99']} ms). A primary killed "
                   f"(SIGKILL) in the middle of a drain of {f['messages']:,} messages with `WAIT 1`: "
                   f"{f['recorded_delivered_and_missing']} recorded delivered and missing, "
                   f"{f['duplicate_entries']} duplicate entries.")
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
                   f"{_held(ph)}{_when(ph)}), µs per message; in the claims of a full batch the first row arrived after "
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


def scaling_lines(results: dict[str, Any]) -> list[str]:
    """The pollers section's sustained rates and the catchup section's drain, as Markdown."""
    out: list[str] = []
    pol = results.get("pollers")
    if pol and pol.get("counts"):
        out.append(f"Pollers per channel (`python -m bench pollers`; OUTBOX_POLLERS pollers in latency mode, "
                   f"batch {pol['batch_size']:,}; producer processes commit for {_fmt(pol['seconds'])} s, each over "
                   f"{pol['keys_per_producer']} ordering keys of its own; a rate is sustained when the lag p99 "
                   f"stays within {pol['lag_p99_limit_ms']:g} ms and everything is delivered within 5 s of the "
                   f"producers' end; searched up by 1.5 × from {pol['start_rate']:,}/s, then halving, at most "
                   f"{pol['max_runs']} rates per count; then, per count, a backlog of {pol.get('backlog', 0):,} "
                   f"keyed messages waiting when the pollers start, producers offering 50 msg/s: entries written "
                   f"per second from the backlog's first to its last; CPU in cores while the producers ran: the "
                   f"bench database's PostgreSQL backends (the relay's, all) and the whole machine"
                   f"{_held(pol)}{_when(pol)}):")
        out.append("")
        out.append("| pollers | offered msg/s | committed msg/s | delivered msg/s | lag p50 ms | p99 ms "
                   "| PostgreSQL cores: relay | all | machine busy cores | keys out of order | lost | duplicates "
                   "| sustained |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for c in pol["counts"]:
            drain = c.get("drain") or {}
            for r in c["runs"] + ([drain["run"]] if drain.get("run") else []):
                cpu = r.get("cpu_cores") or {}
                offered = f"{r['offered_per_second']:,}" if r is not drain.get("run") else \
                    f"backlog {drain['messages']:,}: drained at {_rate(drain['drain_per_second'])}/s"
                verdict = ("yes" if r["sustained"] else f"no: {r.get('not_sustained') or 'not sustained'}") \
                    if r is not drain.get("run") else "–"
                out.append(f"| {c['pollers']} | {offered} | {_rate(r.get('sent_per_second'))} "
                           f"| {_rate(r['delivered_per_second'])} "
                           f"| {_fmt(r['lag_ms']['p50'])} | {_fmt(r['lag_ms']['p99'])} "
                           f"| {_fmt(cpu.get('postgresql_relay'))} | {_fmt(cpu.get('postgresql_all'))} "
                           f"| {_fmt(cpu.get('machine_busy'))} of {_fmt(cpu.get('machine_cores'))} "
                           f"| {_fmt(r['keys_out_of_order'])} | {r['lost']} | {r['duplicates']} | {verdict} |")
        out.append("")
        out.append("Sustained: " + "; ".join(
            f"{c['pollers']} poller{'s' if c['pollers'] > 1 else ''} {_rate(c['sustained_per_second'])} msg/s"
            + (f" ({c['vs_one']:.2f} × one)" if c.get("vs_one") and c["pollers"] > 1 else "")
            for c in pol["counts"]) + ". Backlog drained: " + "; ".join(
            f"{c['pollers']} poller{'s' if c['pollers'] > 1 else ''} {_rate(c['drain']['drain_per_second'])} msg/s"
            + (f" ({c['drain']['vs_one']:.2f} × one)" if c["drain"].get("vs_one") and c["pollers"] > 1 else "")
            for c in pol["counts"] if c.get("drain")) + ".")
        out.append("")
    cu = results.get("catchup")
    if cu and "skipped" not in cu:
        ref = (f"{cu['drain_vs_reference']:.2f} × the {cu['pollers']} pollers' backlog drain, "
               f"{_rate(cu['reference_per_second'])} msg/s, of {cu['reference_from']}"
               + ("" if (cu.get("reference_drain") or {}).get("producers_outlasted_drain", True)
                  else " (the producers stopped before that backlog had drained)")
               + (f"; {cu['drain_vs_unloaded']:.2f} × their drain of {cu['unloaded_drain']['messages']:,} "
                  f"waiting with no producer to keep up with, {_rate(cu['unloaded_per_second'])} msg/s"
                  if cu.get("drain_vs_unloaded") else "")
               if cu.get("drain_vs_reference") else "no reference to compare with")
        check = cu["check"]
        out.append(f"Catching up after a downstream outage (`python -m bench catchup`; {cu['pollers']} pollers; "
                   f"producers offer {cu['offered_per_second']:,} msg/s, half of one poller's sustained "
                   f"{_rate(cu['r1_per_second'])} msg/s, over {cu['keys_per_producer']} ordering keys each; the "
                   f"relay's PostgreSQL and Redis servers of the bench's own, autovacuum on, the Redis killed "
                   f"after {_fmt(cu['lead_seconds'])} s and "
                   f"restarted {_fmt(cu['outage_seconds'] / 60)} min later; the producers go on "
                   f"{_fmt(cu['tail_seconds'])} s after it{_held(cu)}{_when(cu)}): "
                   f"{_fmt(cu['delivered_during_outage'])} delivered during the outage, "
                   f"{cu['backlog_at_restart']:,} waiting at the restart, drained in "
                   f"{_fmt(cu['backlog_drained_seconds'])} s at {_rate(cu['drain_per_second'])} msg/s ({ref}); "
                   + (f"the lag p99 of new commits back within {_fmt(cu['normal_lag_p99_ms'])} ms "
                      f"{_fmt(cu['caught_up_after_seconds'])} s after the restart"
                      if cu.get("caught_up_after_seconds") is not None else
                      f"the lag of new commits not back to normal before the producers stopped, "
                      f"{_fmt(cu['tail_seconds'])} s after the restart; the last message delivered "
                      f"{_fmt(cu['latency_run'].get('drained_seconds_after_producer'))} s after they stopped")
                   + f"; {check['keys_out_of_order']} keys out of order, {check['lost']} lost, "
                   f"{check['duplicates']} duplicates.")
        out.append("")
    out += autoscale_lines(results)
    return out


def autoscale_lines(results: dict[str, Any]) -> list[str]:
    """The autoscale section: per step, each step's follow time, and the figure."""
    au = results.get("autoscale")
    if not au or not au.get("steps"):
        return []
    from . import plots

    lag, check = au["lag_outside_steps_ms"], au["check"]
    out = [f"Autoscaling (`python -m bench autoscale`; OUTBOX_POLLERS {au['pollers']}, OUTBOX_POLLERS_MAX "
           f"{au['pollers_max']}, OUTBOX_POLLERS_ADD_AGE_SECONDS {au['add_age_seconds']:g}; producers offer "
           f"{', then '.join(format(s['fraction'], 'g') for s in au['steps'])} × R1 for {_fmt(au['step_seconds'])} s each, "
           f"R1 {_rate(au['r1_per_second'])} msg/s from {au['r1_from']}, over {au['keys_per_producer']} ordering "
           f"keys each; live pollers read from the registry each second; a step is followed from when they stay "
           f"(median of 5 s) at what the load needs to the step's end, offered / R1 rounded up, at least OUTBOX_POLLERS; the lag outside the steps "
           f"leaves out the commits of {_fmt(au['settle_seconds'])} s after each ([decision "
           f"0068](decisions/0068-autoscaling-figures-against-what-the-load-needs.md)){_held(au)}{_when(au)}):", "",
           "| step | offered msg/s | committed msg/s | delivered msg/s | pollers needed | most live "
           "| poller-seconds per second | vs needed |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in au["steps"]:
        out.append(f"| {s['fraction']:g} × R1 | {s['offered_per_second']:,} | {_rate(s['committed_per_second'])} "
                   f"| {_rate(s['delivered_per_second'])} | {s['needs']} | {_fmt(s['live_pollers_most'])} "
                   f"| {_fmt(s['poller_seconds_per_second'])} | {_times(s['vs_needs'])} |")
    out += ["", "Pollers followed " + "; ".join(
        f"the step {c['direction']} at {_fmt(c['at_second'])} s (to {c['needs_after']}) "
        + (f"after {_fmt(c['followed_after_seconds'])} s" if c["followed_after_seconds"] is not None
           else "not within the step") for c in au["changes"])
        + f". Lag outside the steps p50 {_fmt(lag['p50'])} ms, p99 {_fmt(lag['p99'])} ms "
        f"({lag['messages']:,} messages); {_fmt(au['poller_seconds_per_second'])} poller-seconds per second for "
        f"{_fmt(au['needs_per_second'])} needed ({_times(au['vs_needs'])}); {check['keys_out_of_order']} keys out "
        f"of order, {check['lost']} lost, {check['duplicates']} duplicates.", "",
        plots.autoscale_figure(results).link(), ""]
    return out


def docs(results: dict[str, Any]) -> str:
    """docs/benchmark.md: the method (bench/method.md) and the latest figures."""
    results = dict(results)
    results["targets"] = evaluate(results)
    return ("# Benchmark\n\n"
            "<!-- Written by `python -m bench` from bench/results/latest.json (text: bench/method.md); "
            "do not edit: run `python -m bench docs`. -->\n\n"
            + METHOD.read_text(encoding="utf-8").rstrip() + "\n\n## Latest figures\n\n"
            + markdown(results).rstrip() + "\n")


README = Path(__file__).resolve().parent.parent / "README.md"
MODES_BEGIN = "<!-- bench:modes (written by python -m bench from bench/results/latest.json) -->"
MODES_END = "<!-- /bench:modes -->"

# The template's defaults the cost columns are computed from (template.yaml; a test checks them).
SCHEDULE_PERIOD_SECONDS = 60
FUNCTION_MEMORY_GB = 0.5
FUNCTION_TIMEOUT_SECONDS = 150
DEADLINE_MARGIN_SECONDS = 5
BATCH_SIZE = 500
POLL_INTERVAL_SECONDS = 0.1
SECONDS_PER_MONTH = 30 * 86400


def _modes_entry(lat: dict[str, Any]) -> dict[str, Any] | None:
    """The latency model the README's table quotes: the latest run of a model of
    AWS's scheduler (late and missed runs, cold starts) if any, else the punctual one."""
    entries = latency_models(lat)
    rough = [e for e in entries if e["model"]["key"] != "punctual"]
    if rough:
        return max(rough, key=lambda e: e.get("started_at") or "")
    return entries[0] if entries else None


def modes_table(results: dict[str, Any]) -> str:
    """The README's table of what each mode costs and delivers, per channel, at the
    template's defaults: batch and drain costs computed, latency mode's cost from the
    measured poller-seconds, lag and throughput from the results file."""
    invocations = SECONDS_PER_MONTH // SCHEDULE_PERIOD_SECONDS
    lat = results.get("latency", {})
    idle = lat.get("idle") or {}
    idle_run = (idle.get("batch_invocation_ms") or 0) / 1000.0  # a warm batch-mode invocation, nothing due
    drain = results.get("drain", {}) if results.get("drain", {}).get("mode") == "drain" else {}
    drained = next((r["messages_per_second"] for r in drain.get("runs", []) if r["batch_size"] == 1000), None)
    entry = _modes_entry(lat)
    runs = entry["runs"] if entry else []
    at = {r["offered_per_second"]: r for r in runs}
    top = _latency_run(entry) if entry else None
    measured = [r for r in runs if r.get("poller_seconds_per_second") is not None]
    seconds = sum(r["seconds"] for r in measured)
    pollers = sum(r["poller_seconds_per_second"] * r["seconds"] for r in measured) / seconds if seconds else None
    started = sum(r["invocations"]["by_self_invoke"] for r in measured) / seconds if seconds else None
    without = sum(r["without_poller"].get("registry_seconds") or 0.0 for r in measured)

    def lag(rate: int) -> str:
        run = at.get(rate)
        return "–" if run is None else f"{_fmt(run['lag_ms']['p50'])} / {_fmt(run['lag_ms']['p99'])} ms"

    def gb_s(seconds_per_invocation: float) -> str:
        return f"{invocations * seconds_per_invocation * FUNCTION_MEMORY_GB:,.0f}"

    rows = [
        ("`batch`", f"{invocations:,}", (gb_s(idle_run) + " idle") if idle_run else "–",
         f"{1 / SCHEDULE_PERIOD_SECONDS:.3f}",
         f"up to {SCHEDULE_PERIOD_SECONDS} s (half of it on average)",
         f"{BATCH_SIZE / SCHEDULE_PERIOD_SECONDS:.1f} msg/s ({BATCH_SIZE} per run)"),
        ("`drain`", f"{invocations:,}", (gb_s(idle_run) + " idle") if idle_run else "–",
         f"{1 / SCHEDULE_PERIOD_SECONDS:.3f}",
         f"up to {SCHEDULE_PERIOD_SECONDS} s (half of it on average)",
         f"{_fmt(drained)} msg/s while a run lasts{_held(drain)}" if drained else "–"),
        ("`latency`", f"{invocations:,}" + (f" scheduled, {started * SECONDS_PER_MONTH:,.0f} started by pollers"
                                             if started else ""),
         "–" if pollers is None else (f"{SECONDS_PER_MONTH * pollers * FUNCTION_MEMORY_GB:,.0f} "
                                      f"({pollers:.2f} pollers at a time)"),
         f"{1 / POLL_INTERVAL_SECONDS:.0f}" + (f" (measured {idle['polls_per_second']:g} polls/s, "
                                                f"{_fmt(idle['statements_per_poll'])} statement each"
                                                + ("" if idle.get("registry_statements_per_second") is None else
                                                   f", and {idle['registry_statements_per_second']:g} of the "
                                                   f"poller registry") + ")"
                                                if idle else ""),
         f"{lag(100)} at 100 msg/s, {lag(1000)} at 1,000 msg/s (p50 / p99)"
         + (f"; {without:g} s without a poller in {seconds:,.0f} s" if seconds else ""),
         f"{top['offered_per_second']:,} msg/s sustained (the highest offered that was{_held(entry)})"
         if top and entry else "–"),
    ]
    out = [MODES_BEGIN, "",
           "| mode | invocations a month | Lambda GB-seconds a month | statements a second when idle "
           "| delivery lag | throughput |", "|---|---:|---:|---|---|---|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    out += ["", f"Per channel, at the template's defaults (`rate(1 minute)`, {FUNCTION_MEMORY_GB * 1024:.0f} MB, "
                f"a {FUNCTION_TIMEOUT_SECONDS} s timeout, batch {BATCH_SIZE}); measured on this project's 2-core "
                f"benchmark machine ([docs/benchmark.md](docs/benchmark.md)"
                + ("" if entry is None else f"; latency mode {entry['label']}" + _when(entry)) + ")."
                + ("" if aws_summary(results) is None else " " + aws_summary(results))
                + ("" if memory_growth(results) is None else " " + memory_growth(results)), "",
            MODES_END]
    return "\n".join(out)


def readme_with_modes(readme: str, results: dict[str, Any]) -> str:
    """The README with its modes block written again (unchanged when it has none)."""
    return _with_block(readme, MODES_BEGIN, MODES_END, modes_table(results))


CHANNELS = Path(__file__).resolve().parent.parent / "docs" / "channels.md"
ORDERING_BEGIN = "<!-- bench:ordering (written by python -m bench from bench/results/latest.json) -->"
ORDERING_END = "<!-- /bench:ordering -->"


def ordering_summary(results: dict[str, Any]) -> str:
    """docs/channels.md's lines on what ordering keys cost, from the ordering section."""
    ordering = results.get("ordering")
    if not ordering:
        return "\n".join([ORDERING_BEGIN, "", "Not measured yet: run `python -m bench ordering`.", "", ORDERING_END])
    by_keys = {r["keys"]: r for r in ordering["runs"]}
    spread = ", ".join(f"{keys:,} key{'s' if keys > 1 else ''} {_times(by_keys[keys]['vs_keyless'])}"
                       for keys in sorted((k for k in by_keys if k is not None), reverse=True))
    two = ordering["two_invocations"]
    violations = sum(r["check"]["order_violations"] for r in [*ordering["runs"], two])
    line = (f"Measured by `python -m bench ordering` ({ordering['messages']:,} messages, batch "
            f"{ordering['batch_size']:,}, one drain-mode invocation, keys drawn at random; throughput as a "
            f"ratio to the same backlog without keys, in the same run{_when(ordering)}): {spread}; two "
            f"invocations at once over {two['keys']:,} keys deliver {_times(two['vs_one_invocation'])} what one "
            f"does. Messages out of order in every run: {violations}. The tables are in "
            f"[benchmark.md](benchmark.md).")
    return "\n".join([ORDERING_BEGIN, "", line, "", ORDERING_END])


def _with_block(text: str, begin: str, end: str, block: str) -> str:
    """`text` with the block between `begin` and `end` replaced (unchanged when it has none)."""
    if begin not in text or end not in text:
        return text
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + block + tail


def write_docs(results: dict[str, Any], path: Path = DOCS) -> Path:
    """Write the page, its figures beside it (`plots`; one line when they were
    skipped) and, for docs/benchmark.md itself, the blocks other pages quote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(docs(results), encoding="utf-8")
    if plots.draw(results, path.parent / plots.LINK_DIR) is None:
        print(plots.skipped_line())
    if path == DOCS:
        for target, write_block in ((README, readme_with_modes),
                                    (CHANNELS, lambda text, r: _with_block(text, ORDERING_BEGIN, ORDERING_END,
                                                                           ordering_summary(r)))):
            if target.exists():
                target.write_text(write_block(target.read_text(encoding="utf-8"), results), encoding="utf-8")
    return path
