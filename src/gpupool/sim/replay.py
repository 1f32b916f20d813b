"""One replay: a trace, a cluster and a policy in, a report out."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpupool.model import (
    DEFAULT_CLASSES,
    Config,
    ElasticPolicy,
    FairShare,
    Job,
    PlacementRule,
    PriorityBudget,
    PriorityClass,
    PriorityScope,
    QueueMode,
    QueueOrder,
    Team,
)
from gpupool.policy import can_ever_fit
from gpupool.sim.cluster import (
    Cluster,
    cluster_from_machines,
    cluster_from_sizes,
    cluster_uniform,
    scale_machines,
    scale_sizes,
    without_topology,
)
from gpupool.sim.elastic import DEFAULT_PARALLEL, is_drawn, sizes_of
from gpupool.sim.engine import Simulation
from gpupool.sim.failures import NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.metrics import summarize
from gpupool.sim.records import Outcome, SimJob
from gpupool.sim.trace import Trace
from gpupool.sim.workload import assign_priority

DEFAULT_MIX: tuple[tuple[str, float], ...] = (("urgent", 0.02), ("high", 0.08), ("normal", 0.5), ("low", 0.4))


class Policy(StrEnum):
    PARTITIONED = "partitioned"
    """Each team alone on its slice of the pool, first come first served: the reservation."""
    POOL_FIFO = "pool-fifo"
    """One pool, first come first served, no preemption."""
    POOL_PRIORITY = "pool-priority"
    """gpupool: one pool, priority classes, preemption with notice, reclaim of guarantees."""
    POOL_FAIR = "pool-fair"
    """gpupool for a lab that promises guarantees: pool-priority with fair-share preemption,
    priority preemption only of teams above their guarantee, and seniority after
    `FAIR_SENIORITY_AFTER`."""


FAIR_SENIORITY_AFTER = 7200.0
"""pool-fair's `Config.seniority_after`."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Per-team node counts (`vc_sizes`, times `scale`), or `nodes` or `machines` (GPU type, GPUs)
    shared among the teams by GPU-hours."""

    vc_sizes: Mapping[str, int] | None = None
    scale: float = 1.0
    nodes: int | None = None
    gpus_per_node: int = 8
    machines: tuple[tuple[str, int], ...] | None = None

    def build(self, trace: Trace, *, dedicated: bool) -> Cluster:
        if self.vc_sizes is not None:
            return cluster_from_sizes(scale_sizes(self.vc_sizes, self.scale), self.gpus_per_node, dedicated=dedicated)
        if self.nodes is None and self.machines is None:
            raise ValueError("a cluster needs VC sizes, a node count or a machine list")
        hours: dict[str, float] = defaultdict(float)
        for job in trace.jobs:
            hours[job.team] += job.gpus * job.duration
        weights = {team: hours[team] or 1.0 for team in sorted(hours)}
        if self.machines is not None:
            machines = scale_machines(self.machines, self.scale) if self.scale != 1 else self.machines
            return cluster_from_machines(machines, weights or {"default": 1.0}, dedicated=dedicated)
        assert self.nodes is not None
        return cluster_uniform(self.nodes, self.gpus_per_node, weights, dedicated=dedicated)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything but the trace, the cluster and the policy."""

    model: JobModel
    mix: tuple[tuple[str, float], ...] = DEFAULT_MIX
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    queue: QueueMode = QueueMode.BACKFILL
    """Queue discipline of the two baselines; gpupool's policies always backfill."""
    reclaim: bool = True
    preemption: bool = True
    max_preemptions: int | None = 10
    priority_preemption: PriorityScope = PriorityScope.POOL
    fair_share: FairShare = FairShare.OFF
    seniority_after: float | None = None
    """The options of pool-priority (pool-fair sets the last three its own way)."""
    budgets: Mapping[str, tuple[PriorityBudget, ...]] = field(default_factory=dict)
    """Priority budgets per team (gpupool's policies; the baselines have no classes to meter)."""
    failures: NodeFailures | None = None
    """Node failures, under every policy alike (the same seeded draws)."""
    priority_map: Mapping[str, str] | None = None
    """Classes from each job's trace `label` (`load_trace(priority_from=…)`) instead of `mix`."""
    max_node_losses: int = 3
    """Under every policy: a job that loses more nodes fails, as in the service (its default)."""
    trace_failures: bool = True
    """Jobs the trace says failed (`TraceJob.failed`) fail at the end of their run time."""
    placement: PlacementRule = PlacementRule.BEST_FIT
    """Under every policy: the node a job takes among those it fits on."""
    topology: bool = True
    """False: GPUs are counted with no node boundaries (`cluster.without_topology`)."""
    trace_costs: bool = True
    """Jobs' own `save_cost` and `restart_cost` from the trace, where it has them, over `model`'s."""
    elastic_share: float = 0.0
    """The share of the trace's multi-GPU jobs made elastic (`sim.elastic`), under every policy."""
    parallel: float = DEFAULT_PARALLEL
    """The parallel fraction of elastic jobs' work (`sim.elastic.pace`)."""
    elastic: ElasticPolicy = field(default_factory=ElasticPolicy)
    """How often an elastic job may grow, under every policy."""


