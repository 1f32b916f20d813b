"""Stage 1 of a decision: GPUs held for jobs whose victims drain.

A preemptor holds the GPUs its victims free while they drain, with free ones, so nothing else
takes them; once every GPU it holds is free, it starts. A drain whose preemptor no longer waits
(it started elsewhere, it was cancelled) is an orphan: the GPUs it frees may be held by any job
they make fit (`hold_orphans`, from the queue pass).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass

from gpupool.model import Allocation, Job, JobId, Placement, RunningJob
from gpupool.policy.decision import Decision
from gpupool.policy.free import FreeGpus, Slot


@dataclass(slots=True)
class Orphans:
    """Victims draining for a job that no longer waits (in job id order): what they free is
    anyone's, and a job that holds some of it takes them out."""

    draining: list[RunningJob]


def hold_for_drains(decision: Decision) -> Orphans:
    """Every job whose victims drain holds their GPUs, plus free ones, before anything else is
    placed, in queue order; only then does a job whose held placement is all free GPUs start.
    Returns the drains whose preemptor no longer waits."""
    if not decision.state.draining:
        return Orphans([])
    draining_for, orphans = _drains(decision.state.draining.values(), decision.state.line.jobs)
    waiting = decision.state.line.of(draining_for)
    held: list[tuple[Job, Placement, list[RunningJob]]] = []
    for _, job in waiting.in_order(decision.class_value, decision.config.order, decision.shares.share, set()):
        victims = draining_for[job.id]
        sized, placement = _largest_on_lent(decision, job, victims)
        if placement:
            decision.shares.add(job.team, sized.gpus)
            decision.settled.add(job.id)
            held.append((sized, placement, victims))
    for job, placement, victims in held:
        if _draining_in(placement, victims):
            decision.hold(job, placement, [r.job.label for r in victims], _last_deadline(victims))
        else:
            decision.start(job, placement)
            orphans.draining.extend(victims)
    return orphans


def hold_orphans(decision: Decision, job: Job, orphans: Orphans) -> bool:
    """Hold GPUs that drains for a job that no longer waits will free, if they make `job` fit."""
    placement = _place_on_lent(decision, job, orphans.draining)
    if not placement:
        return False
    claimed = _draining_in(placement, orphans.draining)
    orphans.draining = [r for r in orphans.draining if r not in claimed]
    decision.shares.add(job.team, job.gpus)
    decision.hold(job, placement, [r.job.label for r in claimed], _last_deadline(claimed))
    return True


def _drains(running: Iterable[RunningJob], pending: Container[JobId]) -> tuple[dict[JobId, list[RunningJob]], Orphans]:
    """The draining jobs by the job they drain for while it still waits (by job id), and the
    others."""
    draining_for: dict[JobId, list[RunningJob]] = defaultdict(list)
    orphans = []
    for job in running:
        assert job.notice is not None
        if job.notice.for_job == job.job.id:
            continue  # a growth, which frees nothing
        if job.notice.for_job in pending:
            draining_for[job.notice.for_job].append(job)
        else:
            orphans.append(job)
    by_id = {job_id: sorted(victims, key=lambda r: r.job.id) for job_id, victims in draining_for.items()}
    return by_id, Orphans(sorted(orphans, key=lambda r: r.job.id))


def _largest_on_lent(decision: Decision, job: Job, draining: Sequence[RunningJob]) -> tuple[Job, Placement]:
    """`job` at the largest of its sizes that the GPUs `draining` jobs free hold, with no more
    free GPUs than its smallest size needs (growing into free ones is for the growth pass,
    after the queue's jobs), and that placement; its one size, if rigid; empty if none fits."""
    if not job.elastic:
        return job, _place_on_lent(decision, job, draining)
    lent = {(a.node, g) for r in draining for a in _freed(r) for g in a.gpus}
    smallest = job.at_size(job.smallest)
    placement = _place_on_lent(decision, smallest, draining)
    if not placement:
        return job, ()
    allowed = _free_in(placement, lent)
    _unplace(decision.free, placement, lent)
    for size in reversed(job.sizes[1:]):
        sized = job.at_size(size)
        placement = _place_on_lent(decision, sized, draining)
        if placement and _free_in(placement, lent) <= allowed:
            return sized, placement
        _unplace(decision.free, placement, lent)
    return smallest, _place_on_lent(decision, smallest, draining)


def _unplace(free: FreeGpus, placement: Placement, lent: Container[tuple[str, int]]) -> None:
    """Undo `place_on_lent`: the free GPUs of `placement` are free again, its `lent` ones
    still their draining jobs'."""
    for a in placement:
        free.give(free.node_index(a.node), [g for g in a.gpus if (a.node, g) not in lent])


def _free_in(placement: Placement, lent: Container[tuple[str, int]]) -> int:
    """GPUs of `placement` that are free ones, not `lent` by draining jobs."""
    return sum(1 for a in placement for g in a.gpus if (a.node, g) not in lent)


def _place_on_lent(decision: Decision, job: Job, draining: Sequence[RunningJob]) -> Placement:
    """Place `job` on free GPUs plus those `draining` jobs will free (see `place_on_lent`)."""
    return place_on_lent(
        draining, decision.free, lambda: decision.memo.fit_slots(job, decision.config.placement, lent=True)
    )


def place_on_lent(draining: Sequence[RunningJob], free: FreeGpus, choose: Callable[[], list[Slot] | None]) -> Placement:
    """Place a job on free GPUs plus those the `draining` jobs hold, with `choose` giving
    its slots; the GPUs of the placement are taken, the draining jobs' other GPUs stay theirs.
    Empty if it does not fit."""
    lent = [(free.node_index(a.node), a.gpus) for r in draining for a in _freed(r)]
    for i, gpus in lent:
        free.give(i, gpus)
    slots = choose() or []
    own = {i: [g for j, gpus in lent if j == i for g in gpus] for i, _ in slots}
    placement: Placement = ()
    for i, want in slots:
        # The draining jobs' GPUs first: free ones may be what another held placement counts on.
        taken = sorted(free.free[i], key=lambda g: (g not in own[i], g))[:want]
        free.take(i, taken)
        placement += (Allocation(free.nodes[i].name, tuple(sorted(taken))),)
    for i, gpus in lent:
        still_lent = [g for g in gpus if g in free.free[i]]
        if still_lent:
            free.take(i, still_lent)
    return placement


def _draining_in(placement: Placement, draining: Iterable[RunningJob]) -> list[RunningJob]:
    """The draining jobs with a GPU they free in `placement`: those whose drain it waits for."""
    used = {(a.node, g) for a in placement for g in a.gpus}
    return [r for r in draining if any((a.node, g) in used for a in _freed(r) for g in a.gpus)]


def _freed(draining: RunningJob) -> Placement:
    """The GPUs a draining attempt frees (a shrink keeps some)."""
    assert draining.notice is not None
    return draining.notice.frees(draining.placement)


def _last_deadline(victims: Iterable[RunningJob]) -> float:
    """When the last of `victims` must be gone."""
    return max(r.notice.deadline for r in victims if r.notice is not None)
