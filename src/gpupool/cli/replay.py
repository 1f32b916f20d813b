"""The options `gpupool simulate` and `gpupool advise` share, and how they become a cluster and
the replay's settings: one place, so that both read a trace, a pool and the classes alike, and
show the same progress bar while they replay."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpupool import config as configuration
from gpupool.cli.common import EXIT_USAGE, errors, fail
from gpupool.model import Config, PlacementRule
from gpupool.sim.cluster import MAX_POOL_GPUS, load_machines, load_vc_sizes, scale_sizes
from gpupool.sim.elastic import DEFAULT_PARALLEL
from gpupool.sim.failures import Distribution, NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import DEFAULT_MIX, ClusterSpec, Policy, Settings
from gpupool.sim.trace import Trace, load_trace
from gpupool.sim.workload import parse_priority_map, parse_priority_mix
from gpupool.units import parse_duration

E = TypeVar("E", bound=StrEnum)

TraceOption = Annotated[Path, typer.Option(help="Trace in the normalised jobs.csv format (.gz too).")]
VcSizesOption = Annotated[Path | None, typer.Option(help="Per-team node counts (vc,node num).")]
NodesOption = Annotated[int | None, typer.Option(help="Nodes, shared among teams by GPU-hours.")]
MachinesOption = Annotated[
    Path | None, typer.Option(help="Machine list with GPU types (gpu_type/model, cap_gpu/gpu[, nodes]).")
]
GpusPerNodeOption = Annotated[int, typer.Option(help="GPUs per node.")]
ScaleOption = Annotated[
    float, typer.Option(help="Multiply every team's node count (--vc-sizes) or each GPU type's (--machines).")
]
PriorityMixOption = Annotated[str | None, typer.Option(help="e.g. urgent=0.02,high=0.08,normal=0.5,low=0.4")]
PriorityFromOption = Annotated[
    str | None,
    typer.Option(help="Trace column of each job's class: qos with --priority-map, or class as export writes it."),
]
TeamFromOption = Annotated[
    str | None, typer.Option(help="Trace column of each job's team instead of vc, e.g. qos (to partition by it).")
]
PriorityMapOption = Annotated[
    str | None, typer.Option(help="With --priority-from: e.g. LS=high,Burstable=normal,BE=low")
]
CheckpointIntervalOption = Annotated[str, typer.Option(help="30m, or per class: low=10m,high=1h,30m")]
SaveCostOption = Annotated[
    str | None, typer.Option(help="Blocking time of one checkpoint save (default: the trace's per job, else 30s).")
]
RestartCostOption = Annotated[
    str | None, typer.Option(help="Resumed attempt's time to its first step (default: the trace's, else 60s).")
]
FromOption = Annotated[str | None, typer.Option("--from", help="Keep jobs submitted from this date.")]
ToOption = Annotated[str | None, typer.Option("--to", help="Keep jobs submitted before this date.")]
RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray", help="Run the replays as tasks of this Ray cluster (host:port, or auto).", show_default=False
    ),
]
ConfigFileOption = Annotated[
    Path | None, typer.Option("--config", help="YAML with priority classes and policy options.")
]


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


def trace_window(start: str | None, end: str | None) -> tuple[datetime | None, datetime | None]:
    """`--from` and `--to`: the bounds of the jobs' submit times (None: no bound)."""
    return (parse_when(start, "--from") if start else None, parse_when(end, "--to") if end else None)


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


def elastic_options(share: float | None, parallel: float | None) -> tuple[float, float]:
    """`--elastic-share F` (a share of the trace's multi-GPU jobs, 0 to 1) and `--parallel-fraction
    P` (of their work, above 0 and at most 1; only with a share)."""
    if share is not None and not 0.0 <= share <= 1.0:
        raise UsageError(f"--elastic-share {share:g}: a share of the jobs, from 0 to 1")
    if parallel is not None and not 0.0 < parallel <= 1.0:
        raise UsageError(f"--parallel-fraction {parallel:g}: a fraction above 0 and at most 1")
    if parallel is not None and not share:
        raise UsageError("--parallel-fraction shapes elastic jobs: give --elastic-share too")
    return share or 0.0, DEFAULT_PARALLEL if parallel is None else parallel


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


def read_trace(
    path: Path, window: tuple[datetime | None, datetime | None], priority_from: str | None, team_from: str | None
) -> Trace:
    """The trace's jobs submitted within `window`, refused when none is left to replay. Raises
    TraceError for the file."""
    loaded = load_trace(path, start=window[0], end=window[1], priority_from=priority_from, team_from=team_from)
    require_jobs(path, loaded)
    return loaded


def progress_bar() -> Progress:
    """The bars a replay shows on standard error while it runs, gone once it ends."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=errors, transient=True)


def require_jobs(path: Path, trace: Trace) -> None:
    """Refuse a trace with no job to replay, saying what was skipped."""
    if trace.jobs:
        return
    skipped = [
        f"{count:,} {why}"
        for count, why in (
            (trace.zero_gpu_jobs, "without GPUs"),
            (trace.no_duration, "without a run time"),
            (trace.outside_window, "outside the window"),
        )
        if count
    ]
    raise UsageError(f"{path}: no job to replay" + (f" ({', '.join(skipped)})" if skipped else ""))


def replay_inputs(
    config_file: Path | None,
    cluster: tuple[Path | None, int | None, Path | None, int, float],
    priorities: tuple[str | None, str | None, str | None],
    costs: tuple[str, str | None, str | None],
) -> tuple[Config, ClusterSpec, Settings]:
    """The configuration, the cluster (`--vc-sizes`, `--nodes` or `--machines`, with
    `--gpus-per-node` and `--scale`), and the settings with the configuration's policy options,
    the classes (`--priority-mix`, or `--priority-from` and `--priority-map`) and the job model
    (`--checkpoint-interval`, `--save-cost`, `--restart-cost`). Raises UsageError, or
    ConfigError and TraceError for the files."""
    vc_sizes, nodes, machines, gpus_per_node, scale = cluster
    priority_mix, priority_from, priority_map = priorities
    checkpoint_interval, save_cost, restart_cost = costs
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
    settings = Settings(
        model,
        mix,
        config.classes,
        reclaim=config.reclaim,
        preemption=config.preemption,
        max_preemptions=config.max_preemptions,
        priority_preemption=config.priority_preemption,
        fair_share=config.fair_share,
        seniority_after=config.seniority_after,
        budgets={name: team.budgets for name, team in config.teams.items() if team.budgets},
        priority_map=mapped,
        max_node_losses=config.max_node_losses,
        placement=config.placement,
        trace_costs=save_cost is None and restart_cost is None,
    )
    return config, spec, settings
