"""Builders that keep scheduling scenarios short, for gpupool's tests and benchmarks.

snapshot = Snapshot(
    nodes=pool(nodes=2, gpus=8),
    running=[running(job("a", cls="low", gpus=8), on("n0", *range(8)), started=0)],
    pending=[job("b", cls="high", gpus=8)],
)
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.model import DEFAULT_CLASSES, Allocation, Job, Node, Notice, Placement, Plan, RunningJob

BATCH_CLASSES = tuple(c.name for c in DEFAULT_CLASSES if c.name != "interactive")
"""The default classes that batch work and traces use, for the scenarios tests and benchmarks
draw: `interactive` (sessions') has `urgent`'s shape (it preempts, it is never preempted), and
drawing it as well would only thin the scenarios that exercise preemption."""


def pool(
    nodes: int = 1, gpus: int = 8, gpu_type: str = "gpu", prefix: str = "n", team: str | None = None
) -> list[Node]:
    """`nodes` identical nodes named f"{prefix}{i}"."""
    return [Node(f"{prefix}{i}", gpus, gpu_type, team) for i in range(nodes)]


def job(
    id: str,
    team: str = "a",
    cls: str = "low",
    gpus: int = 1,
    submit: float = 0.0,
    gpus_per_node: int | None = None,
    gpu_type: str | None = None,
    preemptions: int = 0,
    max_preemptions: int | None = None,
    restart: float = 0.0,
    sizes: tuple[int, ...] = (),
) -> Job:
    """A job; an elastic one with `sizes` (smallest first), which asks for the largest."""
    gpus = sizes[-1] if sizes else gpus
    return Job(id, team, cls, gpus, submit, gpus_per_node, gpu_type, preemptions, max_preemptions, restart, sizes=sizes)


def on(node: str, *gpus: int) -> Placement:
    """One allocation: `on("n0", 0, 1)`; add placements with `+` for gangs."""
    return (Allocation(node, tuple(gpus)),)


def running(
    job: Job,
    placement: Placement,
    started: float = 0.0,
    last_ckpt: float | None = None,
    notice_for: str | None = None,
    deadline: float = 0.0,
) -> RunningJob:
    notice = Notice(notice_for, deadline) if notice_for is not None else None
    return RunningJob(job, placement, started, last_ckpt, notice)


def fill(nodes: Iterable[Node], jobs: Iterable[Job], started: float = 0.0) -> list[RunningJob]:
    """Pack `jobs` onto `nodes` in order, lowest GPU ids first (no checkpoints yet)."""
    out = []
    free = [(n.name, list(range(n.gpus))) for n in nodes]
    for j in jobs:
        for name, ids in free:
            if len(ids) >= j.gpus:
                out.append(running(j, on(name, *ids[: j.gpus]), started))
                del ids[: j.gpus]
                break
        else:
            raise ValueError(f"job {j.id} does not fit")
    return out


def summary(plan: Plan) -> list[tuple[object, ...]]:
    """A plan without its prose: what a scenario table compares."""
    rows: list[tuple[object, ...]] = []
    rows += [("start", s.job, tuple((a.node, a.gpus) for a in s.placement), s.reason.value) for s in plan.starts]
    rows += [("preempt", p.victim, p.for_job, p.reason.value) for p in plan.preemptions]
    rows += [("wait", w.job, w.reason.value) for w in plan.waits]
    return rows


def packed(job: Job, nodes: list[Node], free: dict[str, list[int]]) -> Placement | None:
    """A first-fit layout of `job` on the GPUs `free` lists per node, taken out of it (any split
    is legal for a job already running); None, taking nothing, if they do not hold it."""
    placement = []
    left = job.gpus
    for node in nodes:
        if left and free[node.name]:
            take = free[node.name][: min(left, len(free[node.name]))]
            placement.append(Allocation(node.name, tuple(take)))
            left -= len(take)
    if left:
        return None
    for alloc in placement:
        del free[alloc.node][: len(alloc.gpus)]
    return tuple(placement)
