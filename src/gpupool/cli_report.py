"""`gpupool report`: the pool's GPU time, goodput and interruptions, as tables and plots."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpupool.cli_common import ApiOption, ConfigOption, call, client, console, fail, prepare_output
from gpupool.cli_service import interruptions_table
from gpupool.units import gpu_time, parse_duration

COLUMNS = (
    "jobs",
    "allocated",
    "productive",
    "goodput",
    "startup",
    "checkpoint",
    "drain",
    "wasted",
    "unreported",
    "cuts",
    "lost",
)


def report(
    since: Annotated[str | None, typer.Option(help="Only the last DURATION, e.g. 1h or 7d (default: all).")] = None,
    plots: Annotated[Path | None, typer.Option(help="Also write PNG plots into this folder.")] = None,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """GPU time by what it went to, goodput, and what interruptions cost: pool, teams, classes."""
    try:
        start = time.time() - parse_duration(since) if since is not None else None
    except ValueError as exc:
        raise fail(f"--since: {exc}") from None
    if plots is not None:
        prepare_output(plots, "--plots", folder=True)
    data = call(client(config, api).report, start)
    console.print(totals_table("pool", {"pool": data["pool"]}))
    console.print(totals_table("teams", data["teams"]))
    console.print(totals_table("classes", data["classes"]))
    costly = sorted(data["interruptions"], key=lambda i: i["lost"], reverse=True)[:20]
    if costly:
        table = interruptions_table(costly, jobs=True)
        table.title = f"the {len(costly)} costliest of {len(data['interruptions'])} interruptions"
        console.print(table)
    if plots is not None:
        from gpupool.report_plots import plot_report

        for path in plot_report(data, plots):
            console.print(f"wrote {path}")


def totals_table(title: str, rows: Mapping[str, Mapping[str, Any]]) -> Table:
    table = Table(title=title, box=None, header_style="bold")
    table.add_column("")
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for name, t in rows.items():
        goodput = "" if t["goodput"] is None else f"{t['goodput']:.1%}"
        buckets = [gpu_time(t[b]) for b in ("allocated", "productive")]
        losses = [gpu_time(t[b]) for b in ("startup", "checkpoint", "drain", "wasted", "unreported")]
        table.add_row(name, str(t["jobs"]), *buckets, goodput, *losses, str(t["interruptions"]), gpu_time(t["lost"]))
    return table
