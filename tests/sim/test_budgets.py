"""Priority budgets in the simulator: metered as the store meters them, applied by the core."""

from __future__ import annotations

import pytest

from gpupool.model import DEFAULT_CLASSES, Config, Node, Plan, PriorityBudget, Reason, Team
from gpupool.sim.budgets import BudgetMeter
from gpupool.sim.engine import Simulation
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.records import SimJob

HOUR = 3600.0


def test_use_is_counted_inside_the_window_only_at_the_class_the_attempt_ran_at() -> None:
    meter = BudgetMeter.of({"a": Team("a", budgets=(PriorityBudget("high", 1.0, HOUR),))})
    meter.start("j1", "a", "high", 2, 0.0)
    meter.start("j2", "a", "normal", 4, 0.0)  # demoted or asked lower: not the high budget's
    assert meter.usage(100.0) == {("a", "high"): 200.0}
    meter.end("j1", 1000.0)
    assert meter.usage(1000.0 + HOUR - 10.0) == {("a", "high"): pytest.approx(20.0)}
    assert meter.usage(1000.0 + 2 * HOUR) == {("a", "high"): 0.0}


def test_past_its_budget_a_teams_job_runs_one_class_lower_until_the_window_moves_on() -> None:
    team = Team("a", budgets=(PriorityBudget("high", 0.1, HOUR),))  # 360 GPU-seconds per hour
    jobs = [SimJob("1", "a", "high", 1, 0.0, 400.0), SimJob("2", "a", "high", 1, 500.0, 10.0)]
    jobs.append(SimJob("3", "a", "high", 1, 400.0 + HOUR + 10.0, 10.0))
    plans: list[Plan] = []
    config = Config(DEFAULT_CLASSES, {"a": team})
    Simulation(jobs, [Node("n0", 4)], config, JobModel({}, 1800.0), on_plan=lambda now, plan: plans.append(plan)).run()
    starts = {s.job: s for plan in plans for s in plan.starts}
    assert (starts["1"].priority, starts["1"].reason) == ("high", Reason.FREE_GPUS)
    assert (starts["2"].priority, starts["2"].reason) == ("normal", Reason.BUDGET_EXCEEDED)
    assert "over its high budget (0.1 of 0.1 GPU-h per 1 h): runs as normal" in starts["2"].message
    assert starts["3"].priority == "high", "the window has moved past the first job"
