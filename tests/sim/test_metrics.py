"""The measures of a replay, on records whose numbers are known."""

from __future__ import annotations

import pytest

from gpupool.sim.metrics import jain, stats, summarize
from gpupool.sim.records import JobRecord, Outcome, SimJob


def record(id: str, team: str, priority: str, gpus: int, submit: float, work: float, **kw: float) -> JobRecord:
    r = JobRecord(SimJob(id, team, priority, gpus, submit, work))
    for name, value in kw.items():
        setattr(r, name, value)
    return r


def test_jain_is_one_for_equal_shares_and_one_over_n_for_a_monopoly() -> None:
    assert jain([2.0, 2.0, 2.0]) == 1.0
    assert jain([5.0, 0.0, 0.0, 0.0]) == 0.25


def test_stats_interpolate_percentiles() -> None:
    assert stats([0.0, 10.0]) == {"mean": 5.0, "p50": 5.0, "p95": 9.5, "p99": 9.9}
    assert stats([]) == {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}


def test_groups_add_up_to_the_whole() -> None:
    records = [
        record(
            "a",
            "x",
            "low",
            2,
            0.0,
            100.0,
            first_start=0.0,
            finish=150.0,
            allocated=300.0,
            drain=20.0,
            restart=20.0,
            preemptions=1,
        ),
        record("b", "y", "high", 1, 10.0, 50.0, first_start=10.0, finish=60.0, allocated=50.0),
    ]
    report = summarize("pool-priority", Outcome(records, [], 2, capacity=4), save_cost=5.0)
    assert report["jobs"] == 2
    assert report["utilization"] == pytest.approx(350.0 / (4 * 150.0), abs=1e-6)
    assert report["goodput"] == pytest.approx(250.0 / 350.0, abs=1e-6)
    assert report["lost_gpu_hours"]["total"] == pytest.approx(40.0 / 3600, abs=1e-6)
    by_class = report["by_priority"]
    assert by_class["low"]["lost_gpu_hours"]["total"] + by_class["high"]["lost_gpu_hours"]["total"] == pytest.approx(
        report["lost_gpu_hours"]["total"]
    )
    assert by_class["low"]["utilization"] + by_class["high"]["utilization"] == pytest.approx(report["utilization"])
    assert report["by_team"]["x"]["goodput"] == pytest.approx(200.0 / 300.0, abs=1e-6)
    # One interruption in 150 s of running (300 GPU-s on 2 GPUs) and 50 s of another job: M = 200 s.
    assert report["young_daly_interval"] == pytest.approx((2 * 5.0 * 200.0) ** 0.5)
