"""The simulated pool is bounded (MAX_POOL_GPUS), and a trace job larger than the pool never fits
without anything being made per GPU it asks for."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.sim.cluster import MAX_POOL_GPUS, cluster_from_sizes, cluster_uniform, scale_sizes
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import load_trace

runner = CliRunner()
HEADER = "job_id,submit_time,num_gpus,duration,vc\n"


def write_trace(tmp_path: Path, rows: str) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + rows, encoding="utf-8")
    return path


def test_the_pool_holds_at_most_a_hundred_thousand_gpus() -> None:
    assert MAX_POOL_GPUS == 100_000


@pytest.mark.parametrize("policy", list(Policy))
def test_a_job_larger_than_the_pool_never_fits_and_the_rest_run(tmp_path: Path, policy: Policy) -> None:
    trace = load_trace(write_trace(tmp_path, f"a,0,1,10,x\nhuge,1,{10**15},10,x\nb,2,2,10,x\n"))
    run = replay(trace, ClusterSpec(nodes=2, gpus_per_node=8), policy, Settings(JobModel({})))
    assert run.report["left_out"] == {"team_not_sized": 0, "never_fits": 1}
    assert run.report["jobs"] == 2


def test_simulate_counts_a_job_larger_than_the_pool_as_left_out(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, f"a,0,1,10,x\nhuge,1,{10**15},10,x\n")
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--nodes", "1"])
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())  # the temporary path's length moves the line breaks
    assert "1 larger than the pool (8 GPUs) never fits" in words
    assert "left out" in words


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--nodes", "12501"],
            "--nodes 12,501 × --gpus-per-node 8 = 100,008 GPUs: the simulated pool holds at most",
            id="just-over",
        ),
        pytest.param(["--nodes", str(10**12)], "--nodes 1,000,000,000,000 × --gpus-per-node 8 = ", id="huge-nodes"),
        pytest.param(
            ["--nodes", "1", "--gpus-per-node", "100001"], "--gpus-per-node 100,001: at most 100,000", id="wide-node"
        ),
        pytest.param(["--nodes", "1", "--gpus-per-node", "0"], "--gpus-per-node 0: at least 1", id="gpuless-node"),
    ],
)
def test_a_pool_too_large_to_simulate_is_refused_naming_the_option(
    tmp_path: Path, args: list[str], message: str
) -> None:
    trace = write_trace(tmp_path, "a,0,1,10,x\n")
    result = runner.invoke(app, ["simulate", "--trace", str(trace), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "100,000 GPUs" in result.output or "at least 1" in result.output


@pytest.mark.parametrize(
    ("sizes", "args", "message"),
    [
        pytest.param("vc,node num\nx,12501\n", [], "--vc-sizes", id="just-over"),
        pytest.param("vc,node num\nx,1000000000000\n", [], "1,000,000,000,000 nodes", id="huge-count"),
        pytest.param("vc,node num\nx,2\n", ["--scale", "1e9"], "--scale 1e+09", id="huge-scale"),
    ],
)
def test_vc_sizes_too_large_to_simulate_are_refused(tmp_path: Path, sizes: str, args: list[str], message: str) -> None:
    trace = write_trace(tmp_path, "a,0,1,10,x\n")
    vc = tmp_path / "vc.csv"
    vc.write_text(sizes, encoding="utf-8")
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--vc-sizes", str(vc), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "the simulated pool holds at most 100,000 GPUs" in result.output


def test_the_cluster_builders_refuse_a_pool_too_large_before_making_nodes() -> None:
    with pytest.raises(ValueError, match="at most 100,000 GPUs"):
        cluster_uniform(10**12, 8, {"x": 1.0}, dedicated=False)
    with pytest.raises(ValueError, match="at most 100,000 GPUs"):
        cluster_from_sizes({"x": 10**12}, 8, dedicated=True)
    with pytest.raises(ValueError, match="at most 100,000 GPUs"):
        cluster_uniform(1, 10**9, {"x": 1.0}, dedicated=False)
    assert cluster_uniform(12_500, 8, {"x": 1.0}, dedicated=False).gpus == MAX_POOL_GPUS


@pytest.mark.parametrize("count", [1_000, 123_456_789, 10**12])
def test_scaling_by_one_keeps_large_counts(count: int) -> None:
    # The rounding tolerance is relative to the value, but never a whole node's worth of it.
    assert scale_sizes({"x": count}, 1.0) == {"x": count}
