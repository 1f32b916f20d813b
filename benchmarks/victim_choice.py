"""How often the greedy victim search is not the cheapest sufficient set, and by how much.

Random small pools (1-4 nodes of 2, 4 or 8 GPUs, up to 8 running jobs of random classes,
starts and checkpoints; one waiting job of a preempting class that fits on one node), decided
by `decide` and by the exhaustive search of `gpupool.policy.reference`. Prints how many
decisions preempted, how many chose a set other than the cheapest, and the lost work the
greedy choice costs over the cheapest. The cheapest is by the search's own score: the victims'
classes highest first (so at equal classes, fewer victims), then lost work, then count.
Run: .venv/bin/python -m benchmarks.victim_choice [--cases 20000] [--seed 7]
"""

from __future__ import annotations

import argparse
import random

from gpupool.model import DEFAULT_CLASSES, Allocation, Config, Job, Node, RunningJob, Snapshot
from gpupool.policy import PoolState, decide
from gpupool.policy.reference import cheapest_victims, set_cost
from tests.support.builders import BATCH_CLASSES

NOW = 5_000.0
CONFIG = Config(DEFAULT_CLASSES, max_preemptions=None)
CLASSES = list(BATCH_CLASSES)


def pool(rng: random.Random) -> tuple[Snapshot, Job]:
    nodes = [Node(f"n{i}", rng.choice([2, 4, 8])) for i in range(rng.randint(1, 4))]
    free = {n.name: list(range(n.gpus)) for n in nodes}
    running = []
    for i in range(rng.randint(1, 8)):
        job = Job(f"r{i}", "a", rng.choice(CLASSES), rng.choice([1, 1, 2, 3, 4, 8]), 0.0)
        placement, left = [], job.gpus
        for node in nodes:
            take = free[node.name][: min(left, len(free[node.name]))]
            if take:
                placement.append(Allocation(node.name, tuple(take)))
                left -= len(take)
            if not left:
                break
        if left:
            continue
        for alloc in placement:
            del free[alloc.node][: len(alloc.gpus)]
        started = rng.uniform(0, NOW - 700)
        checkpoint = rng.choice([None, rng.uniform(started, NOW)])
        running.append(RunningJob(job, tuple(placement), started, checkpoint))
    pending = Job("p", "b", rng.choice(["urgent", "high", "normal"]), rng.randint(1, max(n.gpus for n in nodes)), NOW)
    return Snapshot(nodes, running, [pending]), pending


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    preempted = differ = more_victims = 0
    excess: list[float] = []
    best_total = 0.0
    for _ in range(args.cases):
        snapshot, job = pool(rng)
        plan = decide(PoolState.of(snapshot), CONFIG, NOW)
        best = cheapest_victims(job, snapshot, CONFIG, NOW)
        if best is None or not plan.preemptions:
            continue
        preempted += 1
        running = {r.job.id: r for r in snapshot.running}
        greedy = set_cost([running[p.victim] for p in plan.preemptions], CONFIG, NOW)
        best_total += best[0][1]
        if greedy != best[0]:
            differ += 1
            more_victims += greedy[2] > best[0][2]
            excess.append(greedy[1] - best[0][1])
    print(f"{args.cases:,} random small pools, {preempted:,} decisions that preempted")
    print(f"greedy set other than the cheapest: {differ:,} ({differ / max(preempted, 1):.1%})")
    if excess:
        worse = [e for e in excess if e > 1e-6]
        print(f"  with more victims of the same classes: {more_victims:,}")
        print(
            f"  with more lost work: {len(worse):,}"
            + (f", by {sum(worse) / len(worse):,.0f} GPU-s on average" if worse else "")
            + f"; lost work over the cheapest sets' in all: {sum(excess) / best_total:+.3%}"
        )


if __name__ == "__main__":
    main()
