"""Elastic jobs in the simulator (issue 36): which jobs a share makes elastic, how fast one runs
at another size, and a replay that shrinks one for a higher job and grows it back, told as a
log of what the scheduler decided."""

from __future__ import annotations

import pytest

from gpupool.model import DEFAULT_CLASSES, Config, ElasticPolicy, Plan
from gpupool.sim.elastic import is_drawn, pace, sizes_of
from gpupool.sim.engine import Simulation
from gpupool.sim.failures import NodeFailures
from gpupool.sim.jobmodel import Attempt, JobModel
from gpupool.sim.records import SimJob
from tests.support.builders import pool

MODEL = JobModel({}, default_interval=100.0, save_cost=5.0, restart_cost=10.0)
CONFIG = Config(DEFAULT_CLASSES, elastic=ElasticPolicy(min_time_at_size=600.0))


@pytest.mark.parametrize(
    ("gpus", "per_node", "sizes"),
    [
        (1, None, ()),
        (2, None, (1, 2)),
        (16, None, (4, 8, 16)),
        (6, None, (2, 3, 4, 5, 6)),
        (32, 8, (8, 16, 32)),
        (24, 8, (8, 16, 24)),
        (8, 8, ()),
    ],
)
def test_a_job_made_elastic_runs_down_to_a_quarter_of_its_gpus(
    gpus: int, per_node: int | None, sizes: tuple[int, ...]
) -> None:
    assert sizes_of(gpus, per_node) == sizes


def test_a_share_draws_that_share_of_the_jobs_the_same_way_every_time() -> None:
    drawn = [is_drawn(f"job-{i}", 0.3) for i in range(10_000)]
    assert 0.28 < sum(drawn) / len(drawn) < 0.32
    assert drawn == [is_drawn(f"job-{i}", 0.3) for i in range(10_000)]
    assert not any(is_drawn(f"job-{i}", 0.0) for i in range(1000))
    assert all(is_drawn(f"job-{i}", 1.0) for i in range(1000))


def test_amdahls_pace_is_one_at_the_traces_size_and_linear_when_all_of_it_is_parallel() -> None:
    assert pace(16, 16, 0.95) == 1.0
    assert pace(4, 16, 1.0) == pytest.approx(0.25)
    assert pace(4, 16, 0.95) == pytest.approx((1 / (0.05 + 0.95 / 4)) / (1 / (0.05 + 0.95 / 16)))
    slow = Attempt(0.0, 0.0, 0.0, 100.0, 1e9, 0.0, pace=0.5)
    assert slow.finish_time() == 200.0 and slow.at(50.0).progress == 25.0


def replay(jobs: list[SimJob], gpus: int = 4) -> tuple[list[tuple[object, ...]], Simulation]:
    log: list[tuple[object, ...]] = []

    def record(now: float, plan: Plan) -> None:
        for p in plan.preemptions:
            kept = sum(len(a.gpus) for a in p.keep)
            log.append((now, "shrink", p.victim, kept) if kept else (now, "preempt", p.victim))
        log.extend((now, "grow", g.job, sum(len(a.gpus) for a in g.placement)) for g in plan.grows)
        log.extend((now, "start", s.job, sum(len(a.gpus) for a in s.placement)) for s in plan.starts)

    sim = Simulation(jobs, pool(1, gpus), CONFIG, MODEL, on_plan=record, parallel=1.0)
    sim.run()
    return log, sim


def test_an_elastic_job_shrinks_for_a_higher_one_runs_on_at_once_and_grows_back() -> None:
    """e (4 GPUs, down to 1) shrinks to 2 for h at 300, saves for 5 s and runs on at once on
    the 2 it kept; h ends at 355; e grows back to 4 once it ran 600 s at 2 (at 905)."""
    log, sim = replay(
        [SimJob("e", "a", "low", 4, 0.0, 1000.0, sizes=(1, 2, 4)), SimJob("h", "b", "high", 2, 300.0, 50.0)]
    )
    assert log == [
        (0.0, "start", "e", 4),
        (300.0, "shrink", "e", 2),
        (305.0, "start", "h", 2),
        (905.0, "grow", "e", 4),
    ]
    e = sim.live["e"].record
    assert (e.resizes, e.preemptions, e.wait) == (2, 0, 0.0)
    assert e.lost_to_resizes == pytest.approx(e.drain + e.restart) and e.drain > 0
    # 290 s of work at 4 GPUs, saved by 305; at 2 GPUs, at half pace (all of its work is
    # parallel here), from 315 (a 10 s restore) to 905: 5 saves and 65 s, 282.5 s of work, saved
    # by 910; at 4 GPUs from 920, the 427.5 s left and 4 saves.
    assert e.finish == 920.0 + 427.5 + 4 * 5.0


def test_a_replay_with_no_elastic_job_never_resizes() -> None:
    log, sim = replay([SimJob("r", "a", "low", 4, 0.0, 1000.0), SimJob("h", "b", "high", 2, 300.0, 50.0)])
    assert [entry[1] for entry in log] == ["start", "preempt", "start", "start"]
    assert sim.live["r"].record.resizes == 0


class _Clock:
    """A node's clock that fails it once, `at` seconds after the first arrival, and never again."""

    def __init__(self, at: float | None) -> None:
        self.at = at

    def up_for(self) -> float:
        at, self.at = self.at, None
        return at if at is not None else 1e12

    def down_for(self) -> float:
        return 50.0


class _FailsN1(NodeFailures):
    def stream(self, node: str) -> _Clock:  # type: ignore[override]
        return _Clock(602.0 if node == "n1" else None)


def test_a_job_growing_onto_a_node_that_fails_is_lost_with_it() -> None:
    """The review found the simulator crash: e, a gang growing from n0 onto n1 (notice at 600),
    was not lost with n1 (its added GPUs were only its notice's), and its state was started
    again on a node that was out."""
    jobs = [
        SimJob("c", "a", "low", 2, 0.0, 5000.0),
        SimJob("b", "a", "low", 4, 0.0, 100.0, gpus_per_node=4),
        SimJob("e", "a", "low", 4, 0.0, 3000.0, gpus_per_node=2, sizes=(2, 4)),
    ]
    sim = Simulation(jobs, pool(2, 4), CONFIG, MODEL, failures=_FailsN1(1e9, 50.0))
    outcome = sim.run()
    e = sim.live["e"].record
    assert e.node_losses == 1 and e.finish is not None
    assert all(r.finish is not None for r in outcome.records)
