"""The simulator's event loop, told as a log of what the scheduler decided."""

from __future__ import annotations

import random

from gpupool.model import DEFAULT_CLASSES, Config, Plan, Team
from gpupool.sim.engine import SimJob, Simulation
from gpupool.sim.jobmodel import JobModel
from gpupool.testing import pool

MODEL = JobModel({}, default_interval=100.0, save_cost=5.0, restart_cost=10.0)


DEFAULTS = Config(DEFAULT_CLASSES)


def replay(jobs: list[SimJob], config: Config = DEFAULTS, gpus: int = 4) -> tuple[list[tuple[object, ...]], Simulation]:
    log: list[tuple[object, ...]] = []

    def record(now: float, plan: Plan) -> None:
        log.extend((now, "preempt", p.victim, p.for_job) for p in plan.preemptions)
        log.extend((now, "start", s.job) for s in plan.starts)

    sim = Simulation(jobs, pool(1, gpus), config, MODEL, on_plan=record)
    sim.run()
    return log, sim


def test_a_high_job_preempts_a_low_one_which_saves_and_resumes_later() -> None:
    log, sim = replay([SimJob("low", "a", "low", 4, 0.0, 1000.0), SimJob("high", "b", "high", 4, 300.0, 50.0)])
    # Notice at 300; the emergency save takes 5 s; high runs 300+5 .. 355; low resumes then.
    assert log == [
        (0.0, "start", "low"),
        (300.0, "preempt", "low", "high"),
        (305.0, "start", "high"),
        (355.0, "start", "low"),
    ]
    low = next(r for r in sim.live.values() if r.record.job.id == "low").record
    assert low.preemptions == 1
    assert low.drain == 4 * 5.0
    assert low.restart == 4 * 10.0
    assert low.wasted == 0.0
    # 1000 s of work, 2 saves before the notice and 1 emergency save, 10 s restore, 7 more saves after it.
    assert low.finish == 355.0 + 10.0 + (1000.0 - 290.0) + 7 * 5.0


def test_a_job_that_finishes_during_its_drain_succeeds() -> None:
    # At 255 the job has 3 s of work left (and no save before its end): it ends at 258,
    # before its emergency save would (260).
    log, sim = replay([SimJob("low", "a", "low", 4, 0.0, 248.0), SimJob("high", "b", "high", 4, 255.0, 50.0)])
    low = next(r for r in sim.live.values() if r.record.job.id == "low").record
    assert low.finish == 258.0
    assert low.preemptions == 0
    assert log[-1] == (258.0, "start", "high")


def test_backfill_and_priority_order_on_a_busy_pool() -> None:
    jobs = [
        SimJob("big", "a", "normal", 4, 0.0, 100.0),
        SimJob("wait-low", "a", "low", 2, 1.0, 10.0),
        SimJob("wait-normal", "b", "normal", 2, 2.0, 10.0),
    ]
    log, _ = replay(jobs, Config(DEFAULT_CLASSES, {"a": Team("a"), "b": Team("b")}))
    assert log == [(0.0, "start", "big"), (100.0, "start", "wait-normal"), (100.0, "start", "wait-low")]


def test_a_replay_is_deterministic() -> None:
    jobs = [
        SimJob(f"j{i}", "ab"[i % 2], ["low", "normal", "high"][i % 3], 1 + i % 4, i * 37.0, 200.0 + i)
        for i in range(40)
    ]
    first, _ = replay(jobs)
    shuffled = list(jobs)
    random.Random(3).shuffle(shuffled)
    second, _ = replay(shuffled)
    assert first == second
