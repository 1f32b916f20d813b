"""Sweeps: a grid of replays in parallel processes, each cell the report of its single run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.sim.cluster import load_vc_sizes
from gpupool.sim.failures import NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.sweep import as_json, configure, grid, parse_axes, sweep
from gpupool.sim.trace import Trace, load_trace

SETTINGS = Settings(JobModel({"high": 600.0}, 1800.0, 30.0, 60.0))


def without_wall_time(report: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in report.items() if key != "wall_seconds"}


def test_a_sweeps_cells_are_the_single_runs_cell_by_cell(traces_dir: Path) -> None:
    trace = load_trace(traces_dir / "philly" / "jobs.csv")
    trace = replace(trace, jobs=trace.jobs[20_800:21_500])
    spec = ClusterSpec(load_vc_sizes(traces_dir / "philly" / "vc_sizes.csv"), scale=0.1)
    axes = parse_axes(["checkpoint-interval=10m,1h", "scale=0.1,0.2", "node-mtbf=2d"])
    policies = [Policy.POOL_FIFO, Policy.POOL_PRIORITY]
    swept = as_json(sweep(trace, spec, policies, SETTINGS, axes, workers=2))
    assert len(swept) == 2 * 2 * 1 * 2
    expected = []
    for interval in (600.0, 3600.0):
        for scale in (0.1, 0.2):
            model = JobModel({}, interval, 30.0, 60.0)
            settings = replace(SETTINGS, model=model, failures=NodeFailures(2 * 86400.0, 4 * 3600.0))
            for policy in policies:
                expected.append(without_wall_time(replay(trace, replace(spec, scale=scale), policy, settings).report))
    assert [without_wall_time({k: v for k, v in r.items() if k != "parameters"}) for r in swept] == expected
    assert [r["parameters"] for r in swept[::2]] == [
        {"checkpoint-interval": i, "scale": s, "node-mtbf": "2d"} for i in ("10m", "1h") for s in ("0.1", "0.2")
    ]
    assert any(r["preemptions"] for r in swept) and any(r["node_failures"] for r in swept)


def test_a_grid_goes_first_axis_slowest() -> None:
    axes = parse_axes(["save-cost=10s,1m", "restart-cost=5s,2m,10m"])
    assert [[text for _, text, _ in cell] for cell in grid(axes)] == [
        ["10s", "5s"],
        ["10s", "2m"],
        ["10s", "10m"],
        ["1m", "5s"],
        ["1m", "2m"],
        ["1m", "10m"],
    ]
    _, settings = configure(grid(axes)[4], ClusterSpec(nodes=2), SETTINGS)
    assert (settings.model.save_cost, settings.model.restart_cost) == (60.0, 120.0)
    assert settings.model.interval == {"high": 600.0}, "only checkpoint-interval replaces the intervals"


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["speed=1,2"], "unknown parameter 'speed'"),
        (["scale"], "expected name=value"),
        (["scale=0.1,"], "an empty value"),
        (["scale=0.1,0.1"], "a value is given twice"),
        (["checkpoint-interval=1h,60m"], "1h and 60m are the same value"),
        (["scale=0"], "must be a finite number > 0"),
        (["scale=lots"], "could not convert|not a"),
        (["save-cost=soon"], "save-cost=soon"),
        (["scale=0.1", "scale=0.2"], "--sweep scale is given twice"),
    ],
)
def test_bad_sweeps_say_what_is_wrong(texts: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_axes(texts)


def test_scaling_a_pool_given_by_node_count_is_refused_before_anything_runs() -> None:

    with pytest.raises(ValueError, match="--sweep scale scales --vc-sizes or --machines"):
        sweep(Trace(Path("x"), (), 0, 0), ClusterSpec(nodes=2), [Policy.POOL_FIFO], SETTINGS, parse_axes(["scale=0.5"]))
