"""Gauges of the pool as it is now, read from the store in a few grouped queries: GPUs by state
per node and type, jobs by state, pending jobs by why they wait, each team's use against its
guarantee and budgets. Label sets known in advance (every class and team) are given as 0, so a
series does not vanish when its count falls to nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from gpupool.settle import ENDED, JobState
from gpupool.store import Store
from gpupool.store.schema import TeamRow

GPU_STATES = ("idle", "allocated", "draining", "held", "down")
LIVE_STATES = tuple(s.value for s in JobState if s not in ENDED)


def gauge(name: str, doc: str, labels: Sequence[str], values: Iterable[tuple[Sequence[str], float]]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for label_values, value in values:
        family.add_metric(list(label_values), value)
    return family


def pool_gauges(store: Store, now: float, teams: Sequence[TeamRow], known: Sequence[tuple[str, str]]) -> list[Metric]:
    """Every gauge of the pool's current state, from one read of each kind (`known`: every
    (class, team) pair, given as 0 where nothing is)."""
    return [
        *gpu_gauges(store),
        *job_gauges(store, known),
        *team_gauges(store, now, teams, known),
    ]


def gpu_gauges(store: Store) -> list[Metric]:
    per_node: Counter[tuple[str, str, str]] = Counter()
    by_type: Counter[tuple[str, str]] = Counter()
    node_states: Counter[tuple[str, str]] = Counter()
    for n in store.node_gpus():
        node_states[(n.gpu_type, "up")] += 0
        node_states[(n.gpu_type, "down")] += 1 if not n.up else 0
        node_states[(n.gpu_type, "up")] += 1 if n.up else 0
        counts = dict.fromkeys(GPU_STATES, 0)
        if n.up:
            counts.update(n.states)
            counts["idle"] = n.gpus - sum(n.states.values())
        else:
            counts["down"] = n.gpus
        for state, count in counts.items():
            if count:  # per node only the states it has: a node is mostly in one or two
                per_node[(n.name, n.gpu_type, state)] = count
            by_type[(n.gpu_type, state)] += count
    return [
        gauge(
            "gpupool_gpus",
            "GPUs of the pool by state: idle, allocated, draining (its job has notice), held (free, kept for a "
            "preemptor) or down (on a node that left the pool). Their sum is the pool's size.",
            ["gpu_type", "state"],
            sorted(by_type.items()),
        ),
        gauge(
            "gpupool_node_gpus",
            "GPUs of each node by state (as gpupool_gpus; a state the node has no GPU in is left out).",
            ["node", "gpu_type", "state"],
            sorted(per_node.items()),
        ),
        gauge(
            "gpupool_nodes",
            "Nodes the pool has known, up or down.",
            ["gpu_type", "state"],
            sorted(node_states.items()),
        ),
    ]


def job_gauges(store: Store, known: Sequence[tuple[str, str]]) -> list[Metric]:
    jobs: Counter[tuple[str, str, str]] = Counter({(s, c, t): 0 for c, t in known for s in LIVE_STATES})
    for state, team, priority, count in store.live_counts():
        jobs[(state, priority, team)] += count
    pending: Counter[tuple[str, str, str]] = Counter()
    pending_gpus: Counter[tuple[str, str]] = Counter(dict.fromkeys(known, 0))
    oldest: dict[tuple[str, str], float] = {}
    for w in store.waiting():
        pending[(w.priority, w.team, w.reason or "undecided")] += w.jobs
        pending_gpus[(w.priority, w.team)] += w.gpus or 0
        key = (w.priority, w.team)
        if w.oldest is not None:
            oldest[key] = min(oldest.get(key, w.oldest), w.oldest)
    return [
        gauge(
            "gpupool_jobs",
            "Jobs not done yet, by state (pending, starting, running, preempting), class and team.",
            ["state", "class", "team"],
            sorted(jobs.items()),
        ),
        gauge(
            "gpupool_pending_jobs",
            "Pending jobs by class, team and the reason they wait, as last decided ('undecided': not yet).",
            ["class", "team", "reason"],
            sorted(pending.items()),
        ),
        gauge(
            "gpupool_pending_gpus",
            "GPUs asked for by pending jobs.",
            ["class", "team"],
            sorted(pending_gpus.items()),
        ),
        gauge(
            "gpupool_oldest_pending_queued_timestamp_seconds",
            "When the pending job that has waited longest joined the line (submitted or requeued): its wait is "
            "time() minus this. Absent where nothing is pending.",
            ["class", "team"],
            sorted(oldest.items()),
        ),
    ]


def team_gauges(store: Store, now: float, teams: Sequence[TeamRow], known: Sequence[tuple[str, str]]) -> list[Metric]:
    allocated: Counter[tuple[str, str]] = Counter({(t, c): 0 for c, t in known})
    for team, priority, gpus in store.allocated():
        allocated[(team, priority)] += gpus
    budgets, spent = store.budget_use(now)
    return [
        gauge(
            "gpupool_team_guaranteed_gpus",
            "GPUs guaranteed to each team (taken back from others when it needs them).",
            ["team"],
            [((t.name,), t.guaranteed_gpus) for t in teams],
        ),
        gauge(
            "gpupool_team_weight",
            "Each team's weight in sharing what is above the guarantees.",
            ["team"],
            [((t.name,), t.weight) for t in teams],
        ),
        gauge(
            "gpupool_team_allocated_gpus",
            "GPUs each team's attempts hold now, by the class they run at.",
            ["team", "class"],
            sorted(allocated.items()),
        ),
        gauge(
            "gpupool_team_budget_gpu_seconds",
            "Each priority budget: the GPU-seconds a team may use at a class per window.",
            ["team", "class"],
            [((b.team, b.priority), b.gpu_hours * 3600) for b in budgets],
        ),
        gauge(
            "gpupool_team_budget_window_seconds",
            "The rolling window of each priority budget.",
            ["team", "class"],
            [((b.team, b.priority), b.window) for b in budgets],
        ),
        gauge(
            "gpupool_team_budget_used_gpu_seconds",
            "GPU-seconds each team used at a budgeted class inside the budget's window.",
            ["team", "class"],
            [((b.team, b.priority), spent.get((b.team, b.priority), 0.0)) for b in budgets],
        ),
    ]
