"""Where a job goes: gang shapes, and best-fit (or first-fit) placement on free GPUs."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.model import Job, Node, PlacementRule
from gpupool.policy.free import FreeGpus, FreeIndex, Group, Shape, Slot
from gpupool.shapes import gang_split_problem


def eligible_groups(job: Job, types: Sequence[str]) -> list[list[Group]]:
    """Alternatives a job may be placed on, one per GPU type (a gang never mixes types).

    A job may use shared nodes and nodes dedicated to its own team.
    """
    teams = (None, job.team)
    return [[(t, team) for team in teams] for t in (types if job.gpu_type is None else [job.gpu_type])]


def gang_shapes(job: Job, sizes: Sequence[int]) -> tuple[int, ...]:
    """GPUs per node of a job on nodes of `sizes` (largest first), largest member first.

    `gpus_per_node` gives equal members. Without it, a job that fits one node stays on one
    node; a larger one fills the largest nodes whole and puts the rest on one more (fewest
    nodes). A job larger than all nodes together keeps the split by the largest node size.
    """
    if job.gpus_per_node is not None:
        problem = gang_split_problem(job.gpus, job.gpus_per_node)
        if problem is not None:
            raise ValueError(f"job {job.id}: gpus_per_node: {problem}")
        return (job.gpus_per_node,) * (job.gpus // job.gpus_per_node)
    largest = sizes[0] if sizes else 0
    if job.gpus <= largest or largest <= 0:
        return (job.gpus,)
    members, rest = [], job.gpus
    for size in sizes:
        members.append(min(size, rest))
        rest -= members[-1]
        if not rest:
            return tuple(sorted(members, reverse=True))
    whole, rest = divmod(job.gpus, largest)
    return (largest,) * whole + ((rest,) if rest else ())


def job_shapes(job: Job, free: FreeGpus) -> tuple[Shape, ...]:
    """Every way the job could be laid out on the pool of `free`, in the order to try them."""
    shapes = []
    for alternative in eligible_groups(job, free.layout.types):
        # Only groups that have nodes: a group without any must not block a strict queue.
        groups = tuple(g for g in alternative if g in free.layout.sizes)
        if groups:
            shapes.append(Shape(groups, gang_shapes(job, free.sizes_in(groups))))
    return tuple(shapes)


def choose_slots(shape: Shape, free: FreeGpus, rule: PlacementRule = PlacementRule.BEST_FIT) -> list[Slot] | None:
    """Place each gang member, largest first, onto distinct nodes by `rule`; None if it does not fit."""
    used: set[int] = set()
    slots = []
    fit = free.best_fit if rule is PlacementRule.BEST_FIT else free.first_fit
    for want in shape.slots:
        i = fit(want, shape.groups, used)
        if i is None:
            return None
        used.add(i)
        slots.append((i, want))
    return slots


def fits_empty(shape: Shape, free: FreeGpus) -> bool:
    """Whether the shape fits the nodes of its groups when they are all empty."""
    sizes = free.sizes_in(shape.groups)
    if len(sizes) < len(shape.slots):
        return False
    # Members and nodes both sorted largest first: if the k-th largest node cannot hold the
    # k-th largest member, no assignment can.
    return all(want <= size for want, size in zip(shape.slots, sizes, strict=False))


def can_ever_fit(job: Job, nodes: Sequence[Node]) -> bool:
    """Whether some placement on `nodes`, all of them empty, could hold `job`: one rule for the
    API (a submission no placement could ever hold is refused), the simulator (such a job of a
    trace is left out) and the core (such a job waits, `never_fits`). A job asking for more GPUs
    than the whole pool is answered without laying out its shapes (a trace may ask for 10^12).
    An elastic job fits if its smallest size does."""
    job = job.at_size(job.smallest)
    if job.gpus > sum(n.gpus for n in nodes):
        return False
    empty = FreeGpus(FreeIndex(nodes))
    return any(fits_empty(shape, empty) for shape in job_shapes(job, empty))
