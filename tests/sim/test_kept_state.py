"""The state the simulator keeps between decisions (free GPUs and their buckets, team GPUs,
drains, the running index) is, at every decision, what the core would derive from the running jobs, and the core
decides the same on it as on a snapshot without it: with preemption, gangs, GPU types,
dedicated nodes, seniority and node failures."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from gpupool.model import DEFAULT_CLASSES, Config, FairShare, Job, Node, Plan, QueueMode, Snapshot, Team
from gpupool.policy import can_ever_fit, decide
from gpupool.policy.place import FreeGpus
from gpupool.policy.running import assert_matches
from gpupool.sim.engine import Simulation
from gpupool.sim.failures import Distribution, NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.records import SimJob

CONFIGS = (
    # Unexplained waits, as the simulator's replays have them: the queue pass may stop early.
    Config(
        DEFAULT_CLASSES, {"a": Team("a", guaranteed_gpus=8), "b": Team("b", guaranteed_gpus=4)}, explain_waits=False
    ),
    Config(DEFAULT_CLASSES, fair_share=FairShare.PREEMPT, seniority_after=900.0, queue=QueueMode.STRICT),
    Config(DEFAULT_CLASSES, preemption=False, reclaim=False, explain_waits=False),
)


def workload(seed: int) -> tuple[list[SimJob], list[Node]]:
    rng = random.Random(seed)
    nodes = [
        Node(f"n{i}", rng.choice([2, 4, 8]), rng.choice(["A", "B"]), "a" if i == 0 and seed % 2 else None)
        for i in range(rng.randint(2, 6))
    ]
    classes = [c.name for c in DEFAULT_CLASSES]
    jobs = [
        SimJob(
            f"j{i}",
            rng.choice("ab"),
            rng.choice(classes),
            rng.choice([1, 1, 2, 4, 8, 12]),
            float(rng.randrange(0, 20_000, 50)),
            float(rng.randrange(100, 6_000, 50)),
            rng.choice([None, None, "A", "B"]),
        )
        for i in range(rng.randint(20, 60))
    ]
    return jobs, nodes


def checking(checked: Counter[str]):  # type: ignore[no-untyped-def]
    def check(snapshot: Snapshot, config: Config, now: float) -> Plan:
        # Decided first: the running index must bring the checkpoints up to date itself (its
        # `refresh`), before anything reads the running jobs.
        plan = decide(snapshot, config, now)
        running = list(snapshot.running)
        scratch = replace(
            snapshot, running=running, free=None, team_gpus=None, draining=None, running_index=None, pending_index=None
        )
        assert snapshot.pending_index is not None
        assert snapshot.pending_index.jobs == {job.id: job for job in snapshot.pending}
        if snapshot.running_index is not None:
            checked["indexed"] += 1
            assert_matches(snapshot.running_index, running)
        kept, derived = FreeGpus(snapshot.nodes, running, snapshot.free), FreeGpus(scratch.nodes, running)
        assert kept.free == derived.free
        for group, buckets in derived.buckets.items():
            assert [list(b) for b in kept.buckets[group]] == [list(b) for b in buckets], "bucket order"
        teams = Counter[str]()
        for r in running:
            if r.notice is None:
                teams[r.job.team] += r.job.gpus
        assert dict(snapshot.team_gpus or {}) == dict(teams)
        assert sorted(r.job.id for r in snapshot.draining or ()) == sorted(r.job.id for r in running if r.notice)
        up = {node.name for node in snapshot.nodes}
        assert all(a.node in up for r in running for a in r.placement), "a job on a node that is out"
        assert plan == decide(scratch, config, now)
        checked["decisions"] += 1
        checked["notices"] += len(plan.preemptions)
        return plan

    return check


@pytest.mark.parametrize("seed", range(12))
def test_the_kept_state_is_what_the_running_jobs_give(seed: int) -> None:
    jobs, nodes = workload(seed)
    checked: Counter[str] = Counter()
    for config in CONFIGS:
        failures = NodeFailures(
            random.Random(seed).choice([1500.0, 5000.0]),
            random.Random(seed + 1).choice([0.0, 300.0]),
            Distribution.CONSTANT if seed % 2 else Distribution.EXPONENTIAL,
            seed,
        )
        sim = Simulation(
            jobs,
            nodes,
            config,
            JobModel({}, 600.0, 10.0, 30.0),
            decide=checking(checked),
            failures=failures,
            running_index_from=0,
        )
        outcome = sim.run()
        for r in outcome.records:
            fits = can_ever_fit(Job(r.job.id, r.job.team, "low", r.job.gpus, 0.0, gpu_type=r.job.gpu_type), nodes)
            assert r.finish is not None or r.failed or not fits, f"{r.job} neither ended nor can ever fit"
        checked["lost"] += sum(r.node_losses for r in outcome.records)
    assert checked["decisions"] > 50 and checked["lost"] > 0 and checked["indexed"] > 0
