"""The plans the core makes for seeded random pools, one per line, to compare two commits.

A change that must not change behaviour (a refactor, a speed-up) is checked by running this on
both commits and comparing the files: every plan, its words included, must be the same. The
pools are those of the core's property tests, and busy ones (full nodes of small jobs of every
class and age, a few jobs that must preempt), under random policies (scopes, fair share,
seniority, placement, strict queues, FIFO, explanation depths), each decided with the teams from
the configuration and with the teams as a driver's store gives them. Runs on the code before
issue 32 too (where `decide` took a `Snapshot`).

Run: .venv/bin/python -m benchmarks.same_decisions --out after.txt
     git worktree add /tmp/before REV    # the other commit: its code, this script
     PYTHONPATH=/tmp/before/src .venv/bin/python benchmarks/same_decisions.py --out before.txt
     cmp before.txt after.txt
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpupool.model import (
    DEFAULT_CLASSES,
    Allocation,
    Config,
    FairShare,
    Job,
    Node,
    Notice,
    PlacementRule,
    Plan,
    PriorityBudget,
    PriorityScope,
    QueueMode,
    QueueOrder,
    RunningJob,
    Snapshot,
    Team,
)
from tests.support.builders import BATCH_CLASSES, packed

NOW = 5000.0
TEAMS = ("a", "b", "c")
CLASSES = BATCH_CLASSES
Case = tuple[Snapshot, Config]


def deciding() -> Callable[[Snapshot, Config, float], Plan]:
    """The core's `decide` as a function of a snapshot, on either side of issue 32."""
    from gpupool import policy

    if hasattr(policy, "PoolState"):
        return lambda snapshot, config, now: policy.decide(policy.PoolState.of(snapshot), config, now)
    return policy.decide  # type: ignore[return-value]


def job(rng: random.Random, job_id: str) -> Job:
    gpus = rng.choice([1, 1, 2, 4, 8, 12, 16])
    member = rng.choice([1, 2, 4])
    per_node = rng.choice([None, None, member]) if gpus % member == 0 else None
    return Job(
        job_id,
        rng.choice(TEAMS),
        rng.choice(CLASSES),
        gpus,
        rng.uniform(0, NOW),
        gpus_per_node=per_node,
        gpu_type=rng.choice([None, None, "v100", "h100"]),
        preemptions=rng.randint(0, 4),
        max_preemptions=rng.choice([None, None, 0, 2]),
        expected_restart=rng.uniform(0, 120),
        queued_at=rng.choice([None, rng.uniform(0, NOW)]),
        order=rng.randint(0, 3),
        nominated=rng.random() < 0.1,
    )


def config_of(rng: random.Random, teams: dict[str, Team]) -> Config:
    return Config(
        DEFAULT_CLASSES,
        teams,
        order=rng.choice([QueueOrder.PRIORITY] * 4 + [QueueOrder.FIFO]),
        queue=rng.choice([QueueMode.BACKFILL] * 3 + [QueueMode.STRICT]),
        reclaim=rng.random() < 0.8,
        max_preemptions=rng.choice([None, 1, 3]),
        priority_preemption=rng.choice(list(PriorityScope)),
        fair_share=rng.choice(list(FairShare)),
        seniority_after=rng.choice([None, 0.0, 1000.0]),
        placement=rng.choice(list(PlacementRule)),
        explain_waits=rng.random() < 0.85,
        explain_depth=rng.choice([None, None, 2, 5]),
    )


def teams_of(rng: random.Random) -> dict[str, Team]:
    budgets = (PriorityBudget("high", 1.0, 3600.0),)
    return {t: Team(t, rng.choice([1.0, 2.0]), rng.randint(0, 8), budgets if rng.random() < 0.5 else ()) for t in TEAMS}


def random_pool(rng: random.Random) -> Case:
    """Up to six nodes of two GPU types (some dedicated), running jobs, drains, pending jobs."""
    nodes = [
        Node(f"n{i}", rng.choice([2, 4, 8]), rng.choice(["v100", "h100"]), rng.choice([None, None, None, "a"]))
        for i in range(rng.randint(1, 6))
    ]
    free = {n.name: list(range(n.gpus)) for n in nodes}
    pending = [job(rng, f"p{i}") for i in range(rng.randint(0, 10))]
    running = []
    for i in range(rng.randint(0, 14)):
        j = replace(job(rng, f"r{i}"), nominated=False)
        placement = packed(j, nodes, free)
        if placement is None:
            continue
        started = rng.uniform(0, NOW)
        checkpoint = rng.choice([None, rng.uniform(started, NOW)])
        notice = None
        if pending and rng.randint(0, 4) == 0:
            for_job = rng.choice(pending).id if rng.random() < 0.85 else "gone"
            notice = Notice(for_job, NOW + rng.uniform(0, 100))
        running.append(RunningJob(j, placement, started, checkpoint, notice, rng.choice([None, None, None, *CLASSES])))
    teams = teams_of(rng)
    usage = {(t, "high"): rng.choice([0.0, 7200.0]) for t in TEAMS}
    return Snapshot(nodes, running, pending, usage), config_of(rng, teams)


def busy_pool(rng: random.Random) -> Case:
    """Full 8-GPU nodes of small jobs of every class and age, and a few jobs that must preempt."""
    nodes = [Node(f"n{i}", 8) for i in range(rng.randint(2, 10))]
    running = []
    for node in nodes:
        gpu = 0
        while gpu < 8:
            gpus = min(rng.choice([1, 2, 4]), 8 - gpu)
            j = replace(job(rng, f"r{node.name}-{gpu}"), gpus=gpus, gpus_per_node=None, gpu_type=None, nominated=False)
            started = rng.choice([0.0, 1000.0, 2000.0, 4000.0])
            placement = (Allocation(node.name, tuple(range(gpu, gpu + gpus))),)
            running.append(RunningJob(j, placement, started, rng.choice([None, started, NOW])))
            gpu += gpus
    pending = []
    for i in range(rng.randint(1, 5)):
        gpus = rng.choice([1, 2, 4, 8, 16])
        pending.append(replace(job(rng, f"p{i}"), gpus=gpus, gpus_per_node=8 if gpus > 8 else None, gpu_type=None))
    teams = teams_of(rng)
    usage = {(t, "high"): rng.choice([0.0, 7200.0]) for t in TEAMS}
    return Snapshot(nodes, running, pending, usage), config_of(rng, teams)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=3000, help="random pools (default 3000)")
    parser.add_argument("--seed", type=int, default=20261205)
    parser.add_argument("--out", type=Path, required=True, help="file for the plans, one per line")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    decide = deciding()
    lines = []
    for n in range(args.cases):
        snapshot, config = (busy_pool if n % 3 == 2 else random_pool)(rng)
        for teams in (snapshot.teams, config.teams):
            try:
                lines.append(repr(decide(replace(snapshot, teams=teams), config, NOW)))
            except ValueError as exc:
                lines.append(f"ValueError: {exc}")
    args.out.write_text("\n".join(lines) + "\n")
    preempting = sum("Preempt(" in line for line in lines)
    print(f"{len(lines):,} plans of {args.cases:,} pools ({preempting:,} with notices) written to {args.out}")


if __name__ == "__main__":
    main()
