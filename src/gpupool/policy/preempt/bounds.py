"""Bounds of one victim search on every node at once, from the candidates grouped by (team,
class): what lets the search skip the nodes that cannot help or cannot win.

Every rule of a search treats the candidates of one group alike, so a search says once per
group whether it might take from it and at which rank; the bounds of all nodes are then array
operations over the groups' GPUs and lost work per node, built once per decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Group = tuple[str, int]
"""(team, class value): the candidates that every rule of one victim search treats alike."""

Rank = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class GroupsByNode:
    """Per node, the groups of its unprotected candidates, with the GPUs they hold there, their
    lowest lost work and the most GPUs one of them holds there, as arrays of rows of one node
    and group (one row per group, or per candidate). Chosen candidates stay counted: a bound
    only loosens."""

    nodes: int
    keys: list[Group]
    node: npt.NDArray[np.intp]
    group: npt.NDArray[np.intp]
    """The index in `keys` of the row's group."""
    gpus: npt.NDArray[np.float64]
    cost: npt.NDArray[np.float64]
    single: npt.NDArray[np.float64]
    """The most GPUs one candidate of the row holds on its node."""
    shrinks: bool = False
    """Some rows are elastic jobs' shrinks: a set of victims may evict none of them."""

    @classmethod
    def of(cls, nodes: int, held: Mapping[tuple[int, str, int], tuple[int, float, int]]) -> GroupsByNode:
        """From (GPUs, lowest lost work, most GPUs of one candidate) per (node index, team,
        class value)."""
        index: dict[Group, int] = {}
        for _, team, value in held:
            index.setdefault((team, value), len(index))
        rows = len(held)
        return cls(
            nodes,
            list(index),
            np.fromiter((i for i, _, _ in held), dtype=np.intp, count=rows),
            np.fromiter((index[team, value] for _, team, value in held), dtype=np.intp, count=rows),
            np.fromiter((gpus for gpus, _, _ in held.values()), dtype=np.float64, count=rows),
            np.fromiter((cost for _, cost, _ in held.values()), dtype=np.float64, count=rows),
            np.fromiter((single for _, _, single in held.values()), dtype=np.float64, count=rows),
        )


