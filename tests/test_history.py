"""The lab's history as a trace (`gpupool.history`): what each ended job did, as the simulator
reads it back (`load_trace`), and the per-job costs the replay then uses."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.accounting import AttemptRecord, Commit
from gpupool.history import COLUMNS, EndedJob, HistoryJob, history_job, write_history
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import TraceError, load_trace

T0 = 1_700_000_000.0


def ended(id: int = 1, **changes: object) -> EndedJob:
    values: dict[str, object] = {
        "id": id,
        "team": "nlp",
        "priority": "low",
        "gpus": 2,
        "gpus_per_node": None,
        "gpu_type": None,
        "user": "ada",
        "state": "succeeded",
        "submit_time": T0,
        "preemptions": 1,
        "node_losses": 0,
    }
    return EndedJob(**{**values, **changes})  # type: ignore[arg-type]


PREEMPTED_THEN_DONE = [
    AttemptRecord(
        0, 2, T0 + 10, T0 + 36, T0 + 12, T0 + 35,
        commits=(Commit(T0 + 20, 20, 1.0), Commit(T0 + 30, 30, 2.0)), outcome="preempted",
    ),
    AttemptRecord(1, 2, T0 + 40, T0 + 60, T0 + 43, restored_step=30, outcome="succeeded"),
]  # fmt: skip


def test_a_job_s_work_wait_and_costs_come_from_its_attempts() -> None:
    h = history_job(ended(), list(reversed(PREEMPTED_THEN_DONE)))
    # Attempt 0: 26 s held, 2 of start-up, 3 of saves, 1 of drain, 5 done again (after the
    # commit at 30 it resumed from): 15 s of work; attempt 1: 20 s held, 3 of start-up: 17.
    assert h.duration == pytest.approx(32.0)
    assert h.wait == pytest.approx(10.0 + 4.0)
    assert h.save_cost == pytest.approx(1.5)
    assert h.restart_cost == pytest.approx(3.0)


def test_a_failed_job_runs_as_long_as_it_ran_before_it_failed() -> None:
    # 1,000 s on 2 GPUs, a commit at 300 s: the 800 s after it are lost with the failure, but
    # the job ran them, and the replay fails it at their end.
    attempt = AttemptRecord(0, 2, T0, T0 + 1000, T0 + 15, commits=(Commit(T0 + 300, 3, 0.0),), outcome="failed")
    failed = history_job(ended(state="failed"), [attempt])
    succeeded = history_job(ended(state="succeeded"), [replace(attempt, outcome="succeeded")])
    assert failed.duration == succeeded.duration == pytest.approx(985.0)


def test_a_job_that_never_held_gpus_has_no_run_time() -> None:
    assert history_job(ended(state="cancelled"), []) == HistoryJob(ended(state="cancelled"), None, None, None, None)


def test_the_history_reads_back_as_a_trace_with_classes_shapes_costs_and_failures(tmp_path: Path) -> None:
    jobs = [
        history_job(ended(2, submit_time=T0 + 100, priority="high", gpus=4, gpus_per_node=2), PREEMPTED_THEN_DONE),
        history_job(ended(1, state="failed", gpu_type="A100"), PREEMPTED_THEN_DONE),
        history_job(ended(3, submit_time=T0 + 5, state="cancelled"), []),
    ]
    out = io.StringIO()
    assert write_history(jobs, out) == 3
    header, *rows = out.getvalue().splitlines()
    assert header == ",".join(COLUMNS)
    assert [row.split(",")[0] for row in rows] == ["1", "3", "2"]  # by submission
    path = tmp_path / "history.csv"
    path.write_text(out.getvalue())
    trace = load_trace(path, priority_from="class")
    assert trace.no_duration == 1
    first, second = trace.jobs
    assert (first.job_id, first.submit_time, first.label, first.failed, first.gpu_type) == (
        "1",
        0.0,
        "low",
        True,
        "A100",
    )
    assert (second.job_id, second.submit_time, second.label, second.gpus, second.gpus_per_node) == (
        "2",
        100.0,
        "high",
        4,
        2,
    )
    assert (second.duration, second.save_cost, second.restart_cost, second.team) == (16.0, 1.5, 3.0, "nlp")
    assert first.submit_datetime is not None and first.submit_datetime.year == 2023


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("a,0,4,60,,3,,", "line 2, column gpus_per_node: '3': 4 GPUs do not split into members of 3"),
        ("a,0,4,60,,0,,", "column gpus_per_node: '0': not a positive integer"),
        ("a,0,4,60,,,-1,", "column save_cost: '-1' is not a number of seconds ≥ 0"),
        ("a,0,4,60,,,,soon", "column restart_cost: 'soon' is not a number of seconds ≥ 0"),
        ("a,0,0,60,,abc,,", "column gpus_per_node: 'abc'"),  # a row then skipped is checked too
        ("a,0,1,,,,-5,", "column save_cost: '-5'"),
    ],
)
def test_bad_shapes_and_costs_name_their_line_and_column(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("job_id,submit_time,num_gpus,duration,vc,gpus_per_node,save_cost,restart_cost\n" + row + "\n")
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def test_a_replay_uses_each_job_s_own_costs_unless_told_otherwise(tmp_path: Path) -> None:
    # A low job preempted by a high one, then resumed: its restart costs what the trace says.
    path = tmp_path / "history.csv"
    path.write_text(
        "job_id,submit_time,num_gpus,duration,vc,class,save_cost,restart_cost\n"
        "lo,0,2,5000,,low,5,600\nhi,1000,2,100,,high,,\n"
    )
    trace = load_trace(path, priority_from="class")
    settings = Settings(JobModel({}, 1800.0, 30.0, 60.0), priority_map={"low": "low", "high": "high"})
    spec = ClusterSpec(nodes=1, gpus_per_node=2)
    own = replay(trace, spec, Policy.POOL_PRIORITY, settings).report
    model = replay(trace, spec, Policy.POOL_PRIORITY, replace(settings, trace_costs=False)).report
    assert own["preemptions"] == model["preemptions"] == 1
    assert own["lost_gpu_hours"]["restart"] == pytest.approx(2 * 600 / 3600, abs=1e-6)
    assert model["lost_gpu_hours"]["restart"] == pytest.approx(2 * 60 / 3600, abs=1e-6)
    # Young/Daly with the jobs' own save cost (5 s), not the model's (30 s).
    assert own["young_daly_interval"] / model["young_daly_interval"] == pytest.approx((5 / 30) ** 0.5, rel=0.05)
