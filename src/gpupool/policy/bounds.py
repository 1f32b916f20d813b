"""Bounds of one victim search on every node at once, from the candidates grouped by (team,
class): what lets the search skip the nodes that cannot help or cannot win.

Every rule of a search treats the candidates of one group alike, so a search says once per
group whether it might take from it and at which rank; the bounds of all nodes are then array
operations over the groups' GPUs and lost work per node, built once per decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Group = tuple[str, int]
"""(team, class value): the candidates that every rule of one victim search treats alike."""

Rank = tuple[float, ...]


class GroupsByNode:
    """Per node, the groups of its unprotected candidates, with the GPUs they hold there and
    their lowest lost work. Chosen candidates stay counted: a bound only loosens."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.keys: list[Group] = []
        self._index: dict[Group, int] = {}
        self._rows: list[tuple[int, int, int, float]] = []
        self.node: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
        self.group: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
        self.gpus: npt.NDArray[np.float64] = np.zeros(0)
        self.cost: npt.NDArray[np.float64] = np.zeros(0)

    def add(self, node: int, group: Group, gpus: int, cost: float) -> None:
        """The candidates of `group` on `node` hold `gpus` there, the cheapest losing `cost`."""
        index = self._index.get(group)
        if index is None:
            index = self._index[group] = len(self.keys)
            self.keys.append(group)
        self._rows.append((node, index, gpus, cost))

    def freeze(self) -> GroupsByNode:
        """Turn the rows added into the arrays `bounds_of` reads."""
        if self._rows:
            node, group, gpus, cost = zip(*self._rows, strict=True)
            self.node = np.array(node, dtype=np.intp)
            self.group = np.array(group, dtype=np.intp)
            self.gpus = np.array(gpus, dtype=np.float64)
            self.cost = np.array(cost, dtype=np.float64)
        self._rows = []
        return self


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


def bounds_of(groups: GroupsByNode, ranks: Mapping[Group, Rank | None]) -> Bounds:
    """The `Bounds` of a search that ranks each group as `ranks` does (None: it takes none)."""
    admitted = sorted({r for r in ranks.values() if r is not None})
    place = {r: k for k, r in enumerate(admitted)}
    by_group = np.array([-1 if (r := ranks[g]) is None else place[r] for g in groups.keys], dtype=np.intp)
    rank = by_group[groups.group] if len(by_group) else np.zeros(0, dtype=np.intp)
    taken = rank >= 0
    nodes = groups.node[taken]
    gpus = np.bincount(nodes, weights=groups.gpus[taken], minlength=groups.nodes)
    none = len(admitted)
    lowest = np.full(groups.nodes, none, dtype=np.intp)
    np.minimum.at(lowest, nodes, rank[taken])
    lowest[lowest == none] = -1
    cost = np.full(groups.nodes, np.inf)
    np.minimum.at(cost, nodes, groups.cost[taken])
    return Bounds(gpus.astype(np.int64).tolist(), lowest.tolist(), cost.tolist(), admitted)
