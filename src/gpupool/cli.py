"""The `gpupool` command line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpupool import config as configuration
from gpupool.cli_common import EXIT_USAGE, HELP, console, errors, fail, prepare_output
from gpupool.cli_service import register
from gpupool.config import ConfigError
from gpupool.model import PlacementRule
from gpupool.sim.cluster import MAX_POOL_GPUS, load_machines, load_vc_sizes, scale_sizes
from gpupool.sim.failures import Distribution, NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import DEFAULT_MIX, ClusterSpec, Policy, Replayed, Settings, compare
from gpupool.sim.sweep import Axis
from gpupool.sim.trace import Trace, TraceError, load_trace
from gpupool.sim.workload import parse_priority_map, parse_priority_mix
from gpupool.units import parse_duration

E = TypeVar("E", bound=StrEnum)

app = typer.Typer(
    help="gpupool: one shared GPU pool, priority as a job attribute.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=HELP,
)


def show_version(value: bool) -> None:
    if value:
        console.print(f"gpupool {version('gpupool')}", highlight=False)
        raise typer.Exit()


@app.callback()
def main_options(
    _version: Annotated[
        bool | None, typer.Option("--version", "-V", callback=show_version, is_eager=True, help="Print the version.")
    ] = None,
) -> None:
    """gpupool: one shared GPU pool, priority as a job attribute."""


class UsageError(typer.Exit):
    """Bad input: print what is wrong and exit with status 2."""

    def __init__(self, message: str) -> None:
        fail(message)  # prints it, as every command does
        super().__init__(code=EXIT_USAGE)


def parse_when(text: str, option: str) -> datetime:
    for layout in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d"):
        try:
            return datetime.strptime(text, layout)
        except ValueError:
            continue
    raise UsageError(f"{option} {text!r}: use YYYY-MM-DD or 'YYYY-MM-DD HH:MM:SS'")


def parse_policies(policy: str | None, compared: str | None) -> list[Policy]:
    if policy and compared:
        raise UsageError("give --policy or --compare, not both")
    names = [p.strip() for p in (compared or policy or Policy.POOL_PRIORITY.value).split(",") if p.strip()]
    known = ", ".join(p.value for p in Policy)
    chosen = []
    for name in names:
        try:
            chosen.append(Policy(name))
        except ValueError:
            raise UsageError(f"unknown policy {name!r} (known: {known})") from None
    return chosen


def choice(kind: type[E], text: str | None, flag: str, default: E) -> E:
    """The option's value as `kind`, or `default` when it was not given."""
    if text is None:
        return default
    try:
        return kind(text)
    except ValueError:
        raise UsageError(f"{flag} {text!r}: use {' or '.join(k.value for k in kind)}") from None


def placement_option(text: str | None, default: PlacementRule) -> tuple[PlacementRule, bool]:
    """`--placement`: the core's rule, and whether nodes are kept (`count` counts GPUs only)."""
    if text == "count":
        return PlacementRule.BEST_FIT, False
    if text is not None and text not in {rule.value for rule in PlacementRule}:
        raise UsageError(f"--placement {text!r}: use best-fit, first-fit or count")
    return choice(PlacementRule, text, "--placement", default), True


def parse_intervals(text: str, classes: list[str]) -> tuple[dict[str, float], float]:
    """`30m`, or per class with an optional default: `low=10m,high=1h,30m`."""
    per_class: dict[str, float] = {}
    default = 1800.0
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, _, value = item.rpartition("=")
        try:
            seconds = parse_duration(value) if value.strip().lower() not in ("inf", "never") else float("inf")
        except ValueError as exc:
            raise UsageError(f"--checkpoint-interval {item!r}: {exc}") from None
        if seconds <= 0:
            raise UsageError(f"--checkpoint-interval {item!r}: the interval must be > 0")
        if not name:
            default = seconds
        elif name not in classes:
            raise UsageError(f"--checkpoint-interval {item!r}: unknown priority class {name!r}")
        else:
            per_class[name] = seconds
    return per_class, default


