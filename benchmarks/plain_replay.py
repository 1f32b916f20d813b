"""The simulator against its floor: a plain Python heap loop of the same semantics.

Philly's jobs of October and November 2017 on the 11 VCs' partitions (`partitioned`, strict
queues, no checkpoints): every job waits for its team's earlier jobs, then takes the node with
the fewest free GPUs that holds it. `floor` replays that with nothing but a heap, a deque per
team and a list of free GPUs per node; the simulator replays it through the scheduling core. The
two must start every job at the same instant (checked), and the simulator's time is printed as a
multiple of the floor's, best of `--repeat` runs each, alternating, in one process.

Run: .venv/bin/python -m benchmarks.plain_replay [--traces ../shared/data/traces] [--repeat 3]
"""

from __future__ import annotations

import argparse
import heapq
import math
import time
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from gpupool.model import Node, QueueMode
from gpupool.sim.cluster import load_vc_sizes
from gpupool.sim.engine import Simulation
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.records import SimJob
from gpupool.sim.replay import ClusterSpec, Policy, Settings, admissible, build_cluster, policy_config
from gpupool.sim.trace import load_trace

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def members(gpus: int, size: int) -> list[int]:
    """A job's GPUs per node on nodes of `size` GPUs: one node if it fits, else whole nodes and
    the rest on one more (the core's `gang_shapes` on equal nodes)."""
    if gpus <= size:
        return [gpus]
    whole, rest = divmod(gpus, size)
    return [size] * whole + ([rest] if rest else [])


def floor(jobs: Sequence[SimJob], nodes: Sequence[Node]) -> dict[str, float]:
    """Every job's start, by a heap loop: releases, then arrivals, then one pass over each team's
    line at each instant where something happened. A decision prefers, among the nodes of the
    fewest sufficient free GPUs, those it has not changed yet (in node order), then those it has
    (in the order it changed them), as the core's working copy of the free GPUs does."""
    free = [node.gpus for node in nodes]
    team_nodes: dict[str | None, list[int]] = {}
    for i, node in enumerate(nodes):
        team_nodes.setdefault(node.team, []).append(i)
    size = {team: nodes[i].gpus for team, listed in team_nodes.items() for i in listed}
    arrivals = sorted(range(len(jobs)), key=lambda k: (jobs[k].submit, k))
    lines: dict[str, deque[int]] = {team: deque() for team in team_nodes if team is not None}
    heap: list[tuple[float, int, tuple[int, ...]]] = []
    starts: dict[str, float] = {}
    seq = 0
    next_arrival = 0
    waiting = 0
    while heap or next_arrival < len(arrivals):
        now = heap[0][0] if heap else math.inf
        if next_arrival < len(arrivals):
            now = min(now, jobs[arrivals[next_arrival]].submit)
        while heap and heap[0][0] == now:
            _, _, held = heapq.heappop(heap)
            for i in held:
                free[i] += 1
        while next_arrival < len(arrivals) and jobs[arrivals[next_arrival]].submit == now:
            k = arrivals[next_arrival]
            lines[jobs[k].team].append(k)
            next_arrival += 1
            waiting += 1
        if not waiting:
            continue
        changed: dict[int, int] = {}
        moves = 0
        for team, line in lines.items():
            while line:
                job = jobs[line[0]]
                chosen = _best_fit(members(job.gpus, size[team]), team_nodes[team], free, changed)
                if chosen is None:
                    break
                line.popleft()
                waiting -= 1
                gpus: list[int] = []
                for i, want in chosen:
                    free[i] -= want
                    moves += 1
                    changed[i] = moves
                    gpus += [i] * want
                starts[job.id] = now
                seq += 1
                heapq.heappush(heap, (now + job.work, seq, tuple(gpus)))
    return starts


def _best_fit(
    want: list[int], candidates: list[int], free: list[int], changed: dict[int, int]
) -> list[tuple[int, int]] | None:
    chosen: list[tuple[int, int]] = []
    used: set[int] = set()
    for gpus in want:
        best: tuple[int, int, int, int] | None = None
        for i in candidates:
            have = free[i]
            if have < gpus or i in used:
                continue
            key = (have, 1, changed[i], i) if i in changed else (have, 0, i, i)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        used.add(best[3])
        chosen.append((best[3], gpus))
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    trace = load_trace(args.traces / "philly" / "jobs.csv", start=datetime(2017, 10, 1), end=datetime(2017, 12, 1))
    spec = ClusterSpec(load_vc_sizes(args.traces / "philly" / "vc_sizes.csv"))
    settings = Settings(JobModel({}, math.inf, 30.0, 60.0), queue=QueueMode.STRICT, trace_failures=True)
    cluster = build_cluster(trace, spec, Policy.PARTITIONED)
    jobs, _, _ = admissible(trace, cluster, settings)
    config = policy_config(Policy.PARTITIONED, cluster, settings)
    best_floor = best_sim = math.inf
    for _ in range(args.repeat):
        began = time.perf_counter()
        starts = floor(jobs, cluster.nodes)
        best_floor = min(best_floor, time.perf_counter() - began)
        began = time.perf_counter()
        outcome = Simulation(jobs, cluster.nodes, config, settings.model).run()
        best_sim = min(best_sim, time.perf_counter() - began)
    simulated = {r.job.id: r.first_start for r in outcome.records}
    differ = [j.id for j in jobs if simulated[j.id] != starts.get(j.id)]
    print(
        f"{len(jobs):,} jobs on {sum(n.gpus for n in cluster.nodes):,} GPUs in {len(cluster.nodes)} partitioned nodes"
    )
    print(f"floor (heap loop)  {best_floor:6.2f} s")
    print(f"simulator          {best_sim:6.2f} s   {best_sim / best_floor:4.1f}x the floor")
    print(f"starts that differ: {len(differ)}" + (f" (first: job {differ[0]})" if differ else ""))
    if differ:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
