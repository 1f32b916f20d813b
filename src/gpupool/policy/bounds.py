"""Bounds of one victim search on every node at once, from the candidates grouped by (team,
class): what lets the search skip the nodes that cannot help or cannot win.

Every rule of a search treats the candidates of one group alike, so a search says once per
group whether it might take from it and at which rank; the bounds of all nodes are then array
operations over the groups' GPUs and lost work per node, built once per decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Group = tuple[str, int]
"""(team, class value): the candidates that every rule of one victim search treats alike."""

Rank = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class GroupsByNode:
    """Per node, the groups of its unprotected candidates, with the GPUs they hold there and
    their lowest lost work, as arrays of one row per (node, group). Chosen candidates stay
    counted: a bound only loosens."""

    nodes: int
    keys: list[Group]
    node: npt.NDArray[np.intp]
    group: npt.NDArray[np.intp]
    """The index in `keys` of the row's group."""
    gpus: npt.NDArray[np.float64]
    cost: npt.NDArray[np.float64]

    @classmethod
    def of(cls, nodes: int, held: Mapping[tuple[int, str, int], tuple[int, float]]) -> GroupsByNode:
        """From (GPUs, lowest lost work) per (node index, team, class value)."""
        index: dict[Group, int] = {}
        for _, team, value in held:
            index.setdefault((team, value), len(index))
        rows = len(held)
        return cls(
            nodes,
            list(index),
            np.fromiter((i for i, _, _ in held), dtype=np.intp, count=rows),
            np.fromiter((index[team, value] for _, team, value in held), dtype=np.intp, count=rows),
            np.fromiter((gpus for gpus, _ in held.values()), dtype=np.float64, count=rows),
            np.fromiter((cost for _, cost in held.values()), dtype=np.float64, count=rows),
        )


@dataclass(frozen=True, slots=True)
class Bounds:
    """Per node index, what a search could get there: an upper bound of the GPUs it could free,
    and a lower bound of what the victims it needs there cost (the ranks and lost work of
    `victims.node_score`): the lowest rank and the lowest lost work of the candidates it might
    take there. No set of victims on the node scores better than one victim with both: its
    worst rank is no lower, and at an equal rank alone, its lost work no less."""

    gpus: list[int]
    lowest: list[int]
    """The index in `ranks` of the lowest rank it might take there; -1 where it takes nobody."""
    cost: list[float]
    """The lowest lost work of the candidates it might take there."""
    ranks: list[Rank]
    """The ranks it gives the groups it might take from, lowest first."""
    order: list[int]
    """The nodes where it might take somebody, by (lowest rank, lowest lost work, free GPUs
    when the bounds were made, index): the order of their bounds, so that a search looks at
    them in turn and stops at the first bound no better than its best score, without a pass
    over the others. (A node whose free GPUs change after is looked at apart.)"""


def bounds_of(groups: GroupsByNode, ranks: Mapping[Group, Rank | None], free: Sequence[int]) -> Bounds:
    """The `Bounds` of a search that ranks each group as `ranks` does (None: it takes none),
    with `free` GPUs per node now."""
    admitted = sorted({r for r in ranks.values() if r is not None})
    place = {r: k for k, r in enumerate(admitted)}
    by_group = np.array([-1 if (r := ranks[g]) is None else place[r] for g in groups.keys], dtype=np.intp)
    rank = by_group[groups.group]
    taken = rank >= 0
    nodes = groups.node[taken]
    gpus = np.bincount(nodes, weights=groups.gpus[taken], minlength=groups.nodes)
    none = len(admitted)
    lowest = np.full(groups.nodes, none, dtype=np.intp)
    np.minimum.at(lowest, nodes, rank[taken])
    lowest[lowest == none] = -1
    cost = np.full(groups.nodes, np.inf)
    np.minimum.at(cost, nodes, groups.cost[taken])
    somebody = np.flatnonzero(lowest >= 0)
    have = np.asarray(free, dtype=np.intp)[somebody]
    order = somebody[np.lexsort((somebody, have, cost[somebody], lowest[somebody]))]
    return Bounds(gpus.astype(np.int64).tolist(), lowest.tolist(), cost.tolist(), admitted, order.tolist())
