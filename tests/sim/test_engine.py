"""The simulator's event loop, told as a log of what the scheduler decided."""

from __future__ import annotations

import random
from dataclasses import replace

from gpupool.model import DEFAULT_CLASSES, Config, Plan, Team
from gpupool.policy import PoolState, decide
from gpupool.sim.engine import Simulation
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.records import SimJob
from tests.support.builders import pool

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


def test_the_simulator_carries_out_the_deadline_the_core_decided() -> None:
    """The victim is gone by the plan's deadline, not by a grace it works out for itself: a core
    that gives 2 s (less than the 5 s save) makes the victim stop at once and lose its work."""

    def hurried(state: PoolState, config: Config, now: float) -> Plan:
        plan = decide(state, config, now)
        return replace(plan, preemptions=tuple(replace(p, deadline=now + 2.0) for p in plan.preemptions))

    jobs = [SimJob("low", "a", "low", 4, 0.0, 1000.0), SimJob("high", "b", "high", 4, 250.0, 50.0)]
    sim = Simulation(jobs, pool(1, 4), DEFAULTS, MODEL, decide=hurried)
    sim.run()
    low = sim.live["low"].record
    # With the class's 60 s grace the 5 s save fits and nothing is wasted; with 2 s it does not:
    # it stops at once and the 40 s of work since its commit at 210 s (200 s of work) are lost.
    assert low.drain == 0.0
    assert low.wasted == 4 * (250.0 - 210.0)


def test_jobs_submitted_in_the_same_second_start_in_file_order() -> None:
    """Not by id as text, where j10 sorts before j9."""
    jobs = [SimJob(f"j{i}", "a", "normal", 4, 0.0, 10.0) for i in (8, 9, 10, 11)]
    log, _ = replay(jobs)
    assert [entry[2] for entry in log] == ["j8", "j9", "j10", "j11"]
