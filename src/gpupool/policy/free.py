"""Free GPUs: those a driver keeps between decisions (`FreeIndex`), and one decision's working
copy of them (`FreeGpus`), bucketed by free count so that best fit is a few lookups.

A decision copies only what it changes: the nodes' free GPU ids as one list, and a bucket
(the nodes of one group with one free count) the first time it takes a node out of it or puts
one in. Building the working copy costs the same on 10 nodes as on 10,000.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np
import numpy.typing as npt

from gpupool.model import Allocation, Node, Placement

Group = tuple[str, str | None]
"""Nodes that are interchangeable for eligibility: (gpu_type, dedicated team or None)."""

Slot = tuple[int, int]
"""(node index, GPUs wanted on it): one member of a gang on one node."""

JobKind = tuple[str, str | None, int, int | None]
"""(team, gpu_type, gpus, gpus_per_node): jobs of one kind have the same shapes."""


@dataclass(frozen=True, slots=True)
class Shape:
    """A job's gang on one alternative group of nodes: GPUs per member, largest first."""

    groups: tuple[Group, ...]
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Layout:
    """What is known of the nodes alone, never changed once made (read only), with caches
    filled as asked: shared by the kept free GPUs and every decision's working copy."""

    names: tuple[str, ...]
    index: dict[str, int]
    group: list[Group]
    types: list[str]
    sizes: dict[Group, list[int]]
    capacity: int
    sizes_in: dict[tuple[Group, ...], tuple[int, ...]]
    """GPU counts of the nodes of some groups, largest first (a cache)."""
    shapes: dict[JobKind, tuple[Shape, ...]]
    """Every way a kind of job could be laid out on these nodes (a cache of `place.job_shapes`)."""
    nodes_in: dict[tuple[Group, ...], list[int]]
    """Indexes of the nodes of some groups (a cache)."""

    @classmethod
    def of(cls, nodes: Sequence[Node]) -> Layout:
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
            {},
        )

    def node_index(self, name: str) -> int:
        """The index of the node named `name`; a ValueError names an unknown one."""
        try:
            return self.index[name]
        except KeyError:
            raise ValueError(f"unknown node {name!r}") from None


class FreeIndex(Mapping[str, tuple[int, ...]]):
    """Free GPU ids per node, kept up to date by the driver's state between decisions, with
    the nodes of each group in buckets by free count, each bucket in node order."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = nodes
        self.layout = Layout.of(nodes)
        self.free: list[tuple[int, ...]] = [tuple(range(node.gpus)) for node in nodes]
        self.counts = array("q", [node.gpus for node in nodes])
        """Free GPUs per node, as a typed array: written one node at a time (which numpy makes
        slow), read whole by the victim search's bounds (`count_array`)."""
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

    def count_array(self) -> npt.NDArray[np.intp]:
        """Free GPUs per node as a numpy array: a view of `counts`, valid until they change."""
        return np.frombuffer(self.counts, dtype=np.intp) if len(self.counts) else np.zeros(0, dtype=np.intp)

    def take(self, placement: Placement) -> None:
        """The GPUs of `placement` are now held by an attempt. A ValueError names a node that
        is not in the pool, or a GPU that is not free (held twice, or not on its node); nothing
        is taken then."""
        for i, left in self._left_after([placement]).items():
            self._replace(i, left)

    def check(self, placements: Iterable[Placement]) -> None:
        """Raise the ValueError `take` would, for `placements` taken one after the other."""
        self._left_after(placements)

    def give(self, placement: Placement) -> None:
        """The GPUs of `placement` are free again."""
        index = self.layout.index
        for alloc in placement:
            i = index[alloc.node]
            self._replace(i, tuple(sorted({*self.free[i], *alloc.gpus})))

    def _left_after(self, placements: Iterable[Placement]) -> dict[int, tuple[int, ...]]:
        """The free GPUs of each node `placements` use, once they are taken one after the other
        (a node may come in several allocations)."""
        left_of: dict[int, tuple[int, ...]] = {}
        index = self.layout.index
        for placement in placements:
            for alloc in placement:
                i = index.get(alloc.node)
                if i is None:
                    raise ValueError(f"unknown node {alloc.node!r}")
                have = left_of.get(i, self.free[i])
                gpus = alloc.gpus
                # A decision places on a node's lowest free GPUs: what is left is the rest.
                left = have[len(gpus) :] if have[: len(gpus)] == gpus else tuple(g for g in have if g not in gpus)
                if len(have) - len(left) != len(gpus):  # a GPU of `gpus` is not free, or twice in it
                    raise ValueError(self._not_free(i, have, gpus))
                left_of[i] = left
        return left_of

    def _not_free(self, i: int, have: tuple[int, ...], gpus: Sequence[int]) -> str:
        node = self.nodes[i]
        for at, gpu in enumerate(gpus):
            if not 0 <= gpu < node.gpus:
                return f"node {node.name} has no GPU {gpu}"
            if gpu not in have or gpu in gpus[:at]:
                return f"GPU {gpu} of node {node.name} is held twice"
        raise AssertionError("every GPU is free")

    def _replace(self, i: int, free: tuple[int, ...]) -> None:
        # Each bucket is kept in node order: the order a decision's working copy reads it in.
        buckets = self.buckets[self.layout.group[i]]
        before = buckets[len(self.free[i])]
        del before[bisect_left(before, i)]
        insort(buckets[len(free)], i)
        self.free[i] = free
        self.counts[i] = len(free)


