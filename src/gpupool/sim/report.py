"""Replay reports for people (Rich tables) and for programs (stable JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from gpupool.model import DEFAULT_CLASSES
from gpupool.units import NONE, human_seconds


def ordered_classes(names: Iterable[str]) -> list[str]:
    """Priority class names in the order of `DEFAULT_CLASSES`, unknown ones after, by name."""
    present = set(names)
    known = [c.name for c in DEFAULT_CLASSES if c.name in present]
    return known + sorted(present - set(known))


def _percent(fraction: float) -> str:
    value = fraction * 100
    return f"{value:.2f} %" if 0 < abs(value) < 1 else f"{value:.1f} %"


def _gpu_hours(hours: float) -> str:
    return f"{hours:,.1f}"


def _left_out(report: Mapping[str, Any]) -> str:
    left_out = report.get("left_out")
    if left_out is None:
        return NONE
    return f"{left_out['never_fits'] + left_out['team_not_sized']:,}"


def comparison_table(reports: Sequence[Mapping[str, Any]]) -> Table:
    """One column per policy, one row per measure (size, utilization, completion and wait times,
    lost work, fairness), so that the comparison reads at 80 columns."""
    classes = ordered_classes(name for r in reports for name in r["by_priority"])
    table = Table(
        title="Policies compared",
        caption="lost GPU-h: wasted + drain + restart (share of the trace's GPU-h); "
        "left out: jobs that never fit + jobs of teams without a size",
    )
    table.add_column("measure", no_wrap=True)
    for r in reports:
        table.add_column(r["policy"], justify="right", no_wrap=True)

    def lost(r: Mapping[str, Any]) -> str:
        total, trace = r["lost_gpu_hours"]["total"], r["trace_gpu_hours"]
        return f"{_gpu_hours(total)} ({_percent(total / trace if trace else 0.0)})"

    def class_wait(name: str) -> Any:
        return lambda r: human_seconds(r["by_priority"][name]["wait"]["p95"]) if name in r["by_priority"] else NONE

    rows: list[tuple[str, Any]] = [
        ("jobs", lambda r: f"{r['jobs']:,}"),
        ("GPUs", lambda r: f"{r['gpus']:,}"),
        ("utilization", lambda r: _percent(r["utilization"])),
        ("mean JCT", lambda r: human_seconds(r["jct"]["mean"])),
        ("p95 wait", lambda r: human_seconds(r["wait"]["p95"])),
        *((f"p95 wait {name}", class_wait(name)) for name in classes),
        ("preemptions", lambda r: f"{r['preemptions']:,}"),
        # Elastic jobs' (`--elastic-share`): shrinks and growths, and what they lost.
        *([("resizes", lambda r: f"{r.get('resizes', 0):,}")] if any("resizes" in r for r in reports) else []),
        ("lost GPU-h", lost),
        ("goodput", lambda r: _percent(r["goodput"])),
        ("fairness (Jain)", lambda r: f"{r['fairness']:.3f}"),
        ("left out", _left_out),
    ]
    for measure, cell in rows:
        table.add_row(measure, *(cell(r) for r in reports))
    return table


def team_table(report: Mapping[str, Any]) -> Table:
    """One row per team of one policy's report, the team with the most GPU-hours first."""
    table = Table(title=f"{report['policy']}: teams")
    table.add_column("team", no_wrap=True)
    for header in ("jobs", "GPU-h", "mean wait", "p95 wait", "mean JCT", "preemptions"):
        table.add_column(header, justify="right")
    teams = sorted(report["by_team"].items(), key=lambda item: (-item[1]["gpu_hours"], item[0]))
    for name, t in teams:
        table.add_row(
            name,
            f"{t['jobs']:,}",
            _gpu_hours(t["gpu_hours"]),
            human_seconds(t["wait"]["mean"]),
            human_seconds(t["wait"]["p95"]),
            human_seconds(t["jct"]["mean"]),
            f"{t['preemptions']:,}",
        )
    return table


def lost_work_table(reports: Sequence[Mapping[str, Any]]) -> Table:
    """Lost GPU-hours by cause per policy, and the checkpoint interval Young/Daly would pick;
    with node failures, the part the lost nodes cost and how many attempts they took; with
    jobs the trace says failed, the part their failures cost."""
    causes = {cause for r in reports for cause in r.get("lost_gpu_hours_by_cause", {})}
    nodes, failed = "node_lost" in causes, "failure" in causes
    split = nodes or failed
    # With both splits the count of node losses is left to the JSON, to keep 80 columns.
    losses = nodes and not failed
    notes = [f"nodes: the part lost nodes cost{' (losses: the attempts they took)' if losses else ''}"] if nodes else []
    notes += ["failed: the work since the last commit of the jobs the trace says failed"] if failed else []
    young_daly = (
        f"{'Y/D' if split else 'Young/Daly'}: checkpoint interval √(2 · save cost · mean time between interruptions)"
    )
    table = Table(title="Lost work, GPU-h" if split else "Lost work", caption="; ".join([young_daly, *notes]))
    table.add_column("policy", no_wrap=True)
    # More columns with a split by cause: the unit goes to the title, to keep 80 columns.
    unit = "" if split else " GPU-h"
    headers = [f"{name}{unit}" for name in ("wasted", "drain", "restart", "total")]
    headers += ["nodes"] if nodes else []
    headers += ["losses"] if losses else []
    headers += ["failed"] if failed else []
    for header in (*headers, "Y/D" if split else "Young/Daly interval"):
        table.add_column(header, justify="right")
    for r in reports:
        lost = r["lost_gpu_hours"]
        interval = r["young_daly_interval"]
        cells = [_gpu_hours(lost[key]) for key in ("wasted", "drain", "restart", "total")]
        if nodes:
            cells += [_gpu_hours(r["lost_gpu_hours_by_cause"]["node_lost"])]
        if losses:
            cells += [f"{r['node_losses']:,}"]
        if failed:
            cells += [_gpu_hours(r["lost_gpu_hours_by_cause"]["failure"])]
        table.add_row(r["policy"], *cells, NONE if interval is None else human_seconds(interval))
    return table


def write_json(reports: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Write the reports as one JSON list, keys sorted, so equal reports give equal bytes."""
    path.write_text(json.dumps(list(reports), indent=2, sort_keys=True) + "\n", encoding="utf-8")


def sweep_table(runs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Table:
    """One row per cell and policy of a sweep (`sweep.as_json`): the cell's values, then the
    measures people compare cells by (the parameters named in the caption, to keep 80 columns)."""
    caption = f"cell: {', '.join(names)}; JCT: mean; lost: wasted + drain + restart GPU-h"
    table = Table(title="Sweep", caption=caption)
    table.add_column("cell", no_wrap=True)
    table.add_column("policy", no_wrap=True)
    for header in ("util.", "p95 wait", "JCT", "lost", "goodput"):
        table.add_column(header, justify="right", no_wrap=True)
    for r in runs:
        table.add_row(
            ", ".join(r["parameters"][name] for name in names),
            r["policy"],
            _percent(r["utilization"]),
            human_seconds(r["wait"]["p95"]),
            human_seconds(r["jct"]["mean"]),
            _gpu_hours(r["lost_gpu_hours"]["total"]),
            _percent(r["goodput"]),
        )
    return table