@dataclass(slots=True)
class Bounds:
    """Per node index, what a search could get there: an upper bound of the GPUs it could free,
    and a lower bound of what the victims it needs there cost (`search.node_score`).

    The candidates it might take on a node rank no lower than the lowest of them. A set of
    victims whose worst rank is that lowest one holds only candidates of that rank, each
    costing no less than the cheapest of them and freeing no more GPUs there than the largest:
    a gang member that needs `need` more GPUs on the node needs at least k = ceil(need /
    largest) of them. Any other set has a worse rank. So no set of victims there scores better
    than k victims of the lowest rank at the lowest cost (`bound`). Where one may do (k = 1),
    it is one that frees `need` there alone, so no cheaper than the cheapest such one (two or
    more victims rank worse than one): without it, a node whose one large job of the lowest
    class could do came before every node a small cheap job of that class was on."""

    gpus: list[int]
    lowest: list[int]
    """The index in `ranks` of the lowest rank it might take there; -1 where it takes nobody."""
    cost: list[float]
    """The lowest lost work of the candidates of the lowest rank it might take there."""
    ranks: list[Rank]
    """The ranks it gives the groups it might take from, lowest first."""
    largest: list[int]
    """The most GPUs one candidate of that rank holds there."""
    free: npt.NDArray[np.intp]
    """Free GPUs per node when the bounds were made."""
    _arrays: tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], npt.NDArray[np.intp], npt.NDArray[np.intp]]
    """`lowest`, `cost`, `largest` and `gpus` as arrays, for `order_for`'s passes over every node
    (the lists serve a search's look at one node: a list's item is read faster than an array's)."""
    _lowest_rows: tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], npt.NDArray[np.float64]]
    """(node, most GPUs of one candidate, lowest lost work) of the rows of each node's lowest rank."""
    _orders: dict[int, list[int]] = field(default_factory=dict)
    _alone: dict[int, npt.NDArray[np.float64]] = field(default_factory=dict)
    """Per member size, `alone` of every node with the free GPUs the bounds were made with."""
    _by_node: tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]] | None = None
    evicts_all: bool = False
    """No candidate is a shrink: every victim is evicted (`search.node_score` counts them)."""

    def fewest(self, node: int, need: int) -> int:
        """The fewest victims that could free `need` GPUs on `node`."""
        return -(-need // self.largest[node])

    def bound(self, node: int, have: int, want: int) -> tuple[object, ...]:
        """A lower bound of the score of `node` for a member of `want` GPUs where it has `have`."""
        k = self.fewest(node, want - have)
        # Exact: the score sums its costs with one rounding, which no k costs of at least
        # the least take below k times it (a bound a margin lowered would tie with no node).
        if k > 1:
            cost = k * self.cost[node]
        elif have == self.free[node]:
            cost = float(self.alone_all(want)[node])
        else:
            cost = self.alone(node, want - have)
        return (0, (self.ranks[self.lowest[node]],) * k, cost, k if self.evicts_all else 0, k, have, node)

    def alone(self, node: int, need: int) -> float:
        """The lowest lost work of a candidate of the node's lowest rank that frees `need` GPUs
        there alone (infinite if none does)."""
        nodes, single, cost = self._lowest_rows
        if self._by_node is None:
            order = np.argsort(nodes, kind="stable")
            self._by_node = (order, np.searchsorted(nodes[order], np.arange(len(self.lowest) + 1)))
        order, starts = self._by_node
        rows = order[starts[node] : starts[node + 1]]
        enough = cost[rows][single[rows] >= need]
        return float(enough.min()) if len(enough) else math.inf

    def alone_all(self, want: int) -> npt.NDArray[np.float64]:
        """`alone` of every node for a member of `want` GPUs, with the free GPUs the bounds were
        made with."""
        found = self._alone.get(want)
        if found is None:
            row_node, single, row_cost = self._lowest_rows
            enough = single >= want - self.free[row_node]
            found = self._alone[want] = np.full(len(self.lowest), np.inf)
            np.minimum.at(found, row_node[enough], row_cost[enough])
        return found

    def order_for(self, want: int) -> list[int]:
        """The nodes where a member of `want` GPUs needs victims and might find enough, by their
        `bound` with the free GPUs the bounds were made with: the order a search looks at them
        in, so that it stops at the first bound no better than its best score without a pass
        over the others (a node whose free GPUs change after is looked at apart)."""
        found = self._orders.get(want)
        if found is None:
            lowest, cost, largest, gpus = self._arrays
            have = self.free
            nodes = np.flatnonzero((lowest >= 0) & (have < want) & (have + gpus >= want))
            need = want - have[nodes]
            k = -(-need // largest[nodes])
            low = k * cost[nodes]
            one = k == 1
            if one.any():
                low[one] = self.alone_all(want)[nodes[one]]
            found = self._orders[want] = nodes[np.lexsort((nodes, have[nodes], low, k, lowest[nodes]))].tolist()
        return found


def ranked(groups: GroupsByNode, ranks: Mapping[Group, Rank | None]) -> tuple[list[Rank], tuple[int, ...]]:
    """The ranks a search gives the groups it might take from, lowest first, and the place of
    each group of `groups` among them (-1: it takes none). Bounds depend on the places alone
    but for the ranks' values: reclaim's ranks move with every job the decision starts or
    preempts, their order seldom does."""
    admitted = sorted({r for r in ranks.values() if r is not None})
    place = {r: k for k, r in enumerate(admitted)}
    return admitted, tuple(-1 if (r := ranks[g]) is None else place[r] for g in groups.keys)


def bounds_of(groups: GroupsByNode, admitted: list[Rank], places: Sequence[int], free: npt.NDArray[np.intp]) -> Bounds:
    """The `Bounds` of a search that ranks the groups `admitted` lowest first, each group of
    `groups` at its place among them (`ranked`), with `free` GPUs per node (as they were when
    the decision began, or since: the search looks apart at the nodes the decision changed)."""
    by_group = np.array(places, dtype=np.intp)
    rank = by_group[groups.group]
    taken = rank >= 0
    nodes = groups.node[taken]
    gpus = np.bincount(nodes, weights=groups.gpus[taken], minlength=groups.nodes).astype(np.intp)
    none = len(admitted)
    lowest = np.full(groups.nodes, none, dtype=np.intp)
    np.minimum.at(lowest, nodes, rank[taken])
    lowest[lowest == none] = -1
    # A set of victims whose worst rank is the node's lowest holds only candidates of that
    # rank: their lost work and size are what bound its cost and its number.
    at_lowest = rank[taken] == lowest[nodes]
    cost = np.full(groups.nodes, np.inf)
    lowest_cost = groups.cost[taken][at_lowest]
    np.minimum.at(cost, nodes[at_lowest], lowest_cost)
    largest = np.ones(groups.nodes, dtype=np.intp)
    single = groups.single[taken][at_lowest]
    np.maximum.at(largest, nodes[at_lowest], single.astype(np.intp))
    return Bounds(
        gpus.tolist(),
        lowest.tolist(),
        cost.tolist(),
        admitted,
        largest.tolist(),
        free,
        (lowest, cost, largest, gpus),
        (nodes[at_lowest], single, lowest_cost),
        evicts_all=not groups.shrinks,
    )


def unbounded(free: npt.NDArray[np.intp]) -> Bounds:
    """`Bounds` that rule out no node (a search without this shortcut): every node could free
    any number of GPUs at no cost, at the lowest rank."""
    n = len(free)
    huge = 10**9
    arrays = (np.zeros(n, dtype=np.intp), np.full(n, -np.inf), np.full(n, huge), np.full(n, huge))
    rows = (np.arange(n, dtype=np.intp), np.full(n, float(huge)), np.full(n, -np.inf))
    return Bounds([huge] * n, [0] * n, [-math.inf] * n, [()], [huge] * n, np.asarray(free), arrays, rows)
