"""`gpupool advise`: checkpoint intervals and priority budgets for a lab's own trace."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpupool.cli.common import console, prepare_output
from gpupool.cli.replay import (
    CheckpointIntervalOption,
    ConfigFileOption,
    FromOption,
    GpusPerNodeOption,
    MachinesOption,
    NodesOption,
    PriorityFromOption,
    PriorityMapOption,
    PriorityMixOption,
    RayOption,
    RestartCostOption,
    SaveCostOption,
    ScaleOption,
    TeamFromOption,
    ToOption,
    TraceOption,
    UsageError,
    VcSizesOption,
    duration_option,
    progress_bar,
    read_trace,
    replay_inputs,
    trace_window,
)
from gpupool.config import ConfigError
from gpupool.sim.advise import Advice, Target, advice_yaml, advise, parse_target
from gpupool.sim.replay import Policy
from gpupool.sim.report import ordered_classes
from gpupool.sim.trace import TraceError
from gpupool.units import NONE, human_seconds


def advise_command(
    trace: TraceOption,
    vc_sizes: VcSizesOption = None,
    nodes: NodesOption = None,
    machines: MachinesOption = None,
    gpus_per_node: GpusPerNodeOption = 8,
    scale: ScaleOption = 1.0,
    start: FromOption = None,
    end: ToOption = None,
    priority_mix: PriorityMixOption = None,
    priority_from: PriorityFromOption = None,
    priority_map: PriorityMapOption = None,
    team_from: TeamFromOption = None,
    checkpoint_interval: CheckpointIntervalOption = "30m",
    save_cost: SaveCostOption = None,
    restart_cost: RestartCostOption = None,
    config_file: ConfigFileOption = None,
    policy: Annotated[str, typer.Option(help="pool-priority or pool-fair.")] = "pool-priority",
    targets: Annotated[
        list[str] | None,
        typer.Option("--target", help="CLASS.MEASURE.STAT<=DURATION, e.g. high.wait.p95<=5m (again for more)."),
    ] = None,
    budget_window: Annotated[str, typer.Option(help="The window of the budgets it advises.")] = "7d",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the YAML snippet here.")] = None,
    workers: Annotated[int | None, typer.Option(help="Replays at once (default: every core).")] = None,
    ray: RayOption = None,
) -> None:
    """Checkpoint intervals and priority budgets for a trace (your own: gpupool export).

    Each class's checkpoint interval (Young/Daly, checked by replays) and, for --target, the
    smallest priority budgets that meet the targets; it prints what each choice changes for
    every class and the YAML to paste."""
    from gpupool.sim.sweep import replay_all

    try:
        config, spec, settings = replay_inputs(
            config_file,
            (vc_sizes, nodes, machines, gpus_per_node, scale),
            (priority_mix, priority_from, priority_map),
            (checkpoint_interval, save_cost, restart_cost),
        )
        if policy not in (Policy.POOL_PRIORITY, Policy.POOL_FAIR):
            raise UsageError(f"--policy {policy!r}: use pool-priority or pool-fair (the baselines have no budgets)")
        classes = [c.name for c in config.classes]
        wanted = [parse_target(text, classes) for text in targets or ()]
        window = duration_option(budget_window, "--budget-window")
        if window <= 0:
            raise UsageError(f"--budget-window {budget_window!r}: must be > 0")
        if workers is not None and workers < 1:
            raise UsageError("--workers N: N ≥ 1")
        if workers is not None and ray is not None:
            raise UsageError("give --workers or --ray, not both")
        if output is not None:
            prepare_output(output, "--output")
        loaded = read_trace(trace, trace_window(start, end), priority_from, team_from)
        with progress_bar() as progress:
            task = progress.add_task("replaying", total=None)

            def run(runs: Any) -> list[dict[str, Any]]:
                progress.update(task, total=len(runs), completed=0)
                done = partial(progress.update, task)
                return replay_all(loaded, runs, workers=workers, on_done=lambda n: done(completed=n), ray_address=ray)

            advice = advise(loaded, spec, Policy(policy), settings, wanted, window, run)
    except (TraceError, ConfigError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    console.print(f"[bold]{trace}[/]: {len(loaded.jobs):,} jobs, {policy} on {advice.before['gpus']:,} GPUs")
    console.print(intervals_table(advice))
    if advice.targets:
        console.print(targets_table(advice))
        console.print(budget_lines(advice), highlight=False)
        if advice.budget is not None and advice.budget.report is not None:
            console.print(changes_table(advice.after, advice.budget.report))
    snippet = advice_yaml(advice, trace.name)
    console.print(snippet, highlight=False, markup=False, soft_wrap=True, end="")
    if output is not None:
        output.write_text(snippet, encoding="utf-8")
        console.print(f"YAML: {output}", highlight=False, markup=False)


def _interval(seconds: float | None) -> str:
    return NONE if seconds is None else human_seconds(seconds)


def intervals_table(advice: Advice) -> Table:
    caption = "overhead: GPU-h allocated beyond the work (lost work, saves) in the replay"
    table = Table(title="Checkpoint interval per class", caption=caption)
    table.add_column("class", no_wrap=True)
    for header in ("now", "Young/Daly", "advised", "overhead now", "advised"):
        table.add_column(header, justify="right", no_wrap=True)
    for i in advice.intervals:
        table.add_row(
            i.cls,
            _interval(i.current),
            _interval(i.young_daly),
            _interval(i.chosen),
            f"{i.overhead_before:,.1f}",
            f"{i.overhead_after:,.1f}",
        )
    return table


def _measure(target: Target, report: Any) -> str:
    value = target.value(report) if report is not None else None
    return NONE if value is None else human_seconds(value)


def targets_table(advice: Advice) -> Table:
    budget = advice.budget
    table = Table(title="Targets", caption="advised: the advised intervals and budgets")
    table.add_column("target", no_wrap=True)
    for header in ("configured", "advised", "met"):
        table.add_column(header, justify="right", no_wrap=True)
    for t in advice.targets:
        report = budget.report if budget is not None and budget.report is not None else advice.after
        table.add_row(t.text, _measure(t, advice.before), _measure(t, report), "yes" if t.met(report) else "no")
    return table


def budget_lines(advice: Advice) -> str:
    budget = advice.budget
    assert budget is not None
    tried = ", ".join(f"{share:.0%} {'met' if met else 'not met'}" for share, met in budget.tried.items())
    if budget.share is None:
        return (
            f"No budget meets every target ({tried}): a budget only demotes its own class's jobs; "
            "meet the targets with more GPUs or a higher class."
        )
    return f"Budgets: {budget.share:.0%} of each team's demand at the targets' classes per window ({tried})."


def changes_table(before: Any, after: Any) -> Table:
    """What the budgets change for every class: p95 wait and lost GPU-hours."""
    table = Table(title="What the budgets change", caption="before: advised intervals, the configured budgets")
    table.add_column("class", no_wrap=True)
    for header in ("p95 wait before", "after", "lost before", "after"):
        table.add_column(header, justify="right", no_wrap=True)
    for cls in ordered_classes([*before["by_priority"], *after["by_priority"]]):
        was, now = before["by_priority"].get(cls), after["by_priority"].get(cls)
        table.add_row(
            cls,
            human_seconds(was["wait"]["p95"]) if was else NONE,
            human_seconds(now["wait"]["p95"]) if now else NONE,
            f"{was['lost_gpu_hours']['total']:,.1f}" if was else NONE,
            f"{now['lost_gpu_hours']['total']:,.1f}" if now else NONE,
        )
    return table