class _Bucket:
    """A bucket a decision changed: the nodes of the kept bucket `nodes` (in node order) not
    taken out since, then those that came in, in the order they came. `nodes` is the kept
    state's and is never changed here."""

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
    """One decision's working copy of the free GPUs of every node, bucketed by free count:
    copied from the kept `FreeIndex` as the decision changes it (the module's docstring)."""

    def __init__(self, kept: FreeIndex) -> None:
        self.nodes = kept.nodes
        self.layout = layout = kept.layout
        self.index = layout.index
        self.group = layout.group
        self.capacity = layout.capacity
        self.free = list(kept.free)
        self._kept = kept
        self._changed: dict[Group, list[_Bucket | None]] = {}
        """Per group, per free count, the bucket this decision changed (None: as kept)."""
        self.changed: set[int] = set()
        """The nodes whose free GPUs this decision has changed (taken, or lent and taken back)."""
        self._counts: npt.NDArray[np.intp] | None = None

    @property
    def counts_at_start(self) -> npt.NDArray[np.intp]:
        """Free GPUs per node as the decision found them: exact but for the nodes in `changed`
        (read only)."""
        if self._counts is None:
            self._counts = self._kept.count_array()
        return self._counts

    def _nodes(self, group: Group, count: int) -> _Bucket | list[int] | None:
        """The nodes of `group` with `count` free GPUs (None: the pool has no node of `group`):
        in node order as the decision found them, then those it changed to that count, in the
        order it did."""
        kept = self._kept.buckets.get(group)
        if kept is None:
            return None
        changed = self._changed.get(group)
        bucket = changed[count] if changed is not None else None
        return bucket if bucket is not None else kept[count]

    def first_with(self, group: Group, count: int, exclude: set[int]) -> int | None:
        """The first node in node order of `group` with `count` free GPUs that is not in
        `exclude`, or None."""
        nodes = self._nodes(group, count)
        if isinstance(nodes, _Bucket):
            return nodes.first(exclude)
        return next((i for i in nodes if i not in exclude), None) if nodes is not None else None

    def _bucket(self, i: int, count: int) -> _Bucket:
        group = self.group[i]
        changed = self._changed.get(group)
        if changed is None:
            changed = self._changed[group] = [None] * (self.capacity + 1)
        found = changed[count]
        if found is None:
            found = changed[count] = _Bucket(self._kept.buckets[group][count])
        return found

    def sizes_in(self, groups: tuple[Group, ...]) -> tuple[int, ...]:
        """The GPU counts of the nodes of `groups`, largest first."""
        found = self.layout.sizes_in.get(groups)
        if found is None:
            sizes = self.layout.sizes
            found = tuple(sorted((n for g in groups for n in sizes.get(g, ())), reverse=True))
            self.layout.sizes_in[groups] = found
        return found

    def nodes_in(self, groups: tuple[Group, ...]) -> list[int]:
        """Indexes of the nodes of `groups`, in node order."""
        found = self.layout.nodes_in.get(groups)
        if found is None:
            found = self.layout.nodes_in[groups] = [i for i, g in enumerate(self.group) if g in groups]
        return found

    def node_index(self, name: str) -> int:
        """The index of the node named `name`; a ValueError names an unknown one."""
        return self.layout.node_index(name)

    def _move(self, i: int, free: tuple[int, ...]) -> None:
        """Node `i` has `free` GPUs now."""
        self.changed.add(i)
        self._bucket(i, len(self.free[i])).remove(i)
        self.free[i] = free
        self._bucket(i, len(free)).add(i)

    def take(self, i: int, gpus: Iterable[int]) -> None:
        """Mark `gpus` of node `i` taken."""
        gone = set(gpus)
        self._move(i, tuple(g for g in self.free[i] if g not in gone))

    def give(self, i: int, gpus: Iterable[int]) -> None:
        """Mark `gpus` of node `i` free again (GPUs lent by draining jobs)."""
        self._move(i, tuple(sorted({*self.free[i], *gpus})))

    def best_fit(self, want: int, groups: Sequence[Group], exclude: set[int]) -> int | None:
        """The node of `groups` with the fewest free GPUs that still has `want`, or None."""
        kept, changed = self._kept.buckets, self._changed
        present = [(kept[group], changed.get(group)) for group in groups if group in kept]
        for count in range(want, self.capacity + 1):
            for buckets, moved in present:
                bucket = moved[count] if moved is not None else None
                for i in bucket if bucket is not None else buckets[count]:
                    if i not in exclude:
                        return i
        return None

    def first_fit(self, want: int, groups: Sequence[Group], exclude: set[int]) -> int | None:
        """The first node of `groups` in node order that has `want` free GPUs, or None."""
        found = None
        for group in groups:
            if group not in self._kept.buckets:
                continue
            for count in range(want, self.capacity + 1):
                i = self.first_with(group, count, exclude)
                if i is not None and (found is None or i < found):
                    found = i
        return found

    def total(self, groups: Sequence[Group]) -> int:
        """Free GPUs in all the nodes of `groups`."""
        total = 0
        for group in groups:
            for count in range(1, self.capacity + 1):
                nodes = self._nodes(group, count)
                if nodes is None:
                    break
                total += count * len(nodes)
        return total

    def allocate(self, slots: Sequence[Slot]) -> Placement:
        """Take the lowest free GPU ids for each slot and return them as a placement."""
        placement = []
        for i, want in slots:
            free = self.free[i]
            self._move(i, free[want:])
            placement.append(Allocation(self.nodes[i].name, free[:want]))
        return tuple(placement)
