"""The simulator against numbers known in closed form."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpupool.model import DEFAULT_CLASSES, Config, QueueMode, QueueOrder, Team
from gpupool.sim.engine import Simulation
from gpupool.sim.failures import NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.metrics import summarize
from gpupool.sim.records import SimJob
from tests.support.builders import pool

G = 8
T = 1800.0
R = 60.0
HOUR = 3600.0


def preemption_storm(grace: float, save_cost: float, preemptions: int, seed: int) -> tuple[float, int]:
    """One long low job of G GPUs on a G-GPU pool; high jobs of G GPUs arrive as a Poisson
    stream, each preempting it. Returns the mean lost GPU-seconds per preemption."""
    classes = tuple(replace(c, min_runtime=0.0, grace_period=grace) if c.name == "low" else c for c in DEFAULT_CLASSES)
    rng = random.Random(seed)
    mean_gap = 100 * HOUR  # rare next to T, so the time since the last checkpoint is ~uniform on [0, T)
    jobs = [SimJob("victim", "a", "low", G, 0.0, work=mean_gap * preemptions * 1.2)]
    t = 0.0
    for i in range(int(preemptions * 1.1)):
        t += rng.expovariate(1 / mean_gap)
        jobs.append(SimJob(f"h{i}", "b", "high", G, t, work=60.0))
    model = JobModel({}, T, save_cost=save_cost, restart_cost=R)
    outcome = Simulation(jobs, pool(1, G), Config(classes, max_preemptions=None), model).run()
    victim = next(r for r in outcome.records if r.job.id == "victim")
    lost = victim.wasted + victim.drain + victim.restart
    return lost / victim.preemptions, victim.preemptions


@pytest.mark.slow
def test_lost_work_without_notice_is_half_an_interval_plus_restart() -> None:
    mean, count = preemption_storm(grace=0.0, save_cost=1.0, preemptions=10_000, seed=1)
    assert count >= 10_000
    assert mean == pytest.approx(G * (T / 2 + R), rel=0.02)


@pytest.mark.slow
def test_lost_work_with_an_emergency_save_is_drain_plus_restart() -> None:
    save_cost = 30.0
    mean, count = preemption_storm(grace=60.0, save_cost=save_cost, preemptions=10_000, seed=2)
    assert count >= 10_000
    assert mean == pytest.approx(G * (save_cost + R), rel=0.02)


def node_failure_storm(nodes: int, failures: int, seed: int) -> tuple[float, int, int]:
    """A job of G GPUs on each of `nodes` G-GPU nodes, long enough to see `failures` node
    failures (exponential, mean `mean_up` up, 4 h repair; no spare node, so a job waits for its
    own). Returns the mean lost GPU-seconds per lost attempt, the lost attempts, the failures."""
    mean_up = 100 * HOUR  # rare next to T, as above
    work = mean_up * failures / nodes * 1.2
    jobs = [SimJob(f"j{i}", "a", "low", G, 0.0, work=work) for i in range(nodes)]
    model = JobModel({}, T, save_cost=0.0, restart_cost=R)
    config = Config(DEFAULT_CLASSES, preemption=False, reclaim=False, max_node_losses=10**9)
    failing = NodeFailures(mean_up, 4 * HOUR, seed=seed)
    outcome = Simulation(jobs, pool(nodes, G), config, model, failures=failing).run()
    lost = sum(r.lost_to_nodes for r in outcome.records)
    losses = sum(r.node_losses for r in outcome.records)
    assert lost == pytest.approx(sum(r.wasted + r.drain + r.restart for r in outcome.records))
    return lost / losses, losses, outcome.node_failures


@pytest.mark.slow
def test_lost_work_per_node_failure_is_half_an_interval_plus_restart() -> None:
    """Each failure loses what was done since the last commit (uniform on [0, T)) and the
    restart of the attempt that resumes: G·(T/2 + R), the same as a preemption without notice."""
    mean, losses, failures = node_failure_storm(nodes=50, failures=10_000, seed=3)
    assert losses >= 10_000 and failures >= losses
    assert mean == pytest.approx(G * (T / 2 + R), rel=0.02)


def test_partitioned_utilization_meets_the_bound_of_its_slices() -> None:
    """Each team alone on 8 GPUs: team a offers half its slice, team b twice its slice, team c
    nothing. While jobs arrive, utilization must be Σ min(offered load, slice) / capacity:
    (4 + 8 + 0) / 24, the partitions' loss being team b's excess that c's idle slice cannot take."""
    rng = random.Random(7)
    horizon = 400 * HOUR
    mean_work = 2 * HOUR
    jobs: list[SimJob] = []
    for team, load in (("a", 4.0), ("b", 16.0)):
        t = rng.expovariate(load / mean_work)
        while t < horizon:
            jobs.append(SimJob(f"{team}{len(jobs)}", team, "normal", 1, t, rng.expovariate(1 / mean_work)))
            t += rng.expovariate(load / mean_work)
    nodes = [*pool(1, 8, prefix="a", team="a"), *pool(1, 8, prefix="b", team="b"), *pool(1, 8, prefix="c", team="c")]
    config = Config(
        DEFAULT_CLASSES,
        {t: Team(t, guaranteed_gpus=8) for t in "abc"},
        QueueOrder.FIFO,
        QueueMode.BACKFILL,
        preemption=False,
        reclaim=False,
        explain_waits=False,
    )
    outcome = Simulation(jobs, nodes, config, JobModel({}, T, 30.0, R)).run()
    assert summarize("partitioned", outcome, 30.0)["preemptions"] == 0
    # GPU-seconds allocated before the horizon, from the allocation series.
    allocated = busy = last = 0.0
    for change in sorted(outcome.usage, key=lambda u: u.time):
        if change.time >= horizon:
            break
        allocated += busy * (change.time - last)
        busy, last = busy + change.gpus, change.time
    allocated += busy * (horizon - last)
    # The offered load as drawn (it strays from 4 and 16 by chance), from the inputs alone.
    offered = {t: sum(j.gpus * j.work for j in jobs if j.team == t) / horizon for t in "abc"}
    bound = sum(min(offered[t], 8.0) for t in "abc") / 24
    assert offered["b"] > 8.0
    assert allocated / (24 * horizon) == pytest.approx(bound, abs=0.01)
