"""Node failures in the simulator: what a lost node costs, and that nothing runs on it."""

from __future__ import annotations

import gc
import math
from pathlib import Path

import pytest

from gpupool.model import DEFAULT_CLASSES, Config, Plan
from gpupool.sim.engine import Simulation
from gpupool.sim.failures import Distribution, NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.metrics import summarize
from gpupool.sim.records import SimJob
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import Trace, TraceJob
from tests.support.builders import pool

T, C, R = 100.0, 5.0, 10.0
MODEL = JobModel({}, default_interval=T, save_cost=C, restart_cost=R)
CONFIG = Config(DEFAULT_CLASSES, preemption=False, reclaim=False, max_node_losses=1000)


def run(jobs: list[SimJob], failures: NodeFailures, nodes: int = 2) -> tuple[Simulation, list[tuple[float, str, str]]]:
    starts: list[tuple[float, str, str]] = []

    def record(now: float, plan: Plan) -> None:
        starts.extend((now, s.job, s.placement[0].node) for s in plan.starts)

    sim = Simulation(jobs, pool(nodes, 4), CONFIG, MODEL, on_plan=record, failures=failures)
    sim.run()
    return sim, starts


def test_a_lost_attempt_costs_the_work_since_its_last_commit_and_a_restart() -> None:
    """Worked out from the log: each attempt's last commit before its node failed, as the
    job model lays commits out (every T + C seconds of the attempt after its restore)."""
    sim, starts = run([SimJob("j", "a", "low", 4, 0.0, 3000.0)], NodeFailures(700.0, 300.0, seed=5))
    record = sim.live["j"].record
    assert record.finish is not None and record.node_losses >= 2
    expected = 0.0
    for k, (start, _, node) in enumerate(starts):
        assert sim.outages is not None
        failed = [down for name, down, _ in sim.outages.outages if name == node and down > start]
        failed += [down for name, down in sim.outages.down.items() if name == node and down > start]
        end = min(failed) if failed else math.inf
        if end >= record.finish:
            assert k == len(starts) - 1, "only the last attempt ran to the end"
            break
        productive = start + (R if k else 0.0)
        cycles = math.floor((end - productive) / (T + C)) if end > productive else 0
        last = productive + cycles * (T + C) if cycles > 0 else productive
        expected += 4 * (max(0.0, end - last) + R)
    assert len(starts) == record.node_losses + 1
    assert record.lost_to_nodes == pytest.approx(expected)
    assert record.wasted + record.drain + record.restart == pytest.approx(expected)


def test_a_job_that_loses_more_nodes_than_allowed_fails_as_in_the_service() -> None:
    jobs = [SimJob("long", "a", "low", 4, 0.0, 50_000.0), SimJob("short", "a", "low", 4, 0.0, 50.0)]
    config = Config(DEFAULT_CLASSES, preemption=False, reclaim=False, max_node_losses=2)
    sim = Simulation(jobs, pool(2, 4), config, MODEL, failures=NodeFailures(2000.0, 100.0, seed=1))
    outcome = sim.run()
    long, short = (live.record for live in sim.live.values())
    assert long.failed and long.finish is None and long.node_losses == 3
    assert long.lost_to_nodes > 0
    assert short.finish is not None and not short.failed
    report = summarize("pool-fifo", outcome, C, failures=True)
    assert report["failed_jobs"] == 1 and report["jobs"] == 1


def test_nothing_starts_on_a_node_while_it_is_out() -> None:
    jobs = [SimJob(f"j{i}", "a", "low", 2, 50.0 * i, 400.0) for i in range(60)]
    sim, starts = run(jobs, NodeFailures(500.0, 200.0, seed=1), nodes=3)
    assert sim.outages is not None and sim.outages.outages
    for at, job, node in starts:
        for name, down, back in sim.outages.outages:
            assert not (name == node and down <= at < back), f"{job} started on {node} while it was out"
    assert all(live.record.finish is not None for live in sim.live.values())


def test_constant_failures_come_every_mean_after_a_seeded_phase() -> None:
    clock = NodeFailures(1000.0, 50.0, Distribution.CONSTANT, seed=2).stream("n0")
    first = clock.up_for()
    assert 0.0 <= first < 1000.0
    assert [clock.up_for(), clock.down_for(), clock.up_for()] == [1000.0, 50.0, 1000.0]
    again = NodeFailures(1000.0, 50.0, Distribution.CONSTANT, seed=2).stream("n0")
    assert again.up_for() == first


