"""`gpupool advise`: targets parsed and checked, each class's interval from Young/Daly and
checked by replays, the smallest budgets that meet the targets, and YAML that the
configuration reads back."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.config import parse
from gpupool.model import PriorityBudget
from gpupool.sim.advise import (
    BUDGET_SHARES,
    INTERVAL_FACTORS,
    Runner,
    advice_yaml,
    advise,
    exact_duration,
    parse_target,
)
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.sweep import replay_all
from gpupool.sim.trace import Trace, load_trace
from tests.support.builders import BATCH_CLASSES

CLASSES = list(BATCH_CLASSES)
MODEL = JobModel({}, 1800.0, 30.0, 60.0)


def test_targets_are_parsed_and_bad_ones_say_why() -> None:
    target = parse_target(" high.wait.p95 <= 5m ", CLASSES)
    assert (target.cls, target.measure, target.stat, target.limit) == ("high", "wait", "p95", 300.0)
    assert target.met({"by_priority": {"high": {"wait": {"p95": 300.0}}}})
    assert not target.met({"by_priority": {"high": {"wait": {"p95": 301.0}}}})
    assert target.met({"by_priority": {}})  # no job of the class: nothing to miss
    for text, message in [
        ("high.wait<=5m", "expected CLASS.MEASURE.STAT<=DURATION"),
        ("high.wait.p95>5m", "expected CLASS.MEASURE.STAT<=DURATION"),
        ("vip.wait.p95<=5m", "unknown class 'vip'"),
        ("high.speed.p95<=5m", "measure 'speed': use wait or jct"),
        ("high.wait.p42<=5m", "statistic 'p42'"),
        ("high.wait.p95<=soon", "'soon' is not a duration"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_target(text, CLASSES)


def test_durations_are_written_as_the_configuration_reads_them() -> None:
    assert [exact_duration(s) for s in (604800, 129600, 1500, 90, 0.25, math.inf)] == [
        "7d", "36h", "25m", "90s", "0.250s", "never",
    ]  # fmt: skip


def contended(tmp_path: Path) -> Trace:
    """Low jobs fill 2 nodes; high jobs keep arriving and preempting them."""
    # The team's name reads as a number in YAML, as Philly's do: the advice must quote it.
    rows = [f"l{i},{i * 10},4,20000,103959,low" for i in range(6)]
    rows += [f"h{i},{3000 + i * 4000},4,1500,103959,high" for i in range(8)]
    path = tmp_path / "jobs.csv"
    path.write_text("job_id,submit_time,num_gpus,duration,vc,class\n" + "\n".join(rows) + "\n")
    return load_trace(path, priority_from="class")


def here(trace: Trace) -> Runner:
    """The replays in this process, one after another."""

    def run(runs: Any) -> list[dict[str, Any]]:
        return replay_all(trace, runs, workers=1)

    return run


def test_each_class_gets_the_interval_its_replays_spent_least_overhead_with(tmp_path: Path) -> None:
    trace = contended(tmp_path)
    settings = Settings(MODEL, priority_map={c: c for c in CLASSES})
    spec = ClusterSpec(nodes=2, gpus_per_node=4)
    advice = advise(trace, spec, Policy.POOL_PRIORITY, settings, [], 7 * 86400.0, here(trace))
    low = next(i for i in advice.intervals if i.cls == "low")
    assert low.young_daly is not None and low.young_daly > 0
    # The choice is the one of now, ½, 1 and 2 × Young/Daly whose replay spent least beyond
    # low's work: lost work and saves (GPU-h allocated less the work done).
    options = {1800.0: advice.before}
    for k in INTERVAL_FACTORS:
        model = JobModel({"low": k * low.young_daly}, 1800.0, 30.0, 60.0)
        options[k * low.young_daly] = replay(
            trace, spec, Policy.POOL_PRIORITY, Settings(model, priority_map=settings.priority_map)
        ).report
    low_of = {interval: r["by_priority"]["low"] for interval, r in options.items()}
    overhead = {interval: g["gpu_hours"] / g["goodput"] - g["gpu_hours"] for interval, g in low_of.items()}
    assert overhead[low.chosen] == min(overhead.values())
    assert low.overhead_after <= low.overhead_before
    high = next(i for i in advice.intervals if i.cls == "high")
    assert high.young_daly is None and high.chosen == high.current  # never interrupted
    assert advice.budget is None


def test_the_smallest_budget_that_meets_the_targets_and_yaml_the_config_reads(tmp_path: Path) -> None:
    trace = contended(tmp_path)
    settings = Settings(MODEL, priority_map={c: c for c in CLASSES})
    spec = ClusterSpec(nodes=2, gpus_per_node=4)
    loose = parse_target("high.wait.p95<=30d", CLASSES)
    advice = advise(trace, spec, Policy.POOL_PRIORITY, settings, [loose], 7 * 86400.0, here(trace))
    assert advice.budget is not None and advice.budget.share == BUDGET_SHARES[0]
    assert set(advice.budget.tried) == set(BUDGET_SHARES)
    (budget,) = advice.budget.budgets["103959"]
    assert (budget.priority, budget.window) == ("high", 7 * 86400.0)
    # A tenth of high's demand in the window: 8 jobs × 4 GPUs × 1500 s.
    assert budget.gpu_hours == pytest.approx(math.ceil(8 * 4 * 1500 / 3600 * 0.1 * 10) / 10)
    text = advice_yaml(advice, "jobs.csv")
    config = parse(yaml.safe_load(text), "advice")
    assert config.team("103959").budgets == (budget,)
    assert "#   low: " in text and "Young/Daly" in text

    # A target no budget can meet: none is advised, and the YAML says so.
    strict = parse_target("high.wait.p95<=0s", CLASSES)
    none = advise(trace, spec, Policy.POOL_PRIORITY, settings, [strict], 7 * 86400.0, here(trace))
    assert none.budget is not None and none.budget.share is None
    assert not any(none.budget.tried.values())
    assert "no budget meets the targets" in advice_yaml(none, "jobs.csv")


def test_choices_that_lose_more_together_give_way_to_the_best_joint_replay(tmp_path: Path) -> None:
    trace = contended(tmp_path)
    settings = Settings(MODEL, priority_map={c: c for c in CLASSES})
    spec = ClusterSpec(nodes=2, gpus_per_node=4)
    measured = replay(trace, spec, Policy.POOL_PRIORITY, settings).report
    calls: list[int] = []

    def overheads(report: dict[str, Any], low: float, high: float) -> dict[str, Any]:
        """The report with low's and high's overhead (GPU-h beyond 1 GPU-h of work) set."""
        by_priority = {**report["by_priority"]}
        for cls, overhead in (("low", low), ("high", high)):
            by_priority[cls] = {**by_priority[cls], "gpu_hours": 1.0, "goodput": 1.0 / (1.0 + overhead)}
        return {**report, "by_priority": by_priority}

    def crafted(runs: Any) -> list[dict[str, Any]]:
        calls.append(len(runs))
        if len(runs) == len(INTERVAL_FACTORS):  # the candidates: ½ × Young/Daly spends least
            return [overheads(measured, 0.001 * k, 0.0) for k in (1, 2, 3)]
        return [overheads(measured, 0.0, 99.0)]  # together, the choices spend more than any candidate

    advice = advise(trace, spec, Policy.POOL_PRIORITY, settings, [], 7 * 86400.0, crafted)
    assert calls == [3, 1]
    low = next(i for i in advice.intervals if i.cls == "low")
    assert low.young_daly is not None and low.chosen == pytest.approx(0.5 * low.young_daly)
    assert advice.after["by_priority"]["high"]["goodput"] == 1.0  # the candidate's replay, not the last


def test_saves_that_cost_nothing_leave_the_interval_as_it_is(tmp_path: Path) -> None:
    trace = contended(tmp_path)
    settings = Settings(JobModel({}, 1800.0, 0.0, 60.0), priority_map={c: c for c in CLASSES})
    advice = advise(trace, ClusterSpec(nodes=2, gpus_per_node=4), Policy.POOL_PRIORITY, settings, [], 1.0, here(trace))
    assert all(i.young_daly is None and i.chosen == i.current for i in advice.intervals)


def test_the_advised_budgets_keep_each_team_s_configured_ones(tmp_path: Path) -> None:
    trace = contended(tmp_path)
    configured = {"103959": (PriorityBudget("low", 5.0, 86400.0),)}
    settings = Settings(MODEL, priority_map={c: c for c in CLASSES}, budgets=configured)
    loose = parse_target("high.wait.p95<=30d", CLASSES)
    advice = advise(
        trace, ClusterSpec(nodes=2, gpus_per_node=4), Policy.POOL_PRIORITY, settings, [loose], 7 * 86400.0, here(trace)
    )
    assert advice.budget is not None
    budgets = advice.budget.budgets["103959"]
    assert [b.priority for b in budgets] == ["low", "high"]
    config = parse(yaml.safe_load(advice_yaml(advice, "jobs.csv")), "advice")
    assert config.team("103959").budgets == budgets
