"""Traces with real classes and GPU types: a column mapped to gpupool's classes, fractional GPUs
rounded up, machine lists with GPU types, and jobs that run only on the type they ask for."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.model import DEFAULT_CLASSES, Config, Plan
from gpupool.model import Node as PoolNode
from gpupool.sim.cluster import cluster_from_machines, load_machines, scale_machines
from gpupool.sim.engine import Simulation
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.records import SimJob
from gpupool.sim.replay import ClusterSpec, Policy, Settings, admissible, replay
from gpupool.sim.trace import TraceError, load_trace
from gpupool.sim.workload import parse_priority_map

MODEL = JobModel({}, 1800.0, 30.0, 60.0)
HEADER = "job_id,submit_time,num_gpus,gpu_milli,duration,vc,qos,gpu_spec\n"


def write(tmp_path: Path, rows: str, header: str = HEADER, name: str = "jobs.csv") -> Path:
    path = tmp_path / name
    path.write_text(header + rows)
    return path


def test_the_trace_gives_types_labels_and_counts_fractional_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, "a,0,1,500,60,,LS,\nb,5,2,1000,60,,BE,V100\nc,9,0,0,60,,BE,\n")
    trace = load_trace(path, priority_from="qos")
    assert [(j.job_id, j.gpus, j.gpu_type, j.label) for j in trace.jobs] == [
        ("a", 1, None, "LS"),
        ("b", 2, "V100", "BE"),
    ]
    assert trace.fractional == 1
    assert trace.zero_gpu_jobs == 1


@pytest.mark.parametrize(
    ("rows", "kwargs", "message"),
    [
        ("a,0,1,500,60,,LS,A|B\n", {}, "line 2, column gpu_spec: 'A|B': a job may need one GPU type"),
        ("a,0,1,1500,60,,LS,\n", {}, "line 2, column gpu_milli: '1500' is not a number in (0, 1000]"),
        ("a,0,1,half,60,,LS,\n", {}, "column gpu_milli: 'half'"),
        ("a,0,1,500,60,,,\n", {"priority_from": "qos"}, "line 2, column qos: empty, but priorities are taken"),
        ("a,0,1,500,60,,LS,\n", {"priority_from": "class"}, "no column 'class' to take priorities from"),
    ],
)
def test_bad_rows_name_their_line_and_column(tmp_path: Path, rows: str, kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(TraceError, match=message.replace("|", r"\|").replace("(", r"\(").replace(")", r"\)")):
        load_trace(write(tmp_path, rows), **kwargs)  # type: ignore[arg-type]


def test_a_priority_map_is_parsed_and_checked() -> None:
    known = [c.name for c in DEFAULT_CLASSES]
    assert parse_priority_map("LS=high, BE=low", known) == {"LS": "high", "BE": "low"}
    for text, message in [
        ("LS", "expected trace value=class"),
        ("LS=vip", "unknown class 'vip'"),
        ("LS=high,LS=low", "'LS' is given twice"),
        ("=high", "expected trace value=class"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_priority_map(text, known)


def test_jobs_take_the_class_their_label_maps_to_and_an_unmapped_label_is_refused(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "a,0,1,,60,,LS,\nb,1,1,,60,,BE,\nc,2,1,,60,,BE,\n"), priority_from="qos")
    cluster = ClusterSpec(nodes=1, gpus_per_node=4).build(trace, dedicated=False)
    jobs, _, _ = admissible(trace, cluster, Settings(MODEL, priority_map={"LS": "urgent", "BE": "low"}))
    assert [(j.id, j.priority) for j in jobs] == [("a", "urgent"), ("b", "low"), ("c", "low")]
    with pytest.raises(ValueError, match=r"no class for 'BE' \(2 jobs\)"):
        admissible(trace, cluster, Settings(MODEL, priority_map={"LS": "urgent"}))


def test_machine_lists_in_either_form(tmp_path: Path) -> None:
    pai = write(
        tmp_path,
        "m1,V100,96,512,8\nm2,CPU,96,512,0\nm3,T4,64,256,2\n",
        "machine,gpu_type,cap_cpu,cap_mem,cap_gpu\n",
        "m.csv",
    )
    assert load_machines(pai) == (("V100", 8), ("T4", 2))
    counts = write(tmp_path, "A100,8,3\nT4,4,1\n", "gpu_type,gpus,nodes\n", "c.csv")
    assert load_machines(counts) == (("A100", 8),) * 3 + (("T4", 4),)
    for header, rows, message in [
        ("name,cap_gpu\n", "m,8\n", "a machine list needs one of gpu_type, model"),
        ("gpu_type,gpus\n", "A100,eight\n", "line 2, column gpus: 'eight' is not an integer"),
        ("gpu_type,gpus\n", ",8\n", "line 2, column gpu_type: empty"),
        ("gpu_type,gpus\n", "CPU,0\n", "no machine with GPUs"),
        ("gpu_type,gpus,nodes\n", "A100,8,1000000000000\n", "at most 100,000 GPUs"),
    ]:
        with pytest.raises(TraceError, match=message):
            load_machines(write(tmp_path, rows, header, "bad.csv"))


def test_machines_are_shared_out_by_type_and_scaled_by_type() -> None:
    machines = (("A", 8),) * 4 + (("B", 2),) * 2
    cluster = cluster_from_machines(machines, {"x": 3.0, "y": 1.0}, dedicated=True)
    assert [(n.name, n.gpu_type, n.gpus, n.team) for n in cluster.nodes] == [
        ("A-0000", "A", 8, "x"),
        ("A-0001", "A", 8, "x"),
        ("A-0002", "A", 8, "x"),
        ("A-0003", "A", 8, "y"),
        ("B-0000", "B", 2, "x"),
        ("B-0001", "B", 2, "x"),
    ]
    assert cluster.team_gpus == {"x": 28, "y": 8}
    assert scale_machines(machines, 0.5) == (("A", 8),) * 2 + (("B", 2),)


def test_a_job_that_asks_for_a_type_runs_only_on_it() -> None:
    nodes = [PoolNode("a0", 4, "A"), PoolNode("b0", 4, "B")]
    jobs = [SimJob(f"j{i}", "t", "low", 2, float(i), 100.0, "B" if i % 2 else None) for i in range(8)]
    placed: dict[str, str] = {}

    def record(now: float, plan: Plan) -> None:
        placed.update((s.job, s.placement[0].node) for s in plan.starts)

    Simulation(jobs, nodes, Config(DEFAULT_CLASSES), MODEL, on_plan=record).run()
    assert all(placed[f"j{i}"] == "b0" for i in range(1, 8, 2))
    assert all(f"j{i}" in placed for i in range(0, 8, 2))


def test_a_type_no_machine_has_never_fits(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "a,0,1,,60,,LS,H100\nb,1,1,,60,,LS,A\n"))
    run = replay(trace, ClusterSpec(machines=(("A", 8),)), Policy.POOL_FIFO, Settings(MODEL))
    assert run.report["left_out"]["never_fits"] == 1
    assert run.report["jobs"] == 1


def test_scaling_machines_up_repeats_them_and_a_team_left_without_gpus_is_refused() -> None:
    machines = (("A", 8),) * 2 + (("B", 2),)
    assert scale_machines(machines, 2.0) == (("A", 8),) * 4 + (("B", 2),) * 2
    with pytest.raises(ValueError, match="at most 100,000"):
        scale_machines(machines, 10_000.0)
    with pytest.raises(ValueError, match=r"leave team\(s\) y, z without one"):
        cluster_from_machines((("A", 8), ("B", 8), ("C", 8)), {"x": 0.4, "y": 0.35, "z": 0.25}, dedicated=True)


def test_teams_can_come_from_another_column_to_partition_by_it(tmp_path: Path) -> None:
    path = write(tmp_path, "a,0,1,,60,nlp,LS,\nb,1,1,,60,nlp,BE,\n")
    trace = load_trace(path, team_from="qos")
    assert [(j.job_id, j.team) for j in trace.jobs] == [("a", "LS"), ("b", "BE")]
    cluster = ClusterSpec(nodes=2, gpus_per_node=4).build(trace, dedicated=True)
    assert sorted(cluster.team_gpus) == ["BE", "LS"]
    with pytest.raises(TraceError, match="no column 'tier' to take teams from"):
        load_trace(path, team_from="tier")
    with pytest.raises(TraceError, match="line 3, column qos: empty, but teams are taken from it"):
        load_trace(write(tmp_path, "a,0,1,,60,nlp,LS,\nb,1,1,,60,nlp,,\n"), team_from="qos")