def policy_config(policy: Policy, cluster: Cluster, settings: Settings) -> Config:
    teams = {name: Team(name, weight=max(gpus, 1), guaranteed_gpus=gpus) for name, gpus in cluster.team_gpus.items()}
    if policy in (Policy.POOL_PRIORITY, Policy.POOL_FAIR):
        teams = {name: replace(team, budgets=settings.budgets.get(name, ())) for name, team in teams.items()}
        fair = policy is Policy.POOL_FAIR
        return Config(
            settings.classes,
            teams,
            QueueOrder.PRIORITY,
            QueueMode.BACKFILL,
            preemption=settings.preemption,
            reclaim=settings.reclaim,
            max_preemptions=settings.max_preemptions,
            priority_preemption=PriorityScope.ABOVE_GUARANTEE if fair else settings.priority_preemption,
            fair_share=FairShare.PREEMPT if fair else settings.fair_share,
            seniority_after=FAIR_SENIORITY_AFTER if fair else settings.seniority_after,
            explain_waits=False,
            max_node_losses=settings.max_node_losses,
            placement=settings.placement,
            elastic=settings.elastic,
        )
    return Config(
        settings.classes,
        teams,
        QueueOrder.FIFO,
        settings.queue,
        preemption=False,
        reclaim=False,
        explain_waits=False,
        max_node_losses=settings.max_node_losses,
        placement=settings.placement,
        elastic=settings.elastic,
    )


@dataclass(frozen=True, slots=True)
class Replayed:
    report: dict[str, Any]
    """What `--json` writes for this policy (see `metrics.summarize`)."""
    outcome: Outcome
    """Every job's record and the allocation series, for plots."""


def replay(
    trace: Trace,
    spec: ClusterSpec,
    policy: Policy,
    settings: Settings,
    on_progress: Callable[[int], None] | None = None,
    cluster: Cluster | None = None,
) -> Replayed:
    """Replay `trace` under `policy`, on `cluster` if the caller built it (`build_cluster`)."""
    began = time.perf_counter()
    cluster = cluster if cluster is not None else build_cluster(trace, spec, policy)
    if not settings.topology:
        if settings.failures is not None:
            raise ValueError("node failures need nodes: they cannot be replayed with GPUs counted (placement count)")
        cluster = without_topology(cluster)
    unknown = sorted(set(settings.budgets) - set(cluster.team_gpus))
    if unknown:
        known = ", ".join(sorted(cluster.team_gpus))
        raise ValueError(f"budgets of team(s) {', '.join(unknown)}, which the cluster does not have (teams: {known})")
    jobs, left_out, never_fit = admissible(trace, cluster, settings)
    config = policy_config(policy, cluster, settings)
    simulation = Simulation(
        jobs, cluster.nodes, config, settings.model, on_progress, failures=settings.failures, parallel=settings.parallel
    )
    outcome = simulation.run()
    # Young/Daly's save cost: the jobs' own where the trace gives them, else the model's.
    own = [job.save_cost for job in jobs if job.save_cost is not None]
    save_cost = sum(own) / len(own) if own else settings.model.save_cost
    report = summarize(policy.value, outcome, save_cost, failures=settings.failures is not None)
    report["left_out"] = {"team_not_sized": left_out, "never_fits": never_fit}
    report["wall_seconds"] = round(time.perf_counter() - began, 3)
    return Replayed(report, outcome)


