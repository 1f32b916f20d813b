"""The simulated pool: nodes, and each team's slice of it (its partition, or its guarantee)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpupool.model import Node
from gpupool.sim.trace import TraceError, open_text, read_rows

VC_SIZE_COLUMNS: tuple[str, ...] = ("vc", "node num")
MAX_POOL_GPUS = 100_000
"""The largest pool the simulator makes: every node is an object and every decision walks them.
A trace job asking for more GPUs than the pool never fits (see `replay.admissible`)."""


@dataclass(frozen=True, slots=True)
class Cluster:
    nodes: tuple[Node, ...]
    team_gpus: dict[str, int]
    """Each team's slice in GPUs: its partition when nodes are dedicated, else its guarantee."""

    @property
    def gpus(self) -> int:
        """Total GPUs of all nodes."""
        return sum(node.gpus for node in self.nodes)


def load_vc_sizes(path: Path) -> dict[str, int]:
    """Read a `vc,node num` file into {vc: node count}, in file order.

    Every vc must be non-empty and unique, every count a positive integer; problems raise TraceError
    with the line and column.
    """
    sizes: dict[str, int] = {}
    first_line: dict[str, int] = {}
    with open_text(path) as stream:
        header, rows = read_rows(path, stream, VC_SIZE_COLUMNS)
        i_vc, i_nodes = (header.index(name) for name in VC_SIZE_COLUMNS)
        for line, row in rows:
            vc = row[i_vc].strip()
            if not vc:
                raise TraceError(path, "empty", line=line, column="vc")
            if vc in first_line:
                raise TraceError(path, f"vc {vc!r} already listed on line {first_line[vc]}", line=line, column="vc")
            first_line[vc] = line
            text = row[i_nodes].strip()
            try:
                count = int(text)
            except ValueError:
                count = 0
            if count < 1:
                raise TraceError(path, f"{text!r} is not a positive integer", line=line, column="node num")
            sizes[vc] = count
    if not sizes:
        raise TraceError(path, "no vc rows")
    return sizes


def _round_half_up(value: float) -> int:
    # The tolerance keeps products like 0.7 × 15 = 10.499999999999998 on the half they were meant to hit;
    # capped, so that it never moves a large count (10^12 would otherwise gain 1,000).
    return math.floor(value + 0.5 + min(1e-9 * max(1.0, abs(value)), 1e-6))