def pool_spec(vc_sizes: Path | None, nodes: int | None, gpus_per_node: int, scale: float) -> ClusterSpec:
    """The simulated pool of the options, refused when it is over MAX_POOL_GPUS GPUs."""
    most = f"the simulated pool holds at most {MAX_POOL_GPUS:,} GPUs"
    if gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node {gpus_per_node}: at least 1")
    if gpus_per_node > MAX_POOL_GPUS:
        raise UsageError(f"--gpus-per-node {gpus_per_node:,}: at most {MAX_POOL_GPUS:,} ({most})")
    if vc_sizes is not None:
        sizes = load_vc_sizes(vc_sizes)
        count = sum(scale_sizes(sizes, scale).values())
        if count * gpus_per_node > MAX_POOL_GPUS:
            scaled = f" (× --scale {scale:g})" if scale != 1 else ""
            raise UsageError(
                f"--vc-sizes {vc_sizes}: {count:,} nodes{scaled} × --gpus-per-node {gpus_per_node} = "
                f"{count * gpus_per_node:,} GPUs: {most}"
            )
        return ClusterSpec(sizes, scale, None, gpus_per_node)
    if nodes is not None and nodes * gpus_per_node > MAX_POOL_GPUS:
        raise UsageError(
            f"--nodes {nodes:,} × --gpus-per-node {gpus_per_node} = {nodes * gpus_per_node:,} GPUs: {most}"
        )
    return ClusterSpec(None, scale, nodes, gpus_per_node)


