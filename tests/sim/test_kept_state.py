"""The state the simulator feeds event by event (free GPUs and their buckets, team GPUs,
drains, the line, the running index) is, at every decision, what its running and pending jobs
give, and the core decides on it as on the reference built anew from those jobs alone: with
preemption, gangs, GPU types, dedicated nodes, seniority and node failures."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from gpupool.model import DEFAULT_CLASSES, Config, ElasticPolicy, FairShare, Job, Node, Plan, QueueMode, Snapshot, Team
from gpupool.policy import PoolState, can_ever_fit, decide
from gpupool.sim.elastic import sizes_of
from gpupool.sim.engine import Simulation
from gpupool.sim.failures import Distribution, NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.records import SimJob
from tests.support.builders import BATCH_CLASSES
from tests.support.oracle import assert_index_matches, derived_free, reference_state

CONFIGS = (
    # Unexplained waits, as the simulator's replays have them: the queue pass may stop early.
    Config(
        DEFAULT_CLASSES, {"a": Team("a", guaranteed_gpus=8), "b": Team("b", guaranteed_gpus=4)}, explain_waits=False
    ),
    Config(DEFAULT_CLASSES, fair_share=FairShare.PREEMPT, seniority_after=900.0, queue=QueueMode.STRICT),
    Config(DEFAULT_CLASSES, preemption=False, reclaim=False, explain_waits=False),
    Config(DEFAULT_CLASSES, explain_waits=False, elastic=ElasticPolicy(min_time_at_size=300.0)),
)


def workload(seed: int) -> tuple[list[SimJob], list[Node]]:
    rng = random.Random(seed)
    nodes = [
        Node(f"n{i}", rng.choice([2, 4, 8]), rng.choice(["A", "B"]), "a" if i == 0 and seed % 2 else None)
        for i in range(rng.randint(2, 6))
    ]
    classes = list(BATCH_CLASSES)
    jobs = []
    for i in range(rng.randint(20, 60)):
        gpus = rng.choice([1, 1, 2, 4, 8, 12])
        job = SimJob(
            f"j{i}",
            rng.choice("ab"),
            rng.choice(classes),
            gpus,
            float(rng.randrange(0, 20_000, 50)),
            float(rng.randrange(100, 6_000, 50)),
            rng.choice([None, None, "A", "B"]),
        )
        # A third of the seeds have elastic jobs, which shrink, grow and resize.
        if seed % 3 == 0 and rng.random() < 0.5:
            members = 4 if gpus == 12 and rng.random() < 0.5 else None  # a gang, by whole members
            job = replace(job, gpus_per_node=members, sizes=sizes_of(gpus, members))
        jobs.append(job)
    return jobs, nodes


def checking(checked: Counter[str]):  # type: ignore[no-untyped-def]
    def check(state: PoolState, config: Config, now: float) -> Plan:
        # Decided first: the state must bring the checkpoints up to date itself (its
        # `follow_commits`), before anything reads the running jobs.
        plan = decide(state, config, now)
        checked["indexed"] += state._index is not None
        index = state.index  # built now if the decision did not need it; commits followed
        running = list(state.running.values())
        snapshot = Snapshot(state.nodes, running, list(state.line), state.usage, state.teams)
        assert_index_matches(index, running)
        assert dict(state.free) == derived_free(snapshot)
        for group, buckets in state.free.buckets.items():
            for count, nodes in enumerate(buckets):
                in_group = [i for i, n in enumerate(state.nodes) if (n.gpu_type, n.team) == group]
                assert nodes == [i for i in in_group if len(state.free.free[i]) == count], "bucket order"
        teams = Counter[str]()
        for r in running:
            if r.notice is None:
                teams[r.job.team] += r.job.gpus
            else:  # what a resize keeps, or grows into
                teams[r.job.team] += sum(len(a.gpus) for a in r.notice.keep)
        assert dict(state.team_gpus) == dict(+teams)
        assert sorted(state.draining) == sorted(r.job.id for r in running if r.notice)
        up = {node.name for node in state.nodes}
        assert all(a.node in up for r in running for a in r.placement), "a job on a node that is out"
        assert plan == decide(reference_state(snapshot), config, now)
        checked["decisions"] += 1
        checked["notices"] += len(plan.preemptions)
        checked["resizes"] += sum(1 for p in plan.preemptions if p.keep) + len(plan.grows)
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
        )
        outcome = sim.run()
        for r in outcome.records:
            fits = can_ever_fit(Job(r.job.id, r.job.team, "low", r.job.gpus, 0.0, gpu_type=r.job.gpu_type), nodes)
            assert r.finish is not None or r.failed or not fits, f"{r.job} neither ended nor can ever fit"
        checked["lost"] += sum(r.node_losses for r in outcome.records)
    assert checked["decisions"] > 50 and checked["lost"] > 0 and checked["indexed"] > 0
    assert checked["resizes"] > 0 or seed % 3
