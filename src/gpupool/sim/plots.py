"""Figures of replays (PNG): allocation over time, queue waits, lost work."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: figures only go to files

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from gpupool.sim.records import Outcome, Usage
from gpupool.sim.replay import Replayed
from gpupool.sim.report import ordered_classes
from gpupool.units import human_seconds

FIXED_COLOURS: dict[str, str] = {
    "urgent": "tab:red",
    "high": "tab:orange",
    "normal": "tab:blue",
    "low": "tab:grey",
}
_OTHER_COLOURS = ("tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
_LOST_COLOURS = {"wasted": "tab:red", "drain": "tab:orange", "restart": "tab:purple"}
_DPI = 120


def class_colours(names: Iterable[str]) -> dict[str, str]:
    """A colour per priority class: fixed for the default classes, the rest in turn from a cycle."""
    colours: dict[str, str] = {}
    others = 0
    for name in ordered_classes(names):
        if name in FIXED_COLOURS:
            colours[name] = FIXED_COLOURS[name]
        else:
            colours[name] = _OTHER_COLOURS[others % len(_OTHER_COLOURS)]
            others += 1
    return colours


def allocation_by_class(usage: Sequence[Usage], bins: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Bin edges (seconds) from the first to the last change, and per class the time-weighted
    mean of allocated GPUs in each bin; classes in priority order."""
    if bins < 1:
        raise ValueError(f"bins must be at least 1, not {bins}")
    if not usage:
        return np.linspace(0.0, 1.0, bins + 1), {}
    start = min(u.time for u in usage)
    end = max(u.time for u in usage)
    # All changes at one instant: show the level they leave over one second.
    edges = np.linspace(start, end if end > start else start + 1.0, bins + 1)
    changes: dict[str, list[Usage]] = defaultdict(list)
    for u in usage:
        changes[u.priority].append(u)
    means: dict[str, np.ndarray] = {}
    for name in ordered_classes(changes):
        ordered = sorted(changes[name], key=lambda u: u.time)
        times = np.array([u.time for u in ordered] + [edges[-1]], dtype=float)
        level = np.cumsum([u.gpus for u in ordered], dtype=float)
        # GPU-seconds up to each change; exact between changes by linear interpolation,
        # because the level is constant there.
        area = np.concatenate(([0.0], np.cumsum(level * np.diff(times))))
        at_edges = np.interp(edges, times, area, left=0.0)
        means[name] = np.diff(at_edges) / np.diff(edges)
    return edges, means


def utilization_over_time(outcome: Outcome, path: Path, *, title: str, bins: int = 400) -> None:
    """Stacked area of allocated GPUs by priority class over time, with the pool's capacity."""
    edges, means = allocation_by_class(outcome.usage, bins)
    hours = (edges - edges[0]) / 3600
    colours = class_colours(means)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    if means:
        # Repeat the last bin so the step drawing reaches the right edge.
        series = [np.append(values, values[-1]) for values in means.values()]
        ax.stackplot(
            hours,
            series,
            labels=list(means),
            colors=[colours[name] for name in means],
            step="post",
            alpha=0.85,
            linewidth=0,
        )
    else:
        ax.text(0.5, 0.5, "no job ever ran", transform=ax.transAxes, ha="center", va="center")
    ax.axhline(outcome.capacity, color="black", linestyle="--", linewidth=1, label=f"capacity ({outcome.capacity})")
    ax.set_xlim(hours[0], hours[-1])
    ax.set_ylim(0, max(outcome.capacity, 1) * 1.08)
    ax.set_xlabel("time since the first event (hours)")
    ax.set_ylabel(f"allocated GPUs (mean per {human_seconds(float(edges[1] - edges[0]))})")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    # Legend top to bottom as the stack reads; capacity last.
    order = [*reversed(range(len(means))), len(means)] if means else [0]
    ax.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    _save(fig, path)


_WAIT_TICKS: tuple[tuple[float, str], ...] = (
    (1.0, "1 s"),
    (10.0, "10 s"),
    (60.0, "1 min"),
    (600.0, "10 min"),
    (3600.0, "1 h"),
    (6 * 3600.0, "6 h"),
    (86400.0, "1 d"),
    (7 * 86400.0, "1 wk"),
    (30 * 86400.0, "30 d"),
)


