"""`gpupool report`: the pool's GPU time, goodput and interruptions, as tables and plots."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from gpupool.cli.common import (
    ApiOption,
    ConfigOption,
    JsonOption,
    call,
    client,
    console,
    errors,
    fail,
    prepare_output,
    print_json,
)
from gpupool.cli.show import interruptions_table
from gpupool.cli.table import Column, table
from gpupool.units import gpu_time, gpu_unit, human_bytes, parse_duration

BUCKETS = ("startup", "checkpoint", "drain", "wasted", "unreported")


def totals_columns(title: str) -> tuple[Column, ...]:
    return (
        Column(title.upper(), shrink=7, minimum=8),
        Column("JOBS", justify="right"),
        Column("ALLOC", justify="right"),
        Column("PROD", justify="right", drop=8),
        Column("GOODPUT", justify="right"),
        Column("STARTUP", justify="right", drop=4),
        Column("CKPT", justify="right", drop=3),
        Column("DRAIN", justify="right", drop=5),
        Column("WASTED", justify="right", drop=7),
        Column("UNREP", justify="right", drop=6),
        Column("CUTS", justify="right"),
        Column("LOST", justify="right"),
        Column("IDLE", justify="right", drop=2),
        Column("CPU·H", justify="right", drop=1),
        Column("MAXRSS", justify="right", drop=2),
        Column("GPUMEM", justify="right", drop=1),
    )


def report(
    since: Annotated[str | None, typer.Option(help="Only the last DURATION, e.g. 1h or 7d (default: all).")] = None,
    plots: Annotated[Path | None, typer.Option(help="Also write PNG plots into this folder.")] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """GPU time, goodput and what interruptions cost: pool, teams, users, classes.

    Goodput is productive over reported GPU time (jobs that report nothing are apart)."""
    try:
        start = time.time() - parse_duration(since) if since is not None else None
    except ValueError as exc:
        raise fail(f"--since: {exc}") from None
    if plots is not None:
        prepare_output(plots, "--plots", folder=True)
    data = call(client(config, api).report, start)
    if as_json:
        print_json(data)
    else:
        unit = report_unit(data)
        groups = (("pool", {"pool": data["pool"]}), ("team", data["teams"]), ("user", data["users"]))
        for title, rows in (*groups, ("class", data["classes"])):
            console.print(totals_table(title, rows, unit))
            if title == "pool":
                pool_notes(data["pool"])
        costly = sorted(data["interruptions"], key=lambda i: i["lost"], reverse=True)[:20]
        if costly:
            cuts = interruptions_table(costly, width=console.width, jobs=True, unit=unit, whole_reasons=False)
            cuts.title = (
                f"the {len(costly)} costliest of {len(data['interruptions'])} interruptions, GPU time in "
                f"{unit[0]} (show JOB gives each reason in full)"
            )
            console.print(cuts)
    if plots is not None:
        from gpupool.cli.report_plots import plot_report

        for path in plot_report(data, plots, report_unit(data)):
            errors.print(f"wrote {path}", highlight=False, markup=False)


def pool_notes(pool: Mapping[str, Any]) -> None:
    """What the pool's table leaves out: the restarts' phases, the background writes, the GPU
    time idle sessions held."""
    if pool.get("idle", 0.0) > 0:
        held = gpu_time(pool["idle"])
        console.print(
            f"idle sessions held {held} (shells and notebooks with no activity: the IDLE column)",
            highlight=False,
            markup=False,
        )
    if pool["restart_phases"]:
        parts = ", ".join(f"{name} {gpu_time(seconds)}" for name, seconds in pool["restart_phases"].items())
        console.print(f"restarts after interruptions, by phase: {parts}", highlight=False, markup=False)
    if pool["background"] > 0:
        overlap = gpu_time(pool["background"])
        console.print(
            f"checkpoints written in the background overlapped {overlap} of training (not lost)",
            highlight=False,
            markup=False,
        )


def report_unit(data: Mapping[str, Any]) -> tuple[str, float]:
    """The one unit of GPU time of a whole report, its tables and plots: the pool's allocated
    GPU time scaled for people (`units.gpu_unit`)."""
    return gpu_unit(data["pool"]["allocated"])


def totals_table(title: str, rows: Mapping[str, Mapping[str, Any]], unit: tuple[str, float]) -> Any:
    """GPU time in the report's unit (said in its title); goodput blank when unknown."""
    unit_name, size = unit
    cells = []
    for name, t in rows.items():
        goodput = "" if t["goodput"] is None else f"{t['goodput']:.1%}"
        cells.append(
            [
                name,
                str(t["jobs"]),
                f"{t['allocated'] / size:.1f}",
                f"{t['productive'] / size:.1f}",
                goodput,
                *(f"{t[b] / size:.1f}" for b in BUCKETS),
                str(t["interruptions"]),
                f"{t['lost'] / size:.1f}",
                f"{t.get('idle', 0.0) / size:.1f}",
                f"{t.get('cpu_seconds', 0.0) / 3600:.1f}",
                "" if t.get("peak_memory") is None else human_bytes(t["peak_memory"]),
                "" if t.get("peak_gpu_memory") is None else human_bytes(t["peak_gpu_memory"]),
            ]
        )
    return table(totals_columns(title), cells, console.width, title=f"per {title}, GPU time in {unit_name}")
