"""The cheapest sufficient set of victims by exhaustive search: the reference the greedy
victim search (`preempt.search.find_victims`) is measured against, on small pools only.

It covers what can be enumerated plainly: one job that fits on one node, priority preemption
in the whole pool (no reclaim, no fair share), every running job that is not draining,
unprotected and of a lower class a candidate. The cost of a set is the greedy search's score:
`(victims' classes highest first, total lost work, number of victims)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from gpupool.model import Config, Job, Node, PriorityClass, RunningJob, Snapshot
from gpupool.policy.preempt.candidates import lost_work, protection

Cost = tuple[tuple[int, ...], float, int]


def set_cost(victims: Sequence[RunningJob], config: Config, now: float) -> Cost:
    """The score of a set of victims, as the greedy search compares them."""
    classes = tuple(sorted((class_of(r, config).value for r in victims), reverse=True))
    # Rounded: two sets of the same jobs must compare equal whatever order they were summed in.
    return (classes, round(sum(lost_work(r, now) for r in victims), 6), len(victims))


def class_of(running: RunningJob, config: Config) -> PriorityClass:
    """The class the attempt runs at (as the snapshot gives it, else the job's own)."""
    return config.priority_class(running.priority or running.job.priority)


def cheapest_victims(job: Job, snapshot: Snapshot, config: Config, now: float) -> tuple[Cost, list[str]] | None:
    """The cost and the ids of the cheapest set of victims that frees one node the job may use
    for it, or None when no set does (or the job already fits)."""
    cls = config.priority_class(job.priority)
    if not cls.may_preempt:
        return None
    nodes = [n for n in snapshot.nodes if n.team in (None, job.team) and job.gpu_type in (None, n.gpu_type)]
    taken = {(a.node, g) for r in snapshot.running for a in r.placement for g in a.gpus}
    free = {n.name: sum((n.name, g) not in taken for g in range(n.gpus)) for n in nodes}
    if any(count >= job.gpus for count in free.values()):
        return None
    candidates = [
        r
        for r in snapshot.running
        if r.notice is None
        and class_of(r, config).value < cls.value
        and protection(r, class_of(r, config), now, config) is None
    ]
    best: tuple[Cost, list[str]] | None = None
    for size in range(1, len(candidates) + 1):
        for chosen in combinations(candidates, size):
            if not _frees(job, nodes, free, chosen):
                continue
            cost = set_cost(chosen, config, now)
            if best is None or cost < best[0]:
                best = (cost, sorted(r.job.id for r in chosen))
    return best


def _frees(job: Job, nodes: Sequence[Node], free: dict[str, int], chosen: Sequence[RunningJob]) -> bool:
    """Whether some node would hold the job once `chosen` left, each of them needed there."""
    for node in nodes:
        on_node = [sum(len(a.gpus) for a in r.placement if a.node == node.name) for r in chosen]
        if all(on_node) and free[node.name] + sum(on_node) >= job.gpus:
            return True
    return False