def scale_sizes(sizes: Mapping[str, int], factor: float) -> dict[str, int]:
    """Multiply each node count by `factor` (> 0), rounding half up, at least 1 node each; order kept."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"scale factor must be a finite number > 0, not {factor!r}")
    return {team: max(1, _round_half_up(count * factor)) for team, count in sizes.items()}


def _check_gpus_per_node(gpus_per_node: int) -> None:
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be at least 1, not {gpus_per_node}")
    if gpus_per_node > MAX_POOL_GPUS:
        raise ValueError(
            f"gpus_per_node {gpus_per_node:,}: the simulated pool holds at most {MAX_POOL_GPUS:,} GPUs in all"
        )


def check_pool_size(nodes: int, gpus_per_node: int) -> None:
    """Refuse a pool of more than MAX_POOL_GPUS GPUs before any node is made."""
    _check_gpus_per_node(gpus_per_node)
    if nodes * gpus_per_node > MAX_POOL_GPUS:
        raise ValueError(
            f"{nodes:,} nodes × {gpus_per_node:,} GPUs = {nodes * gpus_per_node:,} GPUs: "
            f"the simulated pool holds at most {MAX_POOL_GPUS:,} GPUs"
        )


def cluster_from_sizes(sizes: Mapping[str, int], gpus_per_node: int = 8, *, dedicated: bool) -> Cluster:
    """One node per count, named f"{team}-{i:03d}" (i from 0), teams in `sizes` order.

    Dedicated nodes belong to their team (a partition); otherwise they are shared and the team's
    nodes × gpus_per_node is its guarantee. Counts must be ≥ 1 and team names non-empty, and the
    pool at most MAX_POOL_GPUS GPUs.
    """
    for team, count in sizes.items():
        if not team:
            raise ValueError("team names must be non-empty")
        if count < 1:
            raise ValueError(f"team {team!r} needs at least 1 node, not {count}")
    check_pool_size(sum(sizes.values()), gpus_per_node)
    nodes: list[Node] = []
    team_gpus: dict[str, int] = {}
    for team, count in sizes.items():
        owner = team if dedicated else None
        nodes.extend(Node(f"{team}-{i:03d}", gpus_per_node, team=owner) for i in range(count))
        team_gpus[team] = count * gpus_per_node
    return Cluster(nodes=tuple(nodes), team_gpus=team_gpus)


def _split_nodes(nodes: int, team_weights: Mapping[str, float]) -> dict[str, int]:
    """Apportion `nodes` among teams in proportion to their weights, at least one node each.

    Teams whose proportional share is under one node get exactly one and the rest is shared among the
    others again; the final shares are rounded by largest remainder, ties to the smaller team name.
    Weights must be finite, ≥ 0 and not all 0; `nodes` must be at least the number of teams.
    """
    if not team_weights:
        raise ValueError("no teams to split the nodes among")
    for team, weight in team_weights.items():
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"team {team!r}: weight must be a finite number ≥ 0, not {weight!r}")
    total_weight = sum(team_weights.values())
    if total_weight <= 0:
        raise ValueError("team weights are all 0: nothing to split the nodes by")
    if not math.isfinite(total_weight):
        raise ValueError("team weights overflow when summed: scale them down")
    if nodes < len(team_weights):
        raise ValueError(f"{nodes} node(s) cannot give each of the {len(team_weights)} teams at least one node")

    counts: dict[str, int] = {}
    rest = dict(team_weights)
    while True:
        left = nodes - len(counts)
        total = sum(rest.values())
        quotas = {team: left * weight / total for team, weight in rest.items()}
        # The tolerances keep an exact share of one node (or k.0) from being lost to float noise.
        small = [team for team, quota in quotas.items() if quota < 1 - 1e-9]
        if not small:
            break
        for team in small:
            counts[team] = 1
            del rest[team]
    floors = {team: math.floor(quota + 1e-9) for team, quota in quotas.items()}
    spare = left - sum(floors.values())
    # Rounded remainders so that float noise does not decide ties the team name should decide.
    by_remainder = sorted(quotas, key=lambda team: (-round(quotas[team] - floors[team], 9), team))
    for team in by_remainder[:spare]:
        floors[team] += 1
    counts.update(floors)
    return {team: counts[team] for team in team_weights}


def cluster_uniform(nodes: int, gpus_per_node: int, team_weights: Mapping[str, float], *, dedicated: bool) -> Cluster:
    """`nodes` identical nodes named f"node-{i:04d}" (i from 0), split among the teams by `_split_nodes`.

    Dedicated nodes belong to their team, consecutive in `team_weights` order; shared nodes belong to
    none, and each team's share × gpus_per_node is still recorded as its guarantee, or, with fewer
    nodes than teams, its share of the GPUs (`_shared_by_gpus`). The pool is at most MAX_POOL_GPUS
    GPUs.
    """
    check_pool_size(nodes, gpus_per_node)
    if not dedicated and 0 < nodes < len(team_weights):
        return _shared_by_gpus(tuple(Node(f"node-{i:04d}", gpus_per_node) for i in range(nodes)), team_weights)
    counts = _split_nodes(nodes, team_weights)
    built: list[Node] = []
    for team, count in counts.items():
        owner = team if dedicated else None
        first = len(built)
        built.extend(Node(f"node-{i:04d}", gpus_per_node, team=owner) for i in range(first, first + count))
    return Cluster(nodes=tuple(built), team_gpus={team: count * gpus_per_node for team, count in counts.items()})


MACHINE_TYPE_COLUMNS = ("gpu_type", "model")
MACHINE_GPU_COLUMNS = ("cap_gpu", "gpu", "gpus")


def load_machines(path: Path) -> tuple[tuple[str, int], ...]:
    """Read a machine list: one row per machine with its GPU type (`gpu_type` or `model`) and
    GPU count (`cap_gpu`, `gpu` or `gpus`), as alibaba-pai-2020-aux/machine_spec.csv and
    alibaba-openb-2023's node lists have them; or one row per kind with a `nodes` count too.
    Machines without GPUs are left out. Returns (gpu_type, GPUs) per machine, in file order."""
    machines: list[tuple[str, int]] = []
    total = 0
    with open_text(path) as stream:
        header, rows = read_rows(path, stream, ())
        type_column = next((c for c in MACHINE_TYPE_COLUMNS if c in header), None)
        gpu_column = next((c for c in MACHINE_GPU_COLUMNS if c in header), None)
        if type_column is None or gpu_column is None:
            wanted = f"one of {', '.join(MACHINE_TYPE_COLUMNS)} and one of {', '.join(MACHINE_GPU_COLUMNS)}"
            raise TraceError(path, f"a machine list needs {wanted} (columns: {', '.join(header)})", line=1)
        i_type, i_gpus = header.index(type_column), header.index(gpu_column)
        i_nodes = header.index("nodes") if "nodes" in header else None
        for line, row in rows:
            counts = []
            for i, column in ((i_gpus, gpu_column), (i_nodes, "nodes")):
                if i is None:
                    counts.append(1)
                    continue
                text = row[i].strip()
                try:
                    counts.append(int(text))
                except ValueError:
                    counts.append(-1)
                if counts[-1] < 0:
                    raise TraceError(path, f"{text!r} is not an integer ≥ 0", line=line, column=column)
            gpus, count = counts
            if gpus == 0:
                continue
            gpu_type = row[i_type].strip()
            if not gpu_type:
                raise TraceError(path, "empty", line=line, column=type_column)
            total += gpus * count
            if total > MAX_POOL_GPUS:
                raise TraceError(path, f"the simulated pool holds at most {MAX_POOL_GPUS:,} GPUs", line=line)
            machines.extend([(gpu_type, gpus)] * count)
    if not machines:
        raise TraceError(path, "no machine with GPUs")
    return tuple(machines)


def scale_machines(machines: tuple[tuple[str, int], ...], factor: float) -> tuple[tuple[str, int], ...]:
    """round(count × `factor`) machines of each GPU type (half up, at least one): the first ones,
    or the list over again above 1."""
    by_type: dict[str, list[tuple[str, int]]] = {}
    for machine in machines:
        by_type.setdefault(machine[0], []).append(machine)
    keep = scale_sizes({gpu_type: len(listed) for gpu_type, listed in by_type.items()}, factor)
    # Above 1, the list is repeated: machines of the same kinds, in the same proportions.
    scaled = tuple(
        m for gpu_type, listed in by_type.items() for m in itertools.islice(itertools.cycle(listed), keep[gpu_type])
    )
    total = sum(gpus for _, gpus in scaled)
    if total > MAX_POOL_GPUS:
        raise ValueError(f"--scale {factor:g} makes {total:,} GPUs: the simulated pool holds at most {MAX_POOL_GPUS:,}")
    return scaled


def _apportion(count: int, weights: Mapping[str, float]) -> dict[str, int]:
    """`count` items among the teams in proportion to `weights`, by largest remainder (ties to
    the team listed first); a team may get none."""
    total = sum(weights.values())
    quotas = {team: count * weight / total for team, weight in weights.items()}
    shares = {team: math.floor(quota + 1e-9) for team, quota in quotas.items()}
    order = sorted(weights, key=lambda team: -round(quotas[team] - shares[team], 9))
    for team in order[: count - sum(shares.values())]:
        shares[team] += 1
    return shares


def _shared_by_gpus(nodes: tuple[Node, ...], team_weights: Mapping[str, float]) -> Cluster:
    """A shared pool too small to give each team whole nodes (a workstation of one node, three
    teams): the guarantees are the teams' shares of its GPUs, at least one each."""
    gpus = sum(node.gpus for node in nodes)
    if gpus < len(team_weights):
        raise ValueError(
            f"{gpus} GPU(s) cannot give each of the {len(team_weights)} teams at least one: "
            "give more GPUs, per-team sizes (--vc-sizes), or other teams (--team-from)"
        )
    return Cluster(nodes=nodes, team_gpus=_split_nodes(gpus, team_weights))