def wait_cdf(outcomes: Mapping[str, Outcome], path: Path) -> None:
    """Per policy, the CDF of queue wait of finished jobs by priority class (log minutes)."""
    waits: dict[str, dict[str, np.ndarray]] = {}
    for policy, outcome in outcomes.items():
        by_class: dict[str, list[float]] = defaultdict(list)
        for record in outcome.records:
            if record.finish is not None:
                by_class[record.job.priority].append(record.wait)
        waits[policy] = {
            name: np.sort(np.maximum(np.asarray(by_class[name], dtype=float), 1.0)) / 60
            for name in ordered_classes(by_class)
        }
    colours = class_colours(name for per in waits.values() for name in per)
    longest = max((w[-1] for per in waits.values() for w in per.values()), default=1.0)
    ticks = [(t / 60, label) for t, label in _WAIT_TICKS if t / 60 <= max(longest * 1.5, 1.0)]
    fig, axes = plt.subplots(
        1,
        max(len(waits), 1),
        figsize=(4.6 * max(len(waits), 1) + 1.2, 4.2),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    for ax, (policy, per) in zip(axes[0], waits.items(), strict=False):
        for name, values in per.items():
            shares = np.arange(1, len(values) + 1) / len(values)
            ax.step(
                np.concatenate(([values[0]], values)),
                np.concatenate(([0.0], shares)),
                where="post",
                color=colours[name],
                label=name,
                linewidth=1.6,
            )
        if not per:
            ax.text(0.5, 0.5, "no finished jobs", transform=ax.transAxes, ha="center", va="center")
        elif all(values[-1] <= 1 / 60 for values in per.values()):
            # A lone vertical line at the left edge is easy to miss: say it.
            ax.text(0.5, 0.5, "every job started\nwithin 1 s", transform=ax.transAxes, ha="center", va="center")
        ax.set_xscale("log")
        ax.set_xlim(1 / 60 / 1.3, max(longest * 1.5, 1.0))
        ax.xaxis.set_major_locator(FixedLocator([t for t, _ in ticks]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([label for _, label in ticks], rotation=45, ha="right")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{policy} ({sum(len(v) for v in per.values()):,} jobs)")
        ax.set_xlabel("queue wait (log scale; waits under 1 s drawn at 1 s)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("share of finished jobs")
    fig.suptitle("Queue wait by priority class")
    # One legend for all panels, outside them: the curves fill every corner of a panel.
    handles = [Line2D([], [], color=colour, linewidth=1.6) for colour in colours.values()]
    if handles:
        fig.legend(handles, list(colours), title="class", loc="outside right center", frameon=False)
    _save(fig, path)


def lost_work_bars(reports: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Lost GPU-hours per policy, stacked by cause, labelled with their share of the trace."""
    policies = [r["policy"] for r in reports]
    x = np.arange(len(reports))
    fig, ax = plt.subplots(figsize=(max(5.0, 2.0 * len(reports) + 2.0), 4.5))
    bottom = np.zeros(len(reports))
    for cause, colour in _LOST_COLOURS.items():
        values = np.array([float(r["lost_gpu_hours"][cause]) for r in reports])
        ax.bar(x, values, 0.6, bottom=bottom, color=colour, label=cause)
        bottom += values
    top = float(bottom.max()) if len(reports) else 0.0
    for i, r in enumerate(reports):
        trace = float(r["trace_gpu_hours"])
        share = bottom[i] / trace * 100 if trace else 0.0
        ax.annotate(
            f"{bottom[i]:,.1f} GPU-h\n{share:.2f} % of trace",
            (x[i], bottom[i]),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize="small",
        )
    # Headroom for the labels; a unit scale when nothing was lost, so they still show.
    ax.set_ylim(0, top * 1.25 if top > 0 else 1.0)
    if top == 0:
        ax.text(0.5, 0.5, "no work lost: nothing was preempted", transform=ax.transAxes, ha="center")
    ax.set_xticks(x, policies)
    ax.set_ylabel("lost GPU-hours")
    ax.set_title("Work lost to preemption, by cause")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    _save(fig, path)


SWEPT_MEASURES: tuple[tuple[str, str, Callable[[Mapping[str, Any]], float]], ...] = (
    ("p95 wait (h)", "wait", lambda r: float(r["wait"]["p95"]) / 3600),
    ("lost GPU-hours", "lost", lambda r: float(r["lost_gpu_hours"]["total"])),
    ("goodput", "goodput", lambda r: float(r["goodput"])),
    ("utilization", "utilization", lambda r: float(r["utilization"])),
)


def sweep_plots(
    runs: Sequence[Mapping[str, Any]], axes: Sequence[tuple[str, Sequence[str], Sequence[float]]], directory: Path
) -> list[Path]:
    """Per swept parameter, each measure against its values: one line per policy and per
    combination of the other parameters' values. `axes`: (name, values as given, values)."""
    paths = []
    for name, texts, values in axes:
        position = dict(zip(texts, values, strict=True))
        lines: dict[str, list[tuple[float, Mapping[str, Any]]]] = defaultdict(list)
        for r in runs:
            others = ", ".join(f"{k}={v}" for k, v in r["parameters"].items() if k != name)
            label = r["policy"] + (f" ({others})" if others else "")
            lines[label].append((position[r["parameters"][name]], r))
        fig, grid = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
        for ax, (title, _, measure) in zip(grid.flat, SWEPT_MEASURES, strict=True):
            for label, points in lines.items():
                points.sort(key=lambda point: point[0])
                ax.plot([x for x, _ in points], [measure(r) for _, r in points], marker="o", label=label)
            ax.set_title(title)
            ax.set_xticks(sorted(values), [t for _, t in sorted(zip(values, texts, strict=True))])
        for ax in grid[1]:
            ax.set_xlabel(name)
        grid[0][1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize="small")
        fig.suptitle(f"Sweep of {name}")
        path = directory / f"sweep-{name}.png"
        _save(fig, path)
        paths.append(path)
    return paths


def write_plots(runs: Sequence[Replayed], directory: Path) -> list[Path]:
    """Write every figure of a comparison into `directory` (created); the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for run in runs:
        policy = run.report["policy"]
        path = directory / f"utilization-{policy}.png"
        utilization_over_time(run.outcome, path, title=f"{policy}: allocated GPUs by priority class")
        written.append(path)
    path = directory / "wait-cdf.png"
    wait_cdf({run.report["policy"]: run.outcome for run in runs}, path)
    written.append(path)
    path = directory / "lost-work.png"
    lost_work_bars([run.report for run in runs], path)
    written.append(path)
    return written


def _save(fig: Any, path: Path) -> None:
    try:
        fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