def build_cluster(trace: Trace, spec: ClusterSpec, policy: Policy) -> Cluster:
    """The cluster of `spec` for `policy`: partitions for `partitioned`, one shared pool else;
    a ValueError says which policy cannot have it."""
    if policy is not Policy.PARTITIONED:
        return spec.build(trace, dedicated=False)
    try:
        return spec.build(trace, dedicated=True)
    except ValueError as exc:
        raise ValueError(f"partitioned needs whole nodes for each team: {exc} (or leave partitioned out)") from None


def admissible(trace: Trace, cluster: Cluster, settings: Settings) -> tuple[list[SimJob], int, int]:
    """The trace's jobs this cluster can run, with priorities from the mix; and how many
    were left out because their team has no size, or because they can never fit
    (`can_ever_fit`)."""
    sized = set(cluster.team_gpus)
    fits: dict[tuple[str, int, str | None, int | None], bool] = {}
    jobs: list[SimJob] = []
    left_out = never_fit = 0
    classes = {c.name for c in settings.classes}
    mapped = settings.priority_map
    if mapped is not None:
        unknown_classes = sorted(set(mapped.values()) - classes)
        if unknown_classes:
            raise ValueError(
                f"priority map: unknown class(es) {', '.join(unknown_classes)} (classes: {', '.join(sorted(classes))})"
            )
        unmapped = Counter(t.label for t in trace.jobs if t.label not in mapped)
        if unmapped:
            listed = ", ".join(f"{label!r} ({count:,} jobs)" for label, count in sorted(unmapped.items(), key=str))
            raise ValueError(f"priority map: no class for {listed}")
    for t in trace.jobs:
        if t.team not in sized:
            left_out += 1
            continue
        # GPUs counted with no nodes: a gang's members need no node each.
        members = t.gpus_per_node if settings.topology else None
        key = (t.team, t.gpus, t.gpu_type, members)
        if key not in fits:
            probe = Job(t.job_id, t.team, "low", t.gpus, 0.0, gpus_per_node=members, gpu_type=t.gpu_type)
            fits[key] = can_ever_fit(probe, cluster.nodes)
        if not fits[key]:
            never_fit += 1
            continue
        priority = (
            mapped[t.label] if mapped is not None and t.label is not None else assign_priority(t.job_id, settings.mix)
        )
        fails = t.failed and settings.trace_failures
        costs = (t.save_cost, t.restart_cost) if settings.trace_costs else (None, None)
        elastic = settings.elastic_share > 0 and is_drawn(t.job_id, settings.elastic_share)
        sizes = sizes_of(t.gpus, members) if elastic else ()
        jobs.append(
            SimJob(
                t.job_id,
                t.team,
                priority,
                t.gpus,
                t.submit_time,
                t.duration,
                t.gpu_type,
                fails,
                members,
                *costs,
                sizes,
            )
        )
    return jobs, left_out, never_fit


def compare(
    trace: Trace,
    spec: ClusterSpec,
    policies: Sequence[Policy],
    settings: Settings,
    on_progress: Callable[[Policy, int], None] | None = None,
) -> list[Replayed]:
    """Replay the same trace and cluster under each policy, in the order given; a cluster one
    of them cannot have (partitions too small) is refused before any replay."""
    clusters = [build_cluster(trace, spec, policy) for policy in policies]
    reports = []
    for policy, cluster in zip(policies, clusters, strict=True):
        progress = None if on_progress is None else (lambda done, p=policy: on_progress(p, done))
        reports.append(replay(trace, spec, policy, settings, progress, cluster))
    return reports
