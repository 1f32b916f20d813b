"""GPUs held for jobs whose victims drain.

A preemptor holds the GPUs its victims free while they drain, with free ones, so nothing else
takes them; a drain whose preemptor no longer waits (it started elsewhere, it was cancelled)
is an orphan: the GPUs it frees may be held by any job they make fit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from gpupool.model import Allocation, JobId, Node, Placement, RunningJob
from gpupool.policy.place import FreeGpus, Slot


@dataclass(slots=True)
class Drains:
    """Jobs that drain, by whether the job they drain for still waits."""

    draining_for: dict[JobId, list[RunningJob]]
    """Per preemptor that still waits, its draining victims (by job id)."""
    orphans: list[RunningJob]
    """Victims draining for a job that no longer waits (by job id)."""

    @classmethod
    def of(cls, running: Iterable[RunningJob], pending: Collection[JobId]) -> Drains:
        """The drains of `running` (those with a notice), by whether their preemptor is still
        `pending`."""
        draining_for: dict[JobId, list[RunningJob]] = defaultdict(list)
        orphans = []
        for job in running:
            if job.notice is None:
                continue
            if job.notice.for_job in pending:
                draining_for[job.notice.for_job].append(job)
            else:
                orphans.append(job)
        by_id = {job_id: sorted(victims, key=lambda r: r.job.id) for job_id, victims in draining_for.items()}
        return cls(by_id, sorted(orphans, key=lambda r: r.job.id))


def place_on_lent(
    draining: Sequence[RunningJob],
    free: FreeGpus,
    nodes: Sequence[Node],
    choose: Callable[[], list[Slot] | None],
) -> Placement:
    """Place a job on free GPUs plus those the `draining` jobs hold, with `choose` giving
    its slots; the GPUs of the placement are taken, the draining jobs' other GPUs stay theirs.
    Empty if it does not fit."""
    lent = [(free.node_index(a.node), a.gpus) for r in draining for a in r.placement]
    for i, gpus in lent:
        free.give(i, gpus)
    slots = choose() or []
    own = {i: [g for j, gpus in lent if j == i for g in gpus] for i, _ in slots}
    placement: Placement = ()
    for i, want in slots:
        # The draining jobs' GPUs first: free ones may be what another held placement counts on.
        taken = sorted(free.free[i], key=lambda g: (g not in own[i], g))[:want]
        free.take(i, taken)
        placement += (Allocation(nodes[i].name, tuple(sorted(taken))),)
    for i, gpus in lent:
        still_lent = [g for g in gpus if g in free.free[i]]
        if still_lent:
            free.take(i, still_lent)
    return placement


def draining_in(placement: Placement, draining: Iterable[RunningJob]) -> list[RunningJob]:
    """The draining jobs with a GPU in `placement`: those whose drain it waits for."""
    used = {(a.node, g) for a in placement for g in a.gpus}
    return [r for r in draining if any((a.node, g) in used for a in r.placement for g in a.gpus)]


def last_deadline(victims: Iterable[RunningJob]) -> float:
    """When the last of `victims` must be gone."""
    return max(r.notice.deadline for r in victims if r.notice is not None)
