"""The simulator's placement options: first-fit (Tiresias' default) and GPUs counted with no
node topology, under every policy; best-fit stays the default and its results are fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.model import Node, PlacementRule
from gpupool.sim.cluster import Cluster, without_topology
from gpupool.sim.failures import NodeFailures
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import load_trace

MODEL = JobModel({}, 1800.0, 30.0, 60.0)


def trace_of(tmp_path: Path, rows: str) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text("job_id,submit_time,num_gpus,duration,vc\n" + rows)
    return path


def test_without_topology_one_node_holds_each_group_s_gpus() -> None:
    cluster = Cluster(
        (Node("a0", 8, "V100", "x"), Node("a1", 8, "V100", "x"), Node("b0", 4, "T4", None), Node("b1", 2, "T4")),
        {"x": 16, "y": 6},
    )
    merged = without_topology(cluster)
    assert merged.nodes == (Node("V100-x-all", 16, "V100", "x"), Node("T4-shared-all", 6, "T4", None))
    assert merged.team_gpus == cluster.team_gpus
    assert merged.gpus == cluster.gpus


def test_counted_gpus_start_a_job_that_nodes_would_keep_waiting(tmp_path: Path) -> None:
    # Two 8-GPU nodes, two 6-GPU jobs: 4 GPUs are free, 2 on each node; a 4-GPU job fits only counted.
    trace = load_trace(trace_of(tmp_path, "a,0,6,1000,\nb,0,6,1000,\nc,1,4,100,\n"))
    spec = ClusterSpec(nodes=2, gpus_per_node=8)
    for policy in (Policy.POOL_FIFO, Policy.POOL_PRIORITY):
        nodes = replay(trace, spec, policy, Settings(MODEL)).report
        counted = replay(trace, spec, policy, Settings(MODEL, topology=False)).report
        assert nodes["wait"]["p99"] > 900
        assert counted["wait"]["p99"] == 0.0
        assert counted["gpus"] == nodes["gpus"] == 16


def test_first_fit_takes_the_first_node_under_every_policy(tmp_path: Path) -> None:
    # a (n0) and b (n1) take 3 GPUs each; a ends, so n0 is empty and n1 has 1 free. c (1 GPU)
    # takes n1 by best fit, n0 by first fit; then d (4 GPUs) starts at once on n0 by best fit,
    # and by first fit waits for b to end.
    trace = load_trace(trace_of(tmp_path, "a,0,3,10,\nb,0,3,1000,\nc,20,1,1000,\nd,30,4,100,\n"))
    spec = ClusterSpec(nodes=2, gpus_per_node=4)
    for policy in Policy:
        waits = {}
        for rule in PlacementRule:
            settings = Settings(MODEL, mix=(("low", 1.0),), placement=rule)
            records = replay(trace, spec, policy, settings).outcome.records
            waits[rule] = {r.job.id: r.wait for r in records}
        assert waits[PlacementRule.BEST_FIT] == {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}, policy
        assert waits[PlacementRule.FIRST_FIT] == {"a": 0.0, "b": 0.0, "c": 0.0, "d": 970.0}, policy


def test_counted_gpus_refuse_node_failures(tmp_path: Path) -> None:
    trace = load_trace(trace_of(tmp_path, "a,0,1,10,\n"))
    settings = Settings(MODEL, topology=False, failures=NodeFailures(3600.0, 600.0))
    with pytest.raises(ValueError, match="node failures need nodes"):
        replay(trace, ClusterSpec(nodes=1), Policy.POOL_FIFO, settings)


def test_counted_gpus_run_gangs_of_fixed_members(tmp_path: Path) -> None:
    path = tmp_path / "gangs.csv"
    path.write_text("job_id,submit_time,num_gpus,duration,vc,gpus_per_node\nj1,0,8,100,,4\n")
    trace = load_trace(path)
    spec = ClusterSpec(nodes=2, gpus_per_node=4)
    for topology in (True, False):
        report = replay(trace, spec, Policy.POOL_FIFO, Settings(MODEL, topology=topology)).report
        assert (report["jobs"], report["left_out"]["never_fits"]) == (1, 0), topology
