"""The figures beside docs/benchmark.md's tables, as PNGs in docs/img/, drawn
from the results file (the data the tables come from), so `python -m bench
docs` draws them again without running anything.

matplotlib is an optional extra (`pip install -e '.[plots]'`): without it the
tables are written as always and `draw` says in one line that plots were
skipped. Which figures exist, and so the page's links, depends on the results
file alone, never on whether matplotlib is installed.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

IMG_DIR = Path(__file__).resolve().parent.parent / "docs" / "img"
#: How the page links a figure (docs/benchmark.md sits beside docs/img/).
LINK_DIR = "img"
#: Pixels per inch of every PNG (the page shows them at about 1,000 pixels wide).
DPI = 100
INSTALL_HINT = "pip install -e '.[plots]'"


@dataclass(frozen=True)
class Figure:
    """One PNG: its file name, what it shows (the image's alt text), and how to draw it."""

    file: str
    alt: str
    draw: Callable[[Any], Any]

    def link(self) -> str:
        return f"![{self.alt}]({LINK_DIR}/{self.file})"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def latency_figure(entry: dict[str, Any]) -> Figure:
    """The figure of one latency scheduler model (key: its `model.key`)."""
    key = entry["model"]["key"]
    return Figure(f"latency-{_slug(key)}.png",
                  f"Delivery lag over time, invocations and handovers marked ({key})",
                  lambda plt: _draw_latency(plt, entry))


def batches_figure(results: dict[str, Any]) -> Figure:
    return Figure("throughput-per-batch-size.png", "Batch mode msg/s per batch size",
                  lambda plt: _draw_batches(plt, results))


def concurrency_figure(results: dict[str, Any]) -> Figure:
    return Figure("throughput-per-process-count.png", "msg/s per number of processes draining one backlog",
                  lambda plt: _draw_concurrency(plt, results["concurrency"]))


def growth_figure(results: dict[str, Any]) -> Figure:
    return Figure("claim-time-as-the-table-grows.png", "Claim time as delivered history grows",
                  lambda plt: _draw_growth(plt, results["growth"]))


def autoscale_figure(results: dict[str, Any]) -> Figure:
    return Figure("autoscale-pollers-and-lag.png", "Offered load stepped, live pollers and lag over time",
                  lambda plt: _draw_autoscale(plt, results["autoscale"]))


def figures(results: dict[str, Any]) -> list[Figure]:
    """Every figure the results file has data for, in the page's order."""
    from .report import latency_models

    out = [latency_figure(e) for e in latency_models(results.get("latency")) if e.get("runs")]
    if (results.get("batches") or {}).get("runs"):
        out.append(batches_figure(results))
    if (results.get("concurrency") or {}).get("runs"):
        out.append(concurrency_figure(results))
    if (results.get("growth") or {}).get("cases"):
        out.append(growth_figure(results))
    if (results.get("growth") or {}).get("soak"):
        out.append(soak_figure(results))
    if (results.get("autoscale") or {}).get("steps"):
        out.append(autoscale_figure(results))
    return out


def draw(results: dict[str, Any], directory: Path = IMG_DIR) -> list[Path] | None:
    """Write every figure of `results` into `directory`; None (nothing written)
    when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display is needed or wanted
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    with plt.rc_context({"font.size": 10, "axes.titlesize": 11, "axes.grid": True, "grid.alpha": 0.3,
                         "svg.hashsalt": "outbox", "path.simplify": True}):
        for figure in figures(results):
            fig = figure.draw(plt)
            path = directory / figure.file
            fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
            plt.close(fig)
            written.append(path)
    return written


def skipped_line() -> str:
    return f"plots skipped: matplotlib is not installed ({INSTALL_HINT}); the tables were written"


# ----------------------------------------------------------------- latency

def _draw_latency(plt: Any, entry: dict[str, Any]) -> Any:
    runs = entry["runs"]
    fig = plt.figure(figsize=(14, 4.6 * len(runs) + 0.4), layout="constrained")
    fig.suptitle("\n".join(textwrap.wrap(f"Latency mode, {entry['label']}", 120)), fontsize=12)
    for sub, run in zip(fig.subfigures(len(runs), 1, hspace=0.04) if len(runs) > 1 else [fig], runs):
        lag_ax, inv_ax = sub.subplots(2, 1, sharex=True, height_ratios=[3, 1])
        _latency_run(lag_ax, inv_ax, run)
    return fig


def _latency_run(lag_ax: Any, inv_ax: Any, run: dict[str, Any]) -> None:
    lag = run["lag_ms"]
    timeline = run.get("timeline") or []
    ends = [t["ended"] for t in timeline if t.get("ended") is not None]
    end = max(ends + [run.get("seconds") or 0.0])
    lag_ax.set_title(f"offered {run['offered_per_second']:,} msg/s for {run['seconds']:g} s: lag p50 {lag['p50']} ms, "
                     f"p99 {lag['p99']} ms, max {lag['max']} ms; {run.get('handovers', 0)} handovers, "
                     f"lost {run.get('lost')}, duplicates {run.get('duplicates')}", loc="left")
    series = run.get("lag_per_second_ms")
    if series:
        for key, style in (("max", dict(color="tab:red", lw=0.8)), ("p99", dict(color="tab:orange", lw=1.0)),
                           ("p50", dict(color="tab:blue", lw=1.2))):
            lag_ax.plot([s + 0.5 for s in series["second"]], series[key], label=f"{key} per second of commits",
                        **style)
    else:
        lag_ax.axhline(lag["p50"], color="tab:blue", ls="--", lw=1.2, label=f"p50 of the run ({lag['p50']} ms)")
        lag_ax.axhline(lag["p99"], color="tab:orange", ls="--", lw=1.2, label=f"p99 of the run ({lag['p99']} ms)")
        lag_ax.axhline(lag["max"], color="tab:red", ls=":", lw=1.2, label=f"max of the run ({lag['max']} ms)")
    handovers = _handover_times(timeline)
    peaks = run.get("handover_max_lag_ms") or []
    if handovers and len(peaks) == len(handovers):
        lag_ax.plot(handovers, peaks, "D", color="black", ms=5,
                    label="largest lag of the commits from 1 s before to 3 s after a handover")
    for k, t in enumerate(handovers):
        for ax in (lag_ax, inv_ax):
            ax.axvline(t, color="grey", ls=":", lw=0.9, label="handover (the next invocation starts)"
                       if ax is lag_ax and k == 0 else None)
    _log_ms(lag_ax)
    lag_ax.set_ylabel("commit-to-entry lag, ms (log scale)")
    lag_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    lag_ax.tick_params(labelbottom=False)
    colours = {"schedule": "tab:blue", "self-invoke": "tab:green"}
    shown: set[str] = set()
    for t in timeline:
        if t.get("began") is None:
            continue
        stop = t["ended"] if t.get("ended") is not None else end
        source = t.get("source", "schedule")
        label = f"invocation started by {source}" if source not in shown else None
        shown.add(source)
        inv_ax.barh(t.get("container", 0), stop - t["began"], left=t["began"], height=0.6,
                    color=colours.get(source, "tab:purple"), edgecolor="black" if t.get("error") else "none",
                    label=label)
    lanes = sorted({t.get("container", 0) for t in timeline})
    inv_ax.set_yticks(lanes)
    inv_ax.set_ylim(min(lanes, default=0) - 0.6, max(lanes, default=0) + 0.6)
    inv_ax.set_ylabel("container")
    inv_ax.set_xlabel("seconds since the producer began committing")
    start = min([0.0] + [t["began"] for t in timeline if t.get("began") is not None])
    pad = max(0.2, (end - start) / 100)
    inv_ax.set_xlim(start - pad, end + pad)
    inv_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    inv_ax.grid(axis="y", visible=False)


def _log_ms(ax: Any) -> None:
    """A log scale whose ticks read as plain milliseconds (1, 2, 5, 10, 20, 50, …)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 1.6)  # room above the largest lag
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _handover_times(timeline: list[dict[str, Any]]) -> list[float]:
    """When each invocation after the first began: a handover (as the bench counts them)."""
    begun = sorted(t["began"] for t in timeline if t.get("began") is not None)
    return begun[1:]


