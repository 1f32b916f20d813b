"""Core decision throughput on a large pool.

By default 1,000 nodes × 8 GPUs (`--nodes`); 10 pending gang jobs per node (`--pending`) with
Philly's GPU-count mix; 3 priority classes; 10 teams. Two phases:

  fill    the pool starts empty; `decide` runs cycle after cycle, each start becoming a
          running job, until a cycle starts nothing. Placements/s = starts / time in decide.
  storm   the pool is full and the backlog still pending; high-priority jobs arrive one by
          one (`--arrivals`, 200), each cycle preempting for it; victims release before the
          next arrival.

Prints placements/s, the p50/p99 decision cycle and the p50/p99 victim search, for the default
policy and, in the same run on the same workload, with `priority_preemption: above_guarantee`
and `fair_share: preempt`, then with `seniority_after: 2h` too (`--policy N`: only the N-th).
Each is decided twice: on the state a driver keeps between decisions (`policy.PoolState`, fed
event by event), and on a state built anew from the jobs at every decision, as a driver that
kept nothing would (`--only` one of them; the build is timed with the decision). The pauses of
Python's full (generation 2) garbage collections that fall inside decisions are counted apart:
they depend on everything the process holds, not on the core alone; the driver moves what it
keeps out of the collector's sight once the pool is full (`gc.freeze`), as the simulator and
the live loop do.
Run: .venv/bin/python -m benchmarks.decision_throughput [--nodes 10000 --arrivals 50]
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpupool.model import (
    Config,
    FairShare,
    Job,
    Node,
    Plan,
    PriorityClass,
    PriorityScope,
    RunningJob,
    Snapshot,
    Team,
)
from gpupool.policy import PoolState, decide
from gpupool.policy.preempt import search

GPUS = 8
TEAMS = [f"team-{i}" for i in range(10)]
CLASSES = (
    PriorityClass("high", 100, may_preempt=True, preemptible=False),
    PriorityClass("normal", 10, may_preempt=True, preemptible=True, min_runtime=0.0),
    PriorityClass("low", 0, may_preempt=False, preemptible=True, min_runtime=0.0),
)
# GPUs per job in Philly's jobs.csv (counts per size, 82,247 jobs).
PHILLY_SIZES = {1: 76627, 2: 1818, 4: 1870, 8: 1643, 16: 199, 32: 67, 64: 6, 128: 3}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def workload(rng: random.Random, pending: int) -> list[Job]:
    sizes = list(PHILLY_SIZES)
    weights = list(PHILLY_SIZES.values())
    jobs = []
    for i in range(pending):
        gpus = rng.choices(sizes, weights)[0]
        cls = rng.choices(["normal", "low"], [0.55, 0.45])[0]
        jobs.append(Job(f"j{i}", rng.choice(TEAMS), cls, gpus, float(i), gpus_per_node=8 if gpus > 8 else None))
    return jobs


def timed_victim_search(samples: list[float]) -> Callable[..., Any]:
    original = search.find_victims

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            samples.append(time.perf_counter() - began)

    return wrapper


class Pool:
    """The benchmark's driver: it keeps the pool's `PoolState` and carries plans out on it,
    then at once as a fast pool would: every started job commits a checkpoint as it starts,
    victims drain instantly and go back in line, and preemptors take the GPUs held for them."""

    def __init__(self, nodes: list[Node], pending: dict[str, Job], kept: bool) -> None:
        self.state = PoolState(nodes)
        for job in pending.values():
            self.state.queue(job)
        self.kept = kept

    def arrive(self, job: Job) -> None:
        self.state.queue(job)

    def decide(self, config: Config, now: float) -> tuple[Plan, float]:
        """The plan, and the seconds it took (with building the state anew, when not `kept`)."""
        began = time.perf_counter()
        state = self.state
        if not self.kept:
            state = PoolState.of(Snapshot(state.nodes, list(state.running.values()), list(state.line)))
        plan = decide(state, config, now)
        return plan, time.perf_counter() - began

    def apply(self, plan: Plan, now: float) -> None:
        state = self.state
        state.apply(plan, now)
        for start in plan.starts:
            state.checkpoint(start.job, now)
        for p in plan.preemptions:
            victim = state.end(p.victim)
            assert victim is not None
            state.queue(replace(victim.job, preemptions=victim.job.preemptions + 1))
        for wait in plan.waits:
            if wait.placement:
                job = replace(state.line.jobs[wait.job], nominated=False)
                state.unqueue(job.id)
                state.start(RunningJob(job, wait.placement, now, now))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of 8 GPUs (default 1000)")
    parser.add_argument("--pending", type=int, default=None, help="pending jobs (default 10 per node)")
    parser.add_argument("--arrivals", type=int, default=200, help="high-priority arrivals (default 200)")
    parser.add_argument("--policy", type=int, choices=(1, 2, 3), default=None, help="only the n-th policy")
    parser.add_argument("--only", choices=("snapshot", "kept"), default=None, help="only one way of deciding")
    args = parser.parse_args()
    scale = Scale(args.nodes, args.pending if args.pending is not None else 10 * args.nodes, args.arrivals)
    teams = {t: Team(t, weight=1.0, guaranteed_gpus=scale.nodes * GPUS // len(TEAMS)) for t in TEAMS}
    base = Config(CLASSES, teams, explain_waits=False, max_preemptions=None)
    fair = replace(base, priority_preemption=PriorityScope.ABOVE_GUARANTEE, fair_share=FairShare.PREEMPT)
    senior = replace(fair, seniority_after=7200.0)
    policies = [
        ("default policy", base),
        ("above_guarantee + fair_share: preempt", fair),
        ("above_guarantee + fair_share: preempt + seniority_after: 2h", senior),
    ]
    print(f"{scale.nodes:,} nodes x {GPUS} GPUs, {scale.pending:,} pending, {scale.arrivals} arrivals")
    for n, (label, config) in enumerate(policies, 1):
        if args.policy in (None, n):
            for kept in [k for k in (False, True) if args.only in (None, "kept" if k else "snapshot")]:
                how = "on the kept state" if kept else "on a state built anew from the jobs"
                print(f"--- {label}; {how}")
                measure(config, scale, kept)
    # Everything the process held at its peak: the jobs, the snapshots and the kept state, an
    # upper bound of the core's state (run with --only kept --policy 1 for that way alone).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory of this process: {peak:,.0f} MiB")


@dataclass(frozen=True)
class Scale:
    nodes: int
    pending: int
    arrivals: int


class CollectorPauses:
    """The time the cyclic garbage collector stops the program, as `gc.callbacks` see it: a
    decision pays for the pauses that fall inside it, whoever made the garbage."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0
        self._began = 0.0

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif info["generation"] == 2:
            self.total += time.perf_counter() - self._began
            self.count += 1


