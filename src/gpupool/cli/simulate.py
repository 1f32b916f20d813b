"""`gpupool simulate`: replay a trace through the scheduling core, under one policy or several,
or over a grid of settings (`--sweep`), with progress bars while it runs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

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
    choice,
    elastic_options,
    failures_option,
    parse_policies,
    placement_option,
    progress_bar,
    read_trace,
    replay_inputs,
    seniority_option,
    trace_window,
)
from gpupool.config import ConfigError
from gpupool.sim.replay import ClusterSpec, Policy, Replayed, Settings, compare
from gpupool.sim.sweep import Axis
from gpupool.sim.trace import Trace, TraceError


def simulate(
    trace: TraceOption,
    vc_sizes: VcSizesOption = None,
    nodes: NodesOption = None,
    machines: MachinesOption = None,
    gpus_per_node: GpusPerNodeOption = 8,
    scale: ScaleOption = 1.0,
    start: FromOption = None,
    end: ToOption = None,
    policy: Annotated[
        str | None, typer.Option(help="One policy: partitioned, pool-fifo, pool-priority, pool-fair.")
    ] = None,
    compared: Annotated[str | None, typer.Option("--compare", help="Policies to compare, comma-separated.")] = None,
    queue: Annotated[str, typer.Option(help="Queue of the baselines: backfill or strict.")] = "backfill",
    priority_mix: PriorityMixOption = None,
    priority_from: PriorityFromOption = None,
    priority_map: PriorityMapOption = None,
    team_from: TeamFromOption = None,
    checkpoint_interval: CheckpointIntervalOption = "30m",
    save_cost: SaveCostOption = None,
    restart_cost: RestartCostOption = None,
    config_file: ConfigFileOption = None,
    fair_share: Annotated[
        str | None, typer.Option(help="pool-priority: off or preempt (default: the config's policy).")
    ] = None,
    priority_preemption: Annotated[
        str | None, typer.Option(help="pool-priority: pool, team or above_guarantee (default: the config's).")
    ] = None,
    seniority_after: Annotated[
        str | None, typer.Option(help="pool-priority: e.g. 2h, or off (default: the config's policy).")
    ] = None,
    node_mtbf: Annotated[
        str | None, typer.Option(help="Node failures: each node's mean time between them, e.g. 30d.")
    ] = None,
    node_repair: Annotated[
        str | None, typer.Option(help="With --node-mtbf: a failed node's time out (default: 4h).")
    ] = None,
    failure_times: Annotated[
        str | None, typer.Option(help="With --node-mtbf: exponential (default) or constant.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="With --node-mtbf: the seed of the failures (default: 0).")] = None,
    placement: Annotated[
        str | None, typer.Option(help="best-fit, first-fit or count (no nodes); default: the config's, best-fit.")
    ] = None,
    elastic_share: Annotated[
        float | None,
        typer.Option(help="Make this share (0 to 1) of the multi-GPU jobs elastic, down to a quarter of their GPUs."),
    ] = None,
    parallel_fraction: Annotated[
        float | None,
        typer.Option(help="With --elastic-share: the parallel fraction of their work (Amdahl; default 0.95)."),
    ] = None,
    trace_failures: Annotated[
        bool,
        typer.Option(
            "--trace-failures/--no-trace-failures", help="Jobs whose status is Failed fail after their run time."
        ),
    ] = True,
    sweeps: Annotated[
        list[str] | None,
        typer.Option(
            "--sweep",
            help="Replay a grid: NAME=V1,V2,… (again for more names): checkpoint-interval, save-cost, "
            "restart-cost, scale, node-mtbf.",
        ),
    ] = None,
    workers: Annotated[int | None, typer.Option(help="With --sweep: processes at once (default: every core).")] = None,
    ray: RayOption = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the reports as JSON.")] = None,
    plots: Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")] = None,
) -> None:
    """Replay a GPU-cluster trace through the scheduling core under one or more policies."""
    from gpupool.model import FairShare, PriorityScope, QueueMode
    from gpupool.sim.report import comparison_table, lost_work_table, sweep_table, write_json
    from gpupool.sim.sweep import parse_axes

    try:
        config, spec, settings = replay_inputs(
            config_file,
            (vc_sizes, nodes, machines, gpus_per_node, scale),
            (priority_mix, priority_from, priority_map),
            (checkpoint_interval, save_cost, restart_cost),
        )
        axes = parse_axes(sweeps or ())
        if workers is not None and (workers < 1 or not axes):
            raise UsageError("--workers N (N ≥ 1) goes with --sweep")
        if ray is not None and (not axes or workers is not None):
            raise UsageError("--ray ADDRESS goes with --sweep, instead of --workers")
        try:
            mode = QueueMode(queue)
        except ValueError:
            raise UsageError(f"--queue {queue!r}: use backfill or strict") from None
        rule, topology = placement_option(placement, config.placement)
        share, parallel = elastic_options(elastic_share, parallel_fraction)
        settings = replace(
            settings,
            queue=mode,
            priority_preemption=choice(
                PriorityScope, priority_preemption, "--priority-preemption", config.priority_preemption
            ),
            fair_share=choice(FairShare, fair_share, "--fair-share", config.fair_share),
            seniority_after=seniority_option(seniority_after, config.seniority_after),
            failures=failures_option(node_mtbf or swept_mtbf(sweeps), node_repair, failure_times, seed),
            trace_failures=trace_failures,
            placement=rule,
            topology=topology,
            elastic_share=share,
            parallel=parallel,
            elastic=config.elastic,
        )
        chosen = parse_policies(policy, compared)
        options = (
            ("--fair-share", fair_share),
            ("--priority-preemption", priority_preemption),
            ("--seniority-after", seniority_after),
        )
        for flag, given in options:
            if given is not None and Policy.POOL_PRIORITY not in chosen:
                raise UsageError(f"{flag} sets an option of pool-priority, which is not among the policies replayed")
        window = trace_window(start, end)
        if json_file is not None:
            prepare_output(json_file, "--json")
        if plots is not None:
            prepare_output(plots, "--plots", folder=True)
        loaded = read_trace(trace, window, priority_from, team_from)
        if axes:
            swept = sweep_with_progress(loaded, spec, chosen, settings, axes, workers, ray)
        else:
            runs = replay_with_progress(loaded, spec, chosen, settings)
    except (TraceError, ConfigError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if axes:
        console.print(trace_line(trace, loaded, spec, trace_failures) + f"; {len(swept):,} runs")
        console.print(sweep_table(swept, [a.name for a in axes]))
        if json_file is not None:
            write_json(swept, json_file)
            console.print(f"JSON report: {json_file}")
        if plots is not None:
            from gpupool.sim.plots import sweep_plots

            written = sweep_plots(swept, [(a.name, a.texts, a.values) for a in axes], plots)
            console.print(f"Plots: {', '.join(str(p) for p in written)}")
        return

    pool_gpus = runs[0].report["gpus"] if runs else 0
    larger = sum(job.gpus > pool_gpus for job in loaded.jobs)
    console.print(
        trace_line(trace, loaded, spec, trace_failures)
        + (
            f", {larger:,} larger than the pool ({pool_gpus:,} GPUs) never {'fits' if larger == 1 else 'fit'}"
            if larger
            else ""
        )
    )
    console.print(comparison_table([run.report for run in runs]))
    console.print(lost_work_table([run.report for run in runs]))
    if json_file is not None:
        write_json([run.report for run in runs], json_file)
        console.print(f"JSON report: {json_file}")
    if plots is not None:
        from gpupool.sim.plots import write_plots

        for path in write_plots(runs, plots):
            console.print(f"plot: {path}")


def replay_with_progress(trace: Trace, spec: ClusterSpec, policies: list[Policy], settings: Settings) -> list[Replayed]:
    with progress_bar() as progress:
        tasks = {p: progress.add_task(f"replaying {p.value}", total=len(trace.jobs)) for p in policies}
        return compare(trace, spec, policies, settings, lambda p, done: progress.update(tasks[p], completed=done))


def swept_mtbf(sweeps: list[str] | None) -> str | None:
    """The first value of `--sweep node-mtbf=…`, which stands for --node-mtbf: its cells set
    the time between failures, --node-repair and the rest shape them."""
    for text in sweeps or ():
        name, _, values = text.partition("=")
        if name.strip() == "node-mtbf" and values.strip():
            return values.split(",")[0].strip()
    return None


def trace_line(path: Path, loaded: Trace, spec: ClusterSpec, trace_failures: bool) -> str:
    """The first line of the output: the jobs read, and those skipped or changed, and why."""
    skipped = loaded.zero_gpu_jobs + loaded.no_duration
    return (
        f"[bold]{path}[/]: {len(loaded.jobs):,} jobs"
        + (f" ({loaded.outside_window:,} outside the window)" if loaded.outside_window else "")
        + (f", {skipped:,} without GPUs or run time skipped" if skipped else "")
        + (f", {loaded.fractional:,} fractional GPU requests take whole GPUs" if loaded.fractional else "")
        + (f", {loaded.failed:,} failed in the trace" if loaded.failed and trace_failures else "")
        + missing_types(loaded, spec)
    )


def missing_types(trace: Trace, spec: ClusterSpec) -> str:
    """The words for jobs that ask for a GPU type no node of the pool has (they never fit)."""
    have = {gpu_type for gpu_type, _ in spec.machines} if spec.machines is not None else {"gpu"}
    wanted = Counter(job.gpu_type for job in trace.jobs if job.gpu_type is not None and job.gpu_type not in have)
    if not wanted:
        return ""
    listed = ", ".join(f"{gpu_type}: {count:,}" for gpu_type, count in sorted(wanted.items()))
    return f", {sum(wanted.values()):,} need a GPU type no node has ({listed}; give --machines with it)"


def sweep_with_progress(
    trace: Trace,
    spec: ClusterSpec,
    policies: list[Policy],
    settings: Settings,
    axes: Sequence[Axis],
    workers: int | None,
    ray_address: str | None,
) -> list[Mapping[str, Any]]:
    from gpupool.sim.sweep import as_json, grid, sweep

    total = len(grid(axes)) * len(policies)
    with progress_bar() as progress:
        task = progress.add_task("replaying the grid", total=total)
        done = sweep(
            trace,
            spec,
            policies,
            settings,
            axes,
            workers=workers,
            on_done=lambda n: progress.update(task, completed=n),
            ray_address=ray_address,
        )
    return as_json(done)
