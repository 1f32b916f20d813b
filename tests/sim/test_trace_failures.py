"""Jobs a trace says failed: they run their recorded time, then fail as the service fails a job
(no retry), and the work since their last commit is charged to their failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import load_trace

MODEL = JobModel({}, 1800.0, 30.0, 60.0)
HEADER = "job_id,submit_time,num_gpus,duration,vc,status\n"


def write(tmp_path: Path, rows: str) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + rows)
    return path


def test_the_status_column_marks_failed_jobs_whatever_its_case(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "a,0,1,60,,Failed\nb,1,1,60,,FAILED\nc,2,1,60,,Killed\nd,3,1,60,,\n"))
    assert [(j.job_id, j.failed) for j in trace.jobs] == [("a", True), ("b", True), ("c", False), ("d", False)]
    assert trace.failed == 2


def test_a_failed_job_ends_after_its_run_time_and_loses_its_work_since_the_last_commit(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "a,0,2,4000,,Failed\nb,0,2,4000,,Pass\n"))
    report = replay(trace, ClusterSpec(nodes=1, gpus_per_node=4), Policy.POOL_FIFO, Settings(MODEL)).report
    # Saves of 30 s after each 1,800 s of work: commits at 1,830 and 3,660 s, the end at 4,060 s.
    assert report["jct"]["p50"] == 4060.0
    assert report["jobs"] == 2  # a failed job reached its end: it counts in the waits and JCT
    assert report["trace_failed_jobs"] == 1
    lost = 2 * (4060 - 3660) / 3600
    assert report["lost_gpu_hours_by_cause"] == {"preemption": 0.0, "failure": pytest.approx(lost, abs=1e-6)}
    assert report["lost_gpu_hours"]["total"] == pytest.approx(lost, abs=1e-6)
    assert report["trace_gpu_hours"] == pytest.approx(2 * 2 * 4000 / 3600, abs=1e-6)
    useful = report["by_team"]["default"]["gpu_hours"]
    assert useful == pytest.approx(2 * 2 * 4000 / 3600 - lost, abs=1e-6)
    assert "node_losses" not in report and "failed_jobs" not in report


def test_lost_work_splits_into_preemption_and_failure(tmp_path: Path) -> None:
    # A low job that will fail is preempted by an urgent one, resumes, then fails.
    labelled = tmp_path / "labelled.csv"
    labelled.write_text(
        "job_id,submit_time,num_gpus,duration,vc,status,cls\nlo,0,4,20000,,Failed,lo\nhi,3000,4,600,,,hi\n"
    )
    mapped = Settings(MODEL, priority_map={"lo": "low", "hi": "urgent"})
    report = replay(
        load_trace(labelled, priority_from="cls"), ClusterSpec(nodes=1, gpus_per_node=4), Policy.POOL_PRIORITY, mapped
    ).report
    assert report["preemptions"] == 1
    assert report["trace_failed_jobs"] == 1
    by_cause = report["lost_gpu_hours_by_cause"]
    assert by_cause["preemption"] > 0 and by_cause["failure"] > 0
    assert by_cause["preemption"] + by_cause["failure"] == pytest.approx(report["lost_gpu_hours"]["total"], abs=1e-5)
    low = report["by_priority"]["low"]
    assert low["lost_gpu_hours_by_cause"]["failure"] == by_cause["failure"]


def test_without_trace_failures_the_report_is_that_of_a_trace_without_status(tmp_path: Path) -> None:
    failing = load_trace(write(tmp_path, "a,0,2,4000,,Failed\nb,10,4,900,,\n"))
    plain_path = tmp_path / "plain.csv"
    plain_path.write_text(HEADER + "a,0,2,4000,,\nb,10,4,900,,\n")
    spec = ClusterSpec(nodes=1, gpus_per_node=4)
    ignored = replay(failing, spec, Policy.POOL_PRIORITY, Settings(MODEL, trace_failures=False)).report
    plain = replay(load_trace(plain_path), spec, Policy.POOL_PRIORITY, Settings(MODEL)).report
    for report in (ignored, plain):
        del report["wall_seconds"]
    assert ignored == plain
    assert "trace_failed_jobs" not in plain