def duration_option(text: str, option: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def failures_option(mtbf: str | None, repair: str | None, times: str | None, seed: int | None) -> NodeFailures | None:
    """`--node-mtbf` and the options that shape it; None without it."""
    if mtbf is None:
        given = [
            flag
            for flag, value in (("--node-repair", repair), ("--failure-times", times), ("--seed", seed))
            if value is not None
        ]
        if given:
            raise UsageError(f"{', '.join(given)} shape(s) node failures: give --node-mtbf too")
        return None
    try:
        distribution = Distribution(times or Distribution.EXPONENTIAL)
    except ValueError:
        raise UsageError(f"--failure-times {times!r}: use exponential or constant") from None
    between = duration_option(mtbf, "--node-mtbf")
    if between <= 0:
        raise UsageError(f"--node-mtbf {mtbf!r}: a node's mean time between failures must be > 0")
    return NodeFailures(between, duration_option(repair or "4h", "--node-repair"), distribution, seed or 0)


def seniority_option(text: str | None, default: float | None) -> float | None:
    """`--seniority-after`: a duration, or `off`; the config's when not given."""
    if text is None:
        return default
    return None if text == "off" else duration_option(text, "--seniority-after")


@app.command(context_settings=HELP)
def simulate(
    trace: Annotated[Path, typer.Option(help="Trace in the normalised jobs.csv format (.gz too).")],
    vc_sizes: Annotated[Path | None, typer.Option(help="Per-team node counts (vc,node num).")] = None,
    nodes: Annotated[int | None, typer.Option(help="Nodes, shared among teams by GPU-hours.")] = None,
    machines: Annotated[
        Path | None, typer.Option(help="Machine list with GPU types (gpu_type/model, cap_gpu/gpu[, nodes]).")
    ] = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    scale: Annotated[
        float, typer.Option(help="Multiply every team's node count (--vc-sizes) or each GPU type's (--machines).")
    ] = 1.0,
    start: Annotated[str | None, typer.Option("--from", help="Keep jobs submitted from this date.")] = None,
    end: Annotated[str | None, typer.Option("--to", help="Keep jobs submitted before this date.")] = None,
    policy: Annotated[
        str | None, typer.Option(help="One policy: partitioned, pool-fifo, pool-priority, pool-fair.")
    ] = None,
    compared: Annotated[str | None, typer.Option("--compare", help="Policies to compare, comma-separated.")] = None,
    queue: Annotated[str, typer.Option(help="Queue of the baselines: backfill or strict.")] = "backfill",
    priority_mix: Annotated[str | None, typer.Option(help="e.g. urgent=0.02,high=0.08,normal=0.5,low=0.4")] = None,
    priority_from: Annotated[
        str | None,
        typer.Option(help="Trace column of each job's class: qos with --priority-map, or class as export writes it."),
    ] = None,
    priority_map: Annotated[
        str | None, typer.Option(help="With --priority-from: e.g. LS=high,Burstable=normal,BE=low")
    ] = None,
    checkpoint_interval: Annotated[str, typer.Option(help="30m, or per class: low=10m,high=1h,30m")] = "30m",
    save_cost: Annotated[
        str | None, typer.Option(help="Blocking time of one checkpoint save [the trace's per job, else 30s].")
    ] = None,
    restart_cost: Annotated[
        str | None, typer.Option(help="Resumed attempt's time to its first step [the trace's, else 60s].")
    ] = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="YAML with priority classes and policy options.")
    ] = None,
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
    node_repair: Annotated[str | None, typer.Option(help="With --node-mtbf: a failed node's time out [4h].")] = None,
    failure_times: Annotated[
        str | None, typer.Option(help="With --node-mtbf: exponential or constant [exponential].")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="With --node-mtbf: the seed of the failures [0].")] = None,
    placement: Annotated[
        str | None, typer.Option(help="best-fit, first-fit or count (no nodes) [the config's: best-fit].")
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
    workers: Annotated[int | None, typer.Option(help="With --sweep: processes at once [every core].")] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the reports as JSON.")] = None,
    plots: Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")] = None,
) -> None:
    """Replay a GPU-cluster trace through the scheduling core under one or more policies."""
    from gpupool.model import FairShare, PriorityScope, QueueMode
    from gpupool.sim.report import comparison_table, lost_work_table, sweep_table, write_json
    from gpupool.sim.sweep import parse_axes

    try:
        config = configuration.load(config_file)
        classes = [c.name for c in config.classes]
        if priority_map is not None and priority_from is None:
            raise UsageError("--priority-map VALUE=CLASS,… needs --priority-from COLUMN")
        if priority_from is not None and priority_mix is not None:
            raise UsageError("give --priority-mix or --priority-from, not both")
        mix = parse_priority_mix(priority_mix, classes) if priority_mix else DEFAULT_MIX
        mapped = parse_priority_map(priority_map, classes) if priority_map is not None else None
        if priority_from is not None and mapped is None:
            mapped = {name: name for name in classes}  # the column holds gpupool's classes, as export writes
        if mapped is None and not priority_mix and not set(classes) >= {name for name, _ in DEFAULT_MIX}:
            raise UsageError("the configured classes differ from the defaults: give --priority-mix")
        if sum(given is not None for given in (vc_sizes, nodes, machines)) != 1:
            raise UsageError("give the cluster as --vc-sizes FILE, --nodes N or --machines FILE, one of them")
        if machines is not None:
            spec = ClusterSpec(machines=load_machines(machines), scale=scale)
        else:
            spec = pool_spec(vc_sizes, nodes, gpus_per_node, scale)
        intervals, default_interval = parse_intervals(checkpoint_interval, classes)
        model = JobModel(
            intervals,
            default_interval,
            duration_option(save_cost or "30s", "--save-cost"),
            duration_option(restart_cost or "60s", "--restart-cost"),
        )
        try:
            mode = QueueMode(queue)
        except ValueError:
            raise UsageError(f"--queue {queue!r}: use backfill or strict") from None
        settings = Settings(
            model,
            mix,
            config.classes,
            mode,
            config.reclaim,
            config.preemption,
            config.max_preemptions,
            choice(PriorityScope, priority_preemption, "--priority-preemption", config.priority_preemption),
            choice(FairShare, fair_share, "--fair-share", config.fair_share),
            seniority_option(seniority_after, config.seniority_after),
            {name: team.budgets for name, team in config.teams.items() if team.budgets},
            failures_option(node_mtbf, node_repair, failure_times, seed),
            mapped,
            config.max_node_losses,
            trace_failures,
            *placement_option(placement, config.placement),
            trace_costs=save_cost is None and restart_cost is None,
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
        window = (
            parse_when(start, "--from") if start else None,
            parse_when(end, "--to") if end else None,
        )
        if json_file is not None:
            prepare_output(json_file, "--json")
        if plots is not None:
            prepare_output(plots, "--plots", folder=True)
        axes = parse_axes(sweeps or ())
        if workers is not None and (workers < 1 or not axes):
            raise UsageError("--workers N (N ≥ 1) goes with --sweep")
        loaded = load_trace(trace, start=window[0], end=window[1], priority_from=priority_from)
        if axes:
            swept = sweep_with_progress(loaded, spec, chosen, settings, axes, workers)
        else:
            runs = replay_with_progress(loaded, spec, chosen, settings)
    except (TraceError, ConfigError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if axes:
        console.print(f"[bold]{trace}[/]: {len(loaded.jobs):,} jobs, {len(swept):,} runs" + missing_types(loaded, spec))
        console.print(sweep_table(swept, [a.name for a in axes]))
        if json_file is not None:
            write_json(swept, json_file)
            console.print(f"JSON report: {json_file}")
        if plots is not None:
            from gpupool.sim.plots import sweep_plots

            written = sweep_plots(swept, [(a.name, a.texts, a.values) for a in axes], plots)
            console.print(f"Plots: {', '.join(str(p) for p in written)}")
        return

    skipped = loaded.zero_gpu_jobs + loaded.no_duration
    pool_gpus = runs[0].report["gpus"] if runs else 0
    larger = sum(job.gpus > pool_gpus for job in loaded.jobs)
    console.print(
        f"[bold]{trace}[/]: {len(loaded.jobs):,} jobs"
        + (f" ({loaded.outside_window:,} outside the window)" if loaded.outside_window else "")
        + (f", {skipped:,} without GPUs or run time skipped" if skipped else "")
        + (f", {loaded.fractional:,} fractional GPU requests take whole GPUs" if loaded.fractional else "")
        + (f", {loaded.failed:,} failed in the trace" if loaded.failed and trace_failures else "")
        + missing_types(loaded, spec)
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
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=errors, transient=True) as progress:
        tasks = {p: progress.add_task(f"replaying {p.value}", total=len(trace.jobs)) for p in policies}
        return compare(trace, spec, policies, settings, lambda p, done: progress.update(tasks[p], completed=done))


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
) -> list[Mapping[str, Any]]:
    from gpupool.sim.sweep import as_json, grid, sweep

    total = len(grid(axes)) * len(policies)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=errors, transient=True) as progress:
        task = progress.add_task("replaying the grid", total=total)
        done = sweep(
            trace, spec, policies, settings, axes, workers=workers, on_done=lambda n: progress.update(task, completed=n)
        )
    return as_json(done)


@app.command(context_settings=HELP)
def demo(
    simulated: Annotated[bool, typer.Option(help="Replay the demonstration in the simulator instead.")] = False,
    cluster: Annotated[
        bool,
        typer.Option(help="One pool over a 3-node Ray cluster it starts on loopback, a 2-node PyTorch job in it."),
    ] = False,
) -> None:
    """A short demonstration: the live scheduler on virtual GPUs with real jobs (under a minute;
    --cluster: under three minutes, needs gpupool[ray,torch])."""
    if cluster:
        try:
            from gpupool.demo_cluster import run_cluster_demo
        except ImportError as exc:
            raise UsageError(f"--cluster needs gpupool[ray,torch] ({exc})") from None
        raise typer.Exit(run_cluster_demo(console))
    if simulated:
        from gpupool.demo import run_demo

        run_demo(console)
        return
    from gpupool.demo_live import run_live_demo

    run_live_demo(console)


register(app)


def main() -> None:
    app()
