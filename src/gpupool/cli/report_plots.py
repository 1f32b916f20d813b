"""Figures of the pool's accounting (`gpupool report --plots DIR`): where GPU time went per class,
goodput per team, and what each interruption lost, over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: figures only go to files

import matplotlib.pyplot as plt

BUCKETS = ("productive", "startup", "checkpoint", "drain", "wasted", "unreported")
COLOURS = {
    "unreported": "tab:gray",
    "productive": "tab:green",
    "startup": "tab:purple",
    "checkpoint": "tab:blue",
    "drain": "tab:orange",
    "wasted": "tab:red",
    "preempted": "tab:orange",
    "failed": "tab:red",
    "lost": "black",
    "node_lost": "tab:brown",
}


def plot_report(report: Mapping[str, Any], folder: Path, unit: tuple[str, float]) -> list[Path]:
    """Write the report's figures as PNG files into `folder`, GPU time in the report's `unit`
    (name, seconds); returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        _buckets(report["classes"], folder / "gpu-time-by-class.png", unit),
        _goodput(report["teams"], folder / "goodput-by-team.png"),
        _interruptions(report["interruptions"], folder / "interruptions.png", unit),
    ]


def _buckets(classes: Mapping[str, Mapping[str, float]], path: Path, unit: tuple[str, float]) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4))
    names = list(classes)
    bottom = [0.0] * len(names)
    name, size = unit
    for bucket in BUCKETS:
        amounts = [classes[n][bucket] / size for n in names]
        axes.bar(names, amounts, bottom=bottom, label=bucket, color=COLOURS[bucket])
        bottom = [b + h for b, h in zip(bottom, amounts, strict=True)]
    axes.set_ylim(bottom=0)
    axes.set_ylabel(name)
    axes.set_title("Where the GPU time went, per priority class")
    axes.legend(fontsize="small")
    return _save(figure, path)


def _goodput(teams: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4))
    names = list(teams)
    values = [100 * (teams[n]["goodput"] or 0.0) for n in names]  # unknown (nothing reported): 0
    axes.bar(names, values, color="tab:green")
    for x, value in enumerate(values):
        axes.annotate(f"{value:.1f} %", (x, value), ha="center", va="bottom", fontsize="small")
    axes.set_ylim(0, 105)
    axes.set_ylabel("goodput (productive / reported GPU time), %")
    axes.set_title("Goodput per team")
    return _save(figure, path)


def _interruptions(interruptions: list[Mapping[str, Any]], path: Path, unit: tuple[str, float]) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4))
    name, size = unit
    if interruptions:
        start = min(i["at"] for i in interruptions)
        for cause in sorted({i["cause"] for i in interruptions}):
            chosen = [i for i in interruptions if i["cause"] == cause]
            axes.scatter(
                [(i["at"] - start) / 60 for i in chosen],
                [i["lost"] / size for i in chosen],
                label=cause,
                color=COLOURS.get(cause, "tab:blue"),
                s=18,
            )
        axes.legend(fontsize="small")
        axes.set_xlabel("minutes since the first interruption")
    else:
        axes.text(0.5, 0.5, "no interruptions", ha="center", va="center", transform=axes.transAxes)
    axes.set_ylim(*cost_axis([i["lost"] / size for i in interruptions]))
    axes.set_ylabel(f"{name} lost")
    axes.set_title("What each interruption cost")
    return _save(figure, path)


def cost_axis(costs: Sequence[float]) -> tuple[float, float]:
    """The y axis of costs: from 0 (a cost is never negative), with room above the largest, and
    a height of 1 when every cost is 0 (matplotlib would centre 0 on an axis from -0.06)."""
    return 0.0, max(costs, default=0.0) * 1.1 or 1.0


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