def measure(config: Config, scale: Scale, kept: bool) -> None:
    rng = random.Random(42)
    nodes = [Node(f"n{i:05d}", GPUS) for i in range(scale.nodes)]
    pool = Pool(nodes, {j.id: j for j in workload(rng, scale.pending)}, kept)
    now = 1000.0
    gc.collect()
    gc.freeze()  # the workload lives to the end, as the simulator's does (see sim/engine.py)

    # 1. Fill an empty pool, then let normal jobs preempt low ones until nothing moves.
    fill_cycles: list[float] = []
    placed = fill_starts = 0
    while True:
        plan, seconds = pool.decide(config, now)
        fill_cycles.append(seconds)
        placed += len(plan.starts)
        if len(fill_cycles) == 1:
            fill_starts = len(plan.starts)
        if not plan.starts and not plan.preemptions:
            break
        pool.apply(plan, now)
    # What the driver keeps lives on: out of the cyclic collector's sight, as the simulator
    # and the live loop put theirs (its full passes over 60,000 jobs pause a decision ~100 ms).
    gc.freeze()
    used = sum(r.job.gpus for r in pool.state.running.values())
    print(f"fill: {placed:,} placements ({used:,} of {scale.nodes * GPUS:,} GPUs busy) in {len(fill_cycles)} cycles")
    first = fill_cycles[0]
    print(f"      first cycle: {fill_starts:,} placed at {fill_starts / first:,.0f}/s ({first * 1e3:.0f} ms)")

    # 2. A stream of high-priority arrivals into the full pool, the backlog still pending.
    searches: list[float] = []
    collected = 0
    untimed = search.find_victims
    search.find_victims = timed_victim_search(searches)
    storm_cycles: list[float] = []
    without_pauses: list[float] = []
    preempted = 0
    pauses = CollectorPauses()
    for i in range(scale.arrivals):
        now += 60.0
        gpus = rng.choices([1, 2, 4, 8, 16], [40, 15, 15, 25, 5])[0]
        urgent = Job(f"h{i}", rng.choice(TEAMS), "high", gpus, now, gpus_per_node=8 if gpus > 8 else None)
        pool.arrive(urgent)
        paused, count = pauses.total, pauses.count
        with pauses:
            plan, seconds = pool.decide(config, now)
            storm_cycles.append(seconds)
        without_pauses.append(storm_cycles[-1] - (pauses.total - paused))
        if pauses.count > count:
            collected += 1
        preempted += len(plan.preemptions)
        pool.apply(plan, now)
    print(
        f"storm: {scale.arrivals} high-priority arrivals, {preempted} preemptions, "
        f"{len(pool.state.line):,} jobs still pending"
    )
    print(
        f"       decision cycle p50 {statistics.median(storm_cycles) * 1e3:.1f} ms, "
        f"p99 {percentile(storm_cycles, 0.99) * 1e3:.1f} ms"
    )
    print(
        f"       full collections inside {collected} cycles ({pauses.total * 1e3:.0f} ms in all); "
        f"without them p50 {statistics.median(without_pauses) * 1e3:.1f} ms, "
        f"p99 {percentile(without_pauses, 0.99) * 1e3:.1f} ms"
    )
    print(
        f"       victim search ({len(searches)} calls) p50 {statistics.median(searches) * 1e3:.1f} ms, "
        f"p99 {percentile(searches, 0.99) * 1e3:.1f} ms"
    )
    search.find_victims = untimed
    all_cycles = fill_cycles + storm_cycles
    print(f"all cycles: p99 {percentile(all_cycles, 0.99) * 1e3:.1f} ms over {len(all_cycles)} cycles")
    gc.unfreeze()


if __name__ == "__main__":
    main()