@pytest.mark.parametrize(("mtbf", "repair"), [(0.0, 1.0), (-5.0, 1.0), (10.0, -1.0), (math.nan, 1.0)])
def test_impossible_failure_times_are_refused(mtbf: float, repair: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        NodeFailures(mtbf, repair)


def test_every_policy_meets_the_same_failures_and_reports_them() -> None:
    jobs = tuple(TraceJob(f"t{i}", 30.0 * i, 1 + i % 4, 600.0 + 37 * i, "ab"[i % 2], None) for i in range(200))
    trace = Trace(Path("made.csv"), jobs, 0, 0)
    settings = Settings(MODEL, failures=NodeFailures(2000.0, 300.0, seed=4))
    spec = ClusterSpec(nodes=4, gpus_per_node=4)
    fifo, priority = (replay(trace, spec, p, settings) for p in (Policy.POOL_FIFO, Policy.POOL_PRIORITY))
    shared = min(len(fifo.outcome.outages), len(priority.outcome.outages))
    assert shared > 5
    assert fifo.outcome.outages[:shared] == priority.outcome.outages[:shared]
    for report in (fifo.report, priority.report):
        assert report["node_failures"] >= shared
        assert report["node_down_gpu_hours"] > 0
        assert report["node_losses"] > 0
        by_cause = report["lost_gpu_hours_by_cause"]
        assert by_cause["node_lost"] > 0
        assert by_cause["preemption"] + by_cause["node_lost"] == pytest.approx(report["lost_gpu_hours"]["total"])
    assert "node_failures" not in replay(trace, spec, Policy.POOL_FIFO, Settings(MODEL)).report


def test_a_job_that_cannot_commit_between_failures_fails_and_the_replay_ends() -> None:
    """Found by review: a node failing every 30 min under a job that checkpoints every 30 min
    of work requeued it for ever; as in the service it fails after `max_node_losses`."""
    model = JobModel({}, default_interval=1800.0, save_cost=30.0, restart_cost=60.0)
    failures = NodeFailures(1800.0, 600.0, Distribution.CONSTANT, seed=0)
    sim = Simulation(
        [SimJob("j", "a", "low", 4, 0.0, 7200.0)], pool(1, 4), Config(DEFAULT_CLASSES), model, failures=failures
    )
    outcome = sim.run()
    record = outcome.records[0]
    assert record.failed and record.node_losses == Config(DEFAULT_CLASSES).max_node_losses + 1


def test_an_outage_open_when_the_last_job_ends_is_counted_up_to_then() -> None:
    """Found by review: the down time of a node still out at the end was dropped."""
    # Each node's one failure comes at a seeded phase within 10^5 s; the job ends before that.
    failures = NodeFailures(1e5, 1e7, Distribution.CONSTANT, seed=3)
    sim = Simulation([SimJob("j", "a", "low", 2, 0.0, 50_000.0)], pool(3, 4), CONFIG, MODEL, failures=failures)
    outcome = sim.run()
    end = sim.ended_at
    assert outcome.outages and sim.outages is not None and not sim.outages.down
    assert all(back == end for _, _, back in outcome.outages), "no repair of 10^7 s ends before the job"
    assert outcome.node_down == pytest.approx(sum(4 * (end - down) for _, down, _ in outcome.outages))
    assert outcome.node_failures == len(outcome.outages)


def test_a_replay_leaves_the_callers_frozen_objects_frozen() -> None:
    jobs = [SimJob(f"j{i}", "a", "low", 1, float(i), 10.0) for i in range(10)]
    assert gc.get_freeze_count() == 0
    Simulation(jobs, pool(1, 4), CONFIG, MODEL).run()
    assert gc.get_freeze_count() == 0, "a replay thaws what it froze"
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        Simulation(jobs, pool(1, 4), CONFIG, MODEL).run()
        assert gc.get_freeze_count() >= frozen, "the caller's frozen objects stay frozen"
    finally:
        gc.unfreeze()


def test_a_job_that_needs_the_whole_pool_while_failures_go_on_does_not_stall_the_replay() -> None:
    """Found by review: with failures keeping some node down, a job needing every node waited
    for ever and the replay never ended; a node does not fail while nothing runs and nothing
    is left to arrive, so the job starts once every node is back."""
    jobs = [SimJob("small", "a", "low", 8, 0.0, 36_000.0), SimJob("whole", "a", "low", 128, 0.0, 600.0)]
    sim = Simulation(jobs, pool(16, 8), CONFIG, MODEL, failures=NodeFailures(3600.0, 3 * 3600.0, seed=2))
    outcome = sim.run()
    assert all(r.finish is not None or r.failed for r in outcome.records)
    assert outcome.node_failures > 0


def test_failed_jobs_count_in_the_gpu_time_allocated_and_lost() -> None:
    """Found by review: a job that failed after losing too many nodes vanished from every
    measure, so the policy hit hardest looked best."""
    config = Config(DEFAULT_CLASSES, preemption=False, reclaim=False, max_node_losses=1)
    jobs = [SimJob("long", "a", "low", 4, 0.0, 360_000.0), SimJob("short", "a", "low", 4, 0.0, 600.0)]
    outcome = Simulation(jobs, pool(2, 4), config, MODEL, failures=NodeFailures(36_000.0, 600.0, seed=1)).run()
    failed = next(r for r in outcome.records if r.failed)
    report = summarize("pool-fifo", outcome, C, failures=True)
    assert report["failed_jobs"] == 1 and report["jobs"] == 1
    assert report["node_losses"] == failed.node_losses == 2
    lost = failed.wasted + failed.drain + failed.restart
    assert lost > 0
    assert report["lost_gpu_hours"]["total"] == pytest.approx(lost / 3600, abs=1e-5)
    assert report["goodput"] < 0.1, "the failed job's GPU-time was spent for nothing"
