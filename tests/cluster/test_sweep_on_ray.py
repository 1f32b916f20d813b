"""Sweeps on a real Ray cluster on loopback: each cell a Ray task, the same reports as the cells
replayed here, from the library and from `gpupool simulate --sweep … --ray ADDRESS`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from gpupool.executors.ray_loopback import LoopbackCluster
from gpupool.sim.cluster import load_vc_sizes
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings
from gpupool.sim.sweep import as_json, parse_axes, sweep
from gpupool.sim.trace import load_trace

SETTINGS = Settings(JobModel({}, 1800.0, 30.0, 60.0))


def without_wall_time(report: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in report.items() if key != "wall_seconds"}


def test_a_sweep_on_ray_gives_the_reports_of_the_same_sweep_here(cluster: LoopbackCluster, traces_dir: Path) -> None:
    trace = load_trace(traces_dir / "philly" / "jobs.csv")
    trace = replace(trace, jobs=trace.jobs[20_800:21_500])
    spec = ClusterSpec(load_vc_sizes(traces_dir / "philly" / "vc_sizes.csv"), scale=0.1)
    axes = parse_axes(["checkpoint-interval=10m,1h", "scale=0.1,0.2"])
    policies = [Policy.POOL_FIFO, Policy.POOL_PRIORITY]
    done: list[int] = []
    on_ray = as_json(sweep(trace, spec, policies, SETTINGS, axes, on_done=done.append, ray_address=cluster.address))
    here = as_json(sweep(trace, spec, policies, SETTINGS, axes, workers=1))
    assert [without_wall_time(dict(r)) for r in on_ray] == [without_wall_time(dict(r)) for r in here]
    assert done == list(range(1, 9))
    assert any(r["preemptions"] for r in on_ray)


def test_simulate_sweeps_on_ray_from_the_command_line(
    cluster: LoopbackCluster, traces_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sweep.json"
    command = [
        sys.executable, "-m", "gpupool", "simulate", "--trace", str(traces_dir / "tiresias-sample" / "jobs.csv"),
        "--nodes", "2", "--policy", "pool-priority", "--sweep", "restart-cost=10s,5m",
        "--ray", cluster.address, "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert [r["parameters"]["restart-cost"] for r in json.loads(out.read_text())] == ["10s", "5m"]