# ----------------------------------------------------------------- throughput

def _thousands(ax: Any) -> None:
    from matplotlib.ticker import StrMethodFormatter

    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))


def _bar_labels(ax: Any, bars: Any, fmt: str = "{:,.0f}", notes: list[str] | None = None) -> None:
    for k, bar in enumerate(bars):
        ax.annotate(fmt.format(bar.get_height()) + (notes[k] if notes else ""), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=9, xytext=(0, 2), textcoords="offset points")


def _draw_batches(plt: Any, results: dict[str, Any]) -> Any:
    from .report import limit_rate

    section = results["batches"]
    runs = section["runs"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [f"{r['batch_size']:,}" for r in runs]
    bars = ax.bar(labels, [r["messages_per_second"] for r in runs], color="tab:blue",
                  label="batch mode: one batch per invocation, back to back")
    _bar_labels(ax, bars)
    reference = limit_rate(results, section)
    if reference:
        ax.axhline(reference, color="tab:red", ls="--", label=f"minimal loop, same run ({reference:,.0f} msg/s)")
    ax.set_title(f"Batch mode, Redis channel: {section['messages']:,} messages of about 1 KB, "
                 "throughput per batch size", loc="left")
    ax.set_xlabel("batch size (OUTBOX_BATCH_SIZE), messages")
    ax.set_ylabel("messages per second")
    ax.set_ylim(0, max(b.get_height() for b in bars) * 1.15)
    _thousands(ax)
    ax.legend(loc="upper left")
    ax.grid(axis="x", visible=False)
    return fig


def _draw_concurrency(plt: Any, section: dict[str, Any]) -> Any:
    runs = section["runs"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [str(r["processes"]) for r in runs]
    bars = ax.bar(labels, [r["messages_per_second"] for r in runs], color="tab:blue",
                  label="processes draining one backlog (× one process's rate)")
    one = next((r["messages_per_second"] for r in runs if r["processes"] == 1), None)
    _bar_labels(ax, bars, notes=[f" ({r['messages_per_second'] / one:.2f}×)" if one else "" for r in runs])
    ax.set_title(f"Concurrency: {section['messages']:,} messages, batch {section['batch_size']:,}, "
                 "throughput per process count (2 cores)", loc="left")
    ax.set_xlabel("processes, one invocation loop each")
    ax.set_ylabel("messages per second")
    ax.set_ylim(0, max(b.get_height() for b in bars) * 1.2)
    _thousands(ax)
    ax.legend(loc="upper left")
    ax.grid(axis="x", visible=False)
    return fig


# ----------------------------------------------------------------- growth

def _draw_growth(plt: Any, section: dict[str, Any]) -> Any:
    cases = section["cases"]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.27
    xs = range(len(cases))
    for k, (key, label, colour) in enumerate((("median_ms", "median", "tab:blue"), ("p99_ms", "p99", "tab:orange"),
                                             ("max_ms", "max", "tab:red"))):
        values = [c.get(key) for c in cases]
        if any(v is None for v in values):
            continue
        bars = ax.bar([x + (k - 1) * width for x in xs], values, width, label=label, color=colour)
        _bar_labels(ax, bars, "{:.1f}")
    ax.set_xticks(list(xs), [f"{c['delivered']:,} delivered\n{c['pending']:,} pending" for c in cases])
    ax.set_xlabel("rows present at each case's claims")
    ax.set_title(f"Claim time as delivered history grows: {section['claims']} claims of {section['claim_batch']} "
                 "per case", loc="left")
    ax.set_ylabel("claim statement, ms")
    ax.set_ylim(0, max(max(c.get("max_ms") or c["p99_ms"], c["p99_ms"]) for c in cases) * 1.2)
    ax.legend(loc="upper right")
    ax.grid(axis="x", visible=False)
    return fig


# ----------------------------------------------------------------- growth: the soak

def soak_figure(results: dict[str, Any]) -> Figure:
    return Figure("claim-time-and-size-over-the-soak.png",
                  "Claim p99 and the outbox's size over the soak, days dropped during it",
                  lambda plt: _draw_soak(plt, results["growth"]["soak"]))


def _draw_soak(plt: Any, soak: dict[str, Any]) -> Any:
    windows = soak["windows"]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    claims = [(w["t"] / 60, w["claim_p99_ms"]) for w in windows if w["claim_p99_ms"] is not None]
    ax.plot([t for t, _ in claims], [v for _, v in claims], color="tab:orange", label="claim p99 (per 10 s)")
    ax.set_xlabel("minutes into the soak")
    ax.set_ylabel("claim, ms")
    size_ax = ax.twinx()
    sizes = [(w["t"] / 60, w["bytes"] / 2**20) for w in windows if w["bytes"] is not None]
    size_ax.plot([t for t, _ in sizes], [v for _, v in sizes], color="tab:blue", label="three tables, MiB")
    size_ax.set_ylabel("on disk, MiB")
    size_ax.set_ylim(0, max([v for _, v in sizes] or [1]) * 1.2)
    for m in soak["maintenance"]:
        ax.axvline(m["t"] / 60, color="grey", alpha=0.3, linewidth=0.8)
    ax.set_title(f"The soak: {soak['offered_per_second']:,.0f} msg/s offered, a day dropped at each grey line",
                 loc="left")
    lines = ax.get_legend_handles_labels()
    more = size_ax.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    return fig


# ----------------------------------------------------------------- autoscale

def _draw_autoscale(plt: Any, section: dict[str, Any]) -> Any:
    per = section["per_second"]
    t = [x + 0.5 for x in per["second"]]
    fig, (rate_ax, poll_ax, lag_ax) = plt.subplots(3, 1, sharex=True, figsize=(14, 9), layout="constrained",
                                                   height_ratios=[2, 2, 2])
    fig.suptitle(f"Offered load stepped {' → '.join(f'{f:g}' for f in section['fractions'])} × R1 "
                 f"({section['r1_per_second']:,.0f} msg/s), OUTBOX_POLLERS_MAX {section['pollers_max']}", fontsize=12)
    rate_ax.plot(t, per["offered"], color="black", lw=1.0, ls="--", label="offered")
    rate_ax.plot(t, per["committed"], color="tab:blue", lw=1.0, label="committed")
    rate_ax.plot(t, per["delivered"], color="tab:green", lw=1.0, label="delivered (stream entries)")
    rate_ax.set_ylabel("msg/s")
    _thousands(rate_ax)
    rate_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    poll_ax.step(t, per["needs"], where="mid", color="black", ls="--", lw=1.0, label="needed (offered / R1, up)")
    poll_ax.step(t, [v if v is not None else float("nan") for v in per["live_pollers"]], where="mid",
                 color="tab:purple", lw=1.2, label="live (registry)")
    poll_ax.plot(t, per["poller_seconds"], color="tab:orange", lw=0.8, label="poller-seconds per second")
    poll_ax.set_ylabel("pollers")
    poll_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    for key, style in (("lag_p99_ms", dict(color="tab:orange", lw=1.0)), ("lag_p50_ms", dict(color="tab:blue", lw=1.2))):
        lag_ax.plot(t, [v if v is not None else float("nan") for v in per[key]],
                    label=f"{key.split('_')[1]} per second of commits", **style)
    _log_ms(lag_ax)
    lag_ax.set_ylabel("commit-to-entry lag, ms (log scale)")
    lag_ax.set_xlabel("seconds since the producers began committing")
    lag_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    for c in section["changes"]:
        for ax in (rate_ax, poll_ax, lag_ax):
            ax.axvline(c["at_second"], color="grey", ls=":", lw=0.9)
    return fig
