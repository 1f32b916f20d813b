"""The architecture's promise, checked: the simulator *is* the scheduler.

One workload is replayed through the simulator and through the live service's control loop
(its store, a fake executor, a fake clock), and the two decision logs are compared line by
line. The service's jobs behave as the simulator's job model says (the same `Attempt` and
`interrupt`), so any difference is a difference in how the two drivers schedule.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpupool.model import DEFAULT_CLASSES, Config, FairShare, Node, Plan, PriorityScope, Reason, Team
from gpupool.policy import PoolState
from gpupool.service.loop import ControlLoop
from gpupool.sim.engine import Simulation
from gpupool.sim.jobmodel import Attempt, JobModel, interrupt
from gpupool.sim.records import SimJob
from gpupool.store import JobSpec, Store
from tests.support.fakes import FakeExecutor

NODES = [Node("n0", 4), Node("n1", 4)]
TEAMS = {"a": Team("a", 2.0, 4), "b": Team("b", 1.0, 2), "c": Team("c", 1.0, 2)}
MODEL = JobModel({}, float("inf"), save_cost=10.0, restart_cost=20.0)
Log = list[tuple[float, Plan]]


def workload(seed: int, count: int = 40) -> list[SimJob]:
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(1, count + 1):
        t += rng.choice([0.0, 30.0, 200.0, 700.0])
        priority = rng.choices(["urgent", "high", "normal", "low"], [1, 2, 4, 4])[0]
        gpus = rng.choice([1, 1, 2, 2, 3, 4, 8])
        jobs.append(SimJob(str(i), rng.choice(sorted(TEAMS)), priority, gpus, t, rng.choice([100.0, 900.0, 2500.0])))
    return jobs


def simulated(jobs: list[SimJob], config: Config, nodes: list[Node] = NODES) -> Log:
    log: Log = []
    Simulation(jobs, nodes, config, MODEL, on_plan=lambda now, plan: log.append((now, plan))).run()
    return log


@dataclass
class Plans:
    """The loop's observer that keeps every plan, as the simulator's `on_plan` does."""

    log: Log

    def on_decision(self, now: float, state: PoolState, plan: Plan, seconds: float) -> None:
        self.log.append((now, plan))

    def on_tick(self, now: float, changed: bool) -> None:
        pass


def served(jobs: list[SimJob], config: Config, folder: Path, nodes: list[Node] = NODES) -> Log:
    """The same jobs through the control loop: submitted at their time, each attempt ending
    when the job model says (at its finish, or after the save its notice asked for)."""
    store = Store.open(f"sqlite:///{folder / 'gpupool.db'}")
    store.sync_config(config)
    store.set_nodes(nodes, virtual=True)
    executor = FakeExecutor(store)
    log: Log = []
    loop = ControlLoop(store, config, executor, folder / "data", observer=Plans(log))
    by_id = {job.id: job for job in jobs}
    committed = {job.id: 0.0 for job in jobs}
    attempts: dict[str, tuple[int, Attempt]] = {}
    events: list[tuple[float, int, str, str, int]] = []
    seq = 0

    def push(time: float, kind: str, job_id: str, attempt: int = -1) -> None:
        nonlocal seq
        heapq.heappush(events, (time, seq, kind, job_id, attempt))
        seq += 1

    for job in jobs:
        push(job.submit, "arrive", job.id)
    started = notified = 0
    try:
        while events:
            now = events[0][0]
            dirty = False  # as in the simulator: an event for an attempt that has ended is no news
            while events and events[0][0] == now:
                _, _, kind, job_id, attempt = heapq.heappop(events)
                live = attempts.get(job_id)
                dirty |= kind in ("arrive", "decide") or (live is not None and live[0] == attempt)
                if kind == "arrive":
                    job = by_id[job_id]
                    spec = JobSpec(["train"], team=job.team, priority=job.priority, gpus=job.gpus)
                    assert str(store.submit(spec, now=now).id) == job_id
                elif kind in ("finish", "release") and live is not None and live[0] == attempt:
                    if kind == "finish":
                        store.report_completed(int(job_id), attempt, now)
                    executor.finish(int(job_id), attempt, 0)
                    del attempts[job_id]
            while dirty:  # decide again at this instant while victims leave at once
                loop.tick(now)
                for launch in executor.started[started:]:
                    job_id = str(launch.job_id)
                    restore = MODEL.restart_cost if launch.attempt > 0 else 0.0
                    run = Attempt(now, restore, committed[job_id], by_id[job_id].work, float("inf"), MODEL.save_cost)
                    attempts[job_id] = (launch.attempt, run)
                    push(run.finish_time(), "finish", job_id, launch.attempt)
                started = len(executor.started)
                again = False
                for victim, number, deadline in executor.notified[notified:]:
                    job_id = str(victim)
                    run = attempts[job_id][1]
                    cut = interrupt(run, now, deadline)
                    if cut.release_at < run.finish_time():
                        committed[job_id] = cut.committed
                        push(cut.release_at, "release", job_id, number)
                        again |= cut.release_at == now
                notified = len(executor.notified)
                if not again:
                    break
                for _, _, kind, job_id, attempt in [e for e in events if e[0] == now]:
                    assert kind == "release" and attempts[job_id][0] == attempt
                    executor.finish(int(job_id), attempt, 0)
                    del attempts[job_id]
                events = [e for e in events if e[0] != now]
                heapq.heapify(events)
            if loop.retry_at is not None and loop.retry_at > now:
                push(loop.retry_at, "decide", "")
    finally:
        store.close()
    return log


@pytest.mark.parametrize(
    ("seed", "options"),
    [
        (1, {}),
        (2, {}),
        (3, {"fair_share": FairShare.PREEMPT, "priority_preemption": PriorityScope.ABOVE_GUARANTEE}),
        (4, {"seniority_after": 600.0}),
    ],
)
def test_the_simulator_and_the_service_decide_the_same_line_by_line(
    seed: int, options: dict[str, Any], tmp_path: Path
) -> None:
    config = Config(DEFAULT_CLASSES, TEAMS, **options)
    jobs = workload(seed)
    sim, service = simulated(jobs, config), served(jobs, config, tmp_path)
    preemptions = sum(len(plan.preemptions) for _, plan in sim)
    assert preemptions > 0, "the workload must make the core preempt"
    if "seniority_after" in options:
        senior = [p for _, plan in sim for p in plan.preemptions if p.reason is Reason.SENIORITY]
        assert senior, "the workload must make seniority preempt"
    for n, (expected, got) in enumerate(zip(sim, service, strict=False)):
        assert got == expected, f"decision {n} differs"
    assert len(service) == len(sim)


def test_a_victim_that_finishes_during_its_drain_leaves_its_gpus_to_its_preemptor_in_both(tmp_path: Path) -> None:
    """Job 2 gets notice for job 3 at 500 and finishes its work at 505, inside its 10 s save:
    the GPUs it frees are job 3's in the simulator as in the service, not job 4's."""
    nodes = [Node("n0", 4), Node("n1", 1)]
    config = Config(DEFAULT_CLASSES, {t: Team(t) for t in "abc"})
    jobs = [
        SimJob("1", "a", "normal", 1, 0.0, 10_000.0),
        SimJob("2", "b", "low", 4, 0.0, 505.0),
        SimJob("3", "a", "normal", 4, 500.0, 100.0),
        SimJob("4", "c", "normal", 4, 501.0, 100.0),
    ]
    sim, service = simulated(jobs, config, nodes), served(jobs, config, tmp_path, nodes)
    assert next(s.job for _, plan in sim for s in plan.starts if s.job in ("3", "4")) == "3"
    assert service == sim
