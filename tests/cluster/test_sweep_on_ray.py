"""Sweeps on a real Ray cluster on loopback: each cell a Ray task, the same reports as the cells
replayed here, from the library and from `gpupool simulate --sweep … --ray ADDRESS`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpupool.demo.loopback import LoopbackCluster
from gpupool.sim.cluster import load_vc_sizes
from gpupool.sim.failures import NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings
from gpupool.sim.sweep import as_json, parse_axes, replay_all, sweep
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


def test_a_run_refused_on_ray_says_why_in_one_line(cluster: LoopbackCluster, traces_dir: Path) -> None:
    trace = load_trace(traces_dir / "tiresias-sample" / "jobs.csv")
    counted = replace(SETTINGS, topology=False, failures=NodeFailures(3600.0, 600.0))
    with pytest.raises(ValueError, match=r"^node failures need nodes") as refused:
        replay_all(trace, [(ClusterSpec(nodes=2), Policy.POOL_FIFO, counted)], ray_address=cluster.address)
    assert "\n" not in str(refused.value)


def test_advise_replays_on_ray(
    cluster: LoopbackCluster, traces_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from gpupool.cli import app
    from gpupool.sim import on_ray

    calls: list[tuple[str, int]] = []
    real = on_ray.replay_on_ray

    def watched(trace: Any, runs: Any, address: str, on_done: Any = None) -> Any:
        calls.append((address, len(runs)))
        return real(trace, runs, address, on_done)

    monkeypatch.setattr(on_ray, "replay_on_ray", watched)
    out = tmp_path / "advice.yaml"
    args = ["advise", "--trace", str(traces_dir / "tiresias-sample" / "jobs.csv"), "--nodes", "2"]
    args += ["--target", "high.wait.p95<=1h", "--ray", cluster.address, "-o", str(out)]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    assert calls == [(cluster.address, 5)]  # the budget shares, each a Ray task
    assert "teams:" in out.read_text()


def test_a_ray_address_nothing_answers_at_is_refused_at_once(traces_dir: Path) -> None:
    trace = load_trace(traces_dir / "tiresias-sample" / "jobs.csv")
    with pytest.raises(ValueError, match=r"--ray 127.0.0.1:1: no Ray cluster answers there"):
        replay_all(trace, [(ClusterSpec(nodes=2), Policy.POOL_FIFO, SETTINGS)], ray_address="127.0.0.1:1")
