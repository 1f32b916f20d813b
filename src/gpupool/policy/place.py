"""Where a job goes: free-GPU bookkeeping, gang shapes and best-fit (or first-fit) placement."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np
import numpy.typing as npt

from gpupool.model import Allocation, Job, Node, Placement, PlacementRule, RunningJob, gang_split_problem

Group = tuple[str, str | None]
"""Nodes that are interchangeable for eligibility: (gpu_type, dedicated team or None)."""

Slot = tuple[int, int]
"""(node index, GPUs wanted on it): one member of a gang on one node."""

JobKind = tuple[str, str | None, int, int | None]
"""(team, gpu_type, gpus, gpus_per_node): jobs of one kind have the same shapes."""


@dataclass(frozen=True, slots=True)
class _Layout:
    """What FreeGpus knows of the nodes alone, never changed once made (read only)."""

    names: tuple[str, ...]
    index: dict[str, int]
    group: list[Group]
    types: list[str]
    sizes: dict[Group, list[int]]
    capacity: int
    sizes_in: dict[tuple[Group, ...], tuple[int, ...]]
    """GPU counts of the nodes of some groups, largest first: filled as asked (a cache)."""
    shapes: dict[JobKind, tuple[Shape, ...]]
    """Every way a kind of job could be laid out on these nodes: filled as asked (a cache)."""

    @classmethod
    def of(cls, nodes: Sequence[Node]) -> _Layout:
        index = {node.name: i for i, node in enumerate(nodes)}
        if len(index) != len(nodes):
            raise ValueError("node names must be unique")
        group: list[Group] = [(node.gpu_type, node.team) for node in nodes]
        sizes: dict[Group, list[int]] = {}
        for node, in_group in zip(nodes, group, strict=True):
            sizes.setdefault(in_group, []).append(node.gpus)
        return cls(
            tuple(node.name for node in nodes),
            index,
            group,
            sorted({node.gpu_type for node in nodes}),
            sizes,
            max((node.gpus for node in nodes), default=0),
            {},
            {},
        )


class FreeIndex(Mapping[str, tuple[int, ...]]):
    """Free GPU ids per node, kept up to date by a driver between decisions (the simulator),
    with the nodes' layout and the buckets by free count that `FreeGpus` would otherwise build
    at every decision. As `Snapshot.free` it must equal every GPU outside the running
    placements; `FreeGpus` then copies it instead of deriving it."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = nodes
        self.layout = _Layout.of(nodes)
        self.free: list[tuple[int, ...]] = [tuple(range(node.gpus)) for node in nodes]
        self.counts = np.array([node.gpus for node in nodes], dtype=np.intp)
        """Free GPUs per node, as an array (what the victim search's bounds read)."""
        self.buckets: dict[Group, list[list[int]]] = {
            group: [[] for _ in range(self.layout.capacity + 1)] for group in self.layout.sizes
        }
        for i, gpus in enumerate(self.free):
            self.buckets[self.layout.group[i]][len(gpus)].append(i)

    def __getitem__(self, name: str) -> tuple[int, ...]:
        return self.free[self.layout.index[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout.names)

    def __len__(self) -> int:
        return len(self.free)

    def take(self, name: str, gpus: Iterable[int]) -> None:
        """`gpus` of node `name` are now held by a running job."""
        gone = set(gpus)
        self._replace(self.layout.index[name], tuple(g for g in self[name] if g not in gone))

    def give(self, name: str, gpus: Iterable[int]) -> None:
        """`gpus` of node `name` are free again."""
        self._replace(self.layout.index[name], tuple(sorted({*self[name], *gpus})))

    def _replace(self, i: int, free: tuple[int, ...]) -> None:
        # Each bucket is kept in node order: the order FreeGpus builds its own in.
        buckets = self.buckets[self.layout.group[i]]
        before = buckets[len(self.free[i])]
        del before[bisect_left(before, i)]
        insort(buckets[len(free)], i)
        self.free[i] = free
        self.counts[i] = len(free)


class _Bucket:
    """The nodes with one count of free GPUs: those of `nodes` (in node order) not taken out
    since, then those that came in, in the order they came. `nodes` is never changed, so a
    decision shares the driver's (`FreeIndex`) and pays only for the nodes it changes."""

    __slots__ = ("added", "gone", "nodes", "start")

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes
        self.gone: set[int] = set()
        self.added: dict[int, None] = {}
        self.start = 0
        """Where in `nodes` the first one not gone may be: a fill takes nodes from the front, and
        a look must not pass the ones taken every time (it made a fill quadratic)."""

    def __iter__(self) -> Iterator[int]:
        if self.gone:
            nodes, gone, start = self.nodes, self.gone, self.start
            while start < len(nodes) and nodes[start] in gone:
                start += 1
            self.start = start
            rest = islice(nodes, start, None) if start else nodes
            yield from (i for i in rest if i not in gone)
        else:
            yield from self.nodes
        yield from self.added

    def __len__(self) -> int:
        return len(self.nodes) - len(self.gone) + len(self.added)

    def add(self, i: int) -> None:
        self.added[i] = None

    def remove(self, i: int) -> None:
        if i in self.added:
            del self.added[i]
        else:
            self.gone.add(i)

    def first(self, exclude: set[int]) -> int | None:
        """Its first node in node order that is not in `exclude`, or None."""
        gone = self.gone
        rest = islice(self.nodes, self.start, None) if self.start else self.nodes
        found = next((i for i in rest if i not in gone and i not in exclude), None)
        for i in self.added:
            if i not in exclude and (found is None or i < found):
                found = i
        return found


class FreeGpus:
    """A mutable working copy of the free GPUs of every node, bucketed by free count.

    Buckets make best-fit a lookup of at most `max GPUs per node` dictionaries, so placing a
    job costs the same on 10 nodes as on 10,000.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        running: Iterable[RunningJob],
        free: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        self.nodes = nodes
        kept = free if isinstance(free, FreeIndex) and free.nodes is nodes else None
        layout = kept.layout if kept is not None else _Layout.of(nodes)
        self.index = layout.index
        self.group = layout.group
        self.types = layout.types
        self.sizes = layout.sizes
        self.capacity = layout.capacity
        self._sizes_in = layout.sizes_in
        self.shapes = layout.shapes
        self.buckets: dict[Group, list[_Bucket]]
        """Per group, per free count, its nodes."""
        self.changed: set[int] = set()
        """The nodes whose free GPUs this decision has changed (taken, or lent and taken back)."""
        self._counts: npt.NDArray[np.intp] | None = None
        if kept is not None:
            self._counts = kept.counts
            self.free = list(kept.free)
            self.buckets = {group: [_Bucket(nodes) for nodes in lists] for group, lists in kept.buckets.items()}
            return
        self.free = [free[name] for name in layout.names] if free is not None else self._derive(running)
        in_order: dict[Group, list[list[int]]] = {group: [[] for _ in range(self.capacity + 1)] for group in self.sizes}
        for i, gpus in enumerate(self.free):
            in_order[self.group[i]][len(gpus)].append(i)
        self.buckets = {group: [_Bucket(nodes) for nodes in lists] for group, lists in in_order.items()}

    def counts_at_start(self) -> npt.NDArray[np.intp]:
        """Free GPUs per node as the decision found them, or (without a driver's count) as they
        were when first asked for: exact but for the nodes in `changed` (read only)."""
        if self._counts is None:
            self._counts = np.fromiter(map(len, self.free), dtype=np.intp, count=len(self.free))
        return self._counts

    def _bucket(self, i: int, count: int) -> _Bucket:
        return self.buckets[self.group[i]][count]

    def _derive(self, running: Iterable[RunningJob]) -> list[tuple[int, ...]]:
        """Free GPU ids per node: every GPU not in a running job's placement."""
        taken: dict[int, list[int]] = {}
        for job in running:
            for alloc in job.placement:
                taken.setdefault(self.node_index(alloc.node), []).extend(alloc.gpus)
        # Free lists are tuples, replaced and never changed in place, so idle nodes of one size
        # share one: building the working state stays cheap on large pools.
        everything = {n: tuple(range(n)) for n in {node.gpus for node in self.nodes}}
        free = [everything[node.gpus] for node in self.nodes]
        for i, gpus in taken.items():
            held = set(gpus)
            name = self.nodes[i].name
            if len(held) != len(gpus):
                twice = next(g for g in gpus if gpus.count(g) > 1)
                raise ValueError(f"GPU {twice} of node {name} is held twice")
            if not held <= set(free[i]):
                raise ValueError(f"node {name} has no GPU {min(held - set(free[i]))}")
            free[i] = tuple(g for g in free[i] if g not in held)
        return free

    def sizes_in(self, groups: tuple[Group, ...]) -> tuple[int, ...]:
        """The GPU counts of the nodes of `groups`, largest first."""
        found = self._sizes_in.get(groups)
        if found is None:
            found = tuple(sorted((n for g in groups for n in self.sizes.get(g, ())), reverse=True))
            self._sizes_in[groups] = found
        return found

    def node_index(self, name: str) -> int:
        """The index of the node named `name`; a ValueError names an unknown one."""
        try:
            return self.index[name]
        except KeyError:
            raise ValueError(f"unknown node {name!r}") from None

    def take(self, i: int, gpus: Iterable[int]) -> None:
        """Mark `gpus` of node `i` taken."""
        self.changed.add(i)
        self._bucket(i, len(self.free[i])).remove(i)
        gone = set(gpus)
        self.free[i] = tuple(g for g in self.free[i] if g not in gone)
        self._bucket(i, len(self.free[i])).add(i)

    def give(self, i: int, gpus: Iterable[int]) -> None:
        """Mark `gpus` of node `i` free again (GPUs lent by draining jobs)."""
        self.changed.add(i)
        self._bucket(i, len(self.free[i])).remove(i)
        self.free[i] = tuple(sorted({*self.free[i], *gpus}))
        self._bucket(i, len(self.free[i])).add(i)

    def best_fit(self, want: int, groups: Sequence[Group], exclude: set[int]) -> int | None:
        """The node of `groups` with the fewest free GPUs that still has `want`, or None."""
        for count in range(want, self.capacity + 1):
            for group in groups:
                buckets = self.buckets.get(group)
                if buckets is None:
                    continue
                for i in buckets[count]:
                    if i not in exclude:
                        return i
        return None

    def first_fit(self, want: int, groups: Sequence[Group], exclude: set[int]) -> int | None:
        """The first node of `groups` in node order that has `want` free GPUs, or None."""
        found = None
        for group in groups:
            for bucket in self.buckets.get(group, ())[want:]:
                i = bucket.first(exclude)
                if i is not None and (found is None or i < found):
                    found = i
        return found

    def total(self, groups: Sequence[Group]) -> int:
        """Free GPUs in all the nodes of `groups`."""
        return sum(count * len(bucket) for group in groups for count, bucket in enumerate(self.buckets.get(group, ())))

    def allocate(self, slots: Sequence[Slot]) -> Placement:
        """Take the lowest free GPU ids for each slot and return them as a placement."""
        placement = []
        for i, want in slots:
            gpus = tuple(self.free[i][:want])
            self.take(i, gpus)
            placement.append(Allocation(self.nodes[i].name, gpus))
        return tuple(placement)


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


@dataclass(frozen=True, slots=True)
class Shape:
    """A job's gang on one alternative group of nodes."""

    groups: tuple[Group, ...]
    slots: tuple[int, ...]


def job_shapes(job: Job, free: FreeGpus) -> tuple[Shape, ...]:
    """Every way the job could be laid out on the pool of `free`, in the order to try them."""
    shapes = []
    for alternative in eligible_groups(job, free.types):
        # Only groups that have nodes: a group without any must not block a strict queue.
        groups = tuple(g for g in alternative if g in free.sizes)
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
    than the whole pool is answered without laying out its shapes (a trace may ask for 10^12)."""
    if job.gpus > sum(n.gpus for n in nodes):
        return False
    empty = FreeGpus(nodes, ())
    return any(fits_empty(shape, empty) for shape in job_shapes(job, empty))