def cluster_from_machines(
    machines: tuple[tuple[str, int], ...], team_weights: Mapping[str, float], *, dedicated: bool
) -> Cluster:
    """The machines as nodes named f"{gpu_type}-{i:04d}" (i counting within the type), with
    their GPU types. Each type's machines are apportioned among the teams by weight, in file
    order: a team's share is its partition when `dedicated`, else its guarantee (in GPUs). A
    shared pool whose machines would leave a team nothing splits its GPUs instead
    (`_shared_by_gpus`)."""
    if not team_weights or sum(team_weights.values()) <= 0:
        raise ValueError("no team with a weight to share the machines among")
    by_type: dict[str, list[int]] = {}
    for gpu_type, gpus in machines:
        by_type.setdefault(gpu_type, []).append(gpus)
    nodes: list[Node] = []
    team_gpus = dict.fromkeys(team_weights, 0)
    for gpu_type, sizes in by_type.items():
        shares = _apportion(len(sizes), team_weights)
        owners = [team for team, share in shares.items() for _ in range(share)]
        for i, (gpus, team) in enumerate(zip(sizes, owners, strict=True)):
            nodes.append(Node(f"{gpu_type}-{i:04d}", gpus, gpu_type, team if dedicated else None))
            team_gpus[team] += gpus
    empty = [team for team, gpus in team_gpus.items() if gpus == 0]
    if empty and not dedicated:
        return _shared_by_gpus(tuple(nodes), team_weights)
    if empty:
        raise ValueError(
            f"{len(machines):,} machines apportioned by GPU-hours leave team(s) {', '.join(empty)} without one: "
            "give more machines (--scale) or per-team sizes (--vc-sizes)"
        )
    return Cluster(nodes=tuple(nodes), team_gpus=team_gpus)


def without_topology(cluster: Cluster) -> Cluster:
    """The same GPUs with no node boundaries: one node per GPU type and owner (a team's
    partition, or the shared pool), named f"{gpu_type}-{owner}-all", in the order each first
    appears. A job then fits wherever enough GPUs of its kind are free, as when a simulator
    counts GPUs only."""
    merged: dict[tuple[str, str | None], int] = {}
    for node in cluster.nodes:
        key = (node.gpu_type, node.team)
        merged[key] = merged.get(key, 0) + node.gpus
    nodes = tuple(
        Node(f"{gpu_type}-{team if team is not None else 'shared'}-all", gpus, gpu_type, team)
        for (gpu_type, team), gpus in merged.items()
    )
    return Cluster(nodes=nodes, team_gpus=cluster.team_gpus)
