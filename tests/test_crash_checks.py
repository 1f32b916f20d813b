"""The crash harness's checks (benchmarks/crash_checks.py) on small made-up runs: each holds on
a run where nothing went wrong and fails on one where its property was broken. Also the job
program the harness submits, run twice outside gpupool: the second copy, started while the
first's lock is held, says DUPLICATE and resumes from the first's checkpoint. No service."""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.crash_checks import (
    Attempt,
    Commit,
    Event,
    Job,
    Ledger,
    Placement,
    StoreRows,
    Submission,
    check_all,
    check_ended_once,
    check_gpus,
    check_nothing_lost,
    check_processes,
    check_resumes,
    check_store_attempts,
    figures,
    parse_ledger,
    read_store,
)
from benchmarks.crash_harness import JOB_PROGRAM, harness_config

NODE = "n0"


def good_store() -> StoreRows:
    """Job 1 (1 GPU) preempted once and resumed from step 10 on another GPU; job 2 (2 GPUs) ran
    once. The store missed job 1's commit of step 10 (the service was down when it was made)."""
    return StoreRows(
        jobs=[Job(1, "crash-0001", "succeeded", 1, 2, 1), Job(2, "crash-0002", "succeeded", 2, 1, 0)],
        attempts=[
            Attempt(1, 0, 10.0, 20.0, pid=100, outcome="preempted", notice_at=15.0),
            Attempt(1, 1, 25.0, 40.0, pid=200, restored_step=10, outcome="succeeded"),
            Attempt(2, 0, 12.0, 30.0, pid=300, outcome="succeeded"),
        ],
        placements=[
            Placement(1, 0, NODE, 0, 10.0, 20.0),
            Placement(1, 1, NODE, 1, 25.0, 40.0),
            Placement(2, 0, NODE, 2, 12.0, 30.0),
            Placement(2, 0, NODE, 3, 12.0, 30.0),
        ],
        events=[
            Event(1, None, "submitted", 9.0),
            Event(1, 0, "preempting", 15.0),
            Event(1, 0, "pending", 20.0),
            Event(1, 1, "succeeded", 40.0),
            Event(2, None, "submitted", 9.5),
            Event(2, 0, "succeeded", 30.0),
        ],
        commits=[Commit(1, 0, 5, 14.1), Commit(1, 1, 20, 39.1), Commit(2, 0, 30, 29.1)],
    )


def line(kind: str, job: int, attempt: int, pid: int, time: float, **more: Any) -> str:
    return json.dumps({"kind": kind, "job": job, "attempt": attempt, "pid": pid, "time": time, **more})


def start(job: int, attempt: int, pid: int, ppid: int, began: float, restored: int | None, gpus: list[int]) -> str:
    return line("start", job, attempt, pid, began + 0.2, ppid=ppid, began=began, restored=restored, gpus=gpus, seq=job)


GOOD_LEDGER = [
    start(1, 0, 101, 100, 10.5, None, [0]),
    line("commit", 1, 0, 101, 14.0, step=5),
    line("commit", 1, 0, 101, 18.0, step=10),
    line("end", 1, 0, 101, 19.5, how="left"),
    start(1, 1, 201, 200, 25.5, 10, [1]),
    line("commit", 1, 1, 201, 39.0, step=20),
    line("done", 1, 1, 201, 39.5, total=190, expected=190),
    line("end", 1, 1, 201, 39.6, how="done"),
    start(2, 0, 301, 300, 12.5, None, [2, 3]),
    line("commit", 2, 0, 301, 29.0, step=30),
    line("done", 2, 0, 301, 29.5, total=435, expected=435),
    line("end", 2, 0, 301, 29.6, how="done"),
]
GOOD_SUBMISSIONS = [Submission(1, "crash-0001", 1, 201), Submission(2, "crash-0002", 2, 201)]


def good_ledger() -> Ledger:
    return parse_ledger(GOOD_LEDGER)


def with_attempt(store: StoreRows, job: int, attempt: int, **changes: Any) -> StoreRows:
    rows = [replace(a, **changes) if (a.job_id, a.attempt) == (job, attempt) else a for a in store.attempts]
    return replace(store, attempts=rows)


def test_a_run_where_nothing_went_wrong_passes_every_check() -> None:
    assert check_all(good_store(), good_ledger(), GOOD_SUBMISSIONS) == []


def test_the_ledger_reads_back_and_keeps_what_it_cannot_read() -> None:
    ledger = parse_ledger([*GOOD_LEDGER, "not json", json.dumps({"kind": "start", "job": 1}), ""])
    assert len(ledger.starts) == 3
    assert [c.step for c in ledger.commits] == [5, 10, 20, 30]
    assert ledger.starts[1].restored == 10
    assert ledger.starts[2].gpus == (2, 3)
    assert len(ledger.unreadable) == 2
    assert any("does not read" in p for p in check_processes(good_store(), ledger))


def test_a_job_that_never_ended_or_failed_is_a_violation() -> None:
    store = good_store()
    store.jobs[1] = replace(store.jobs[1], state="running")
    store.events = [e for e in store.events if not (e.job_id == 2 and e.kind == "succeeded")]
    problems = check_ended_once(store, good_ledger())
    assert any("job 2 (crash-0002) never ended" in p for p in problems)
    assert any("job 2 has 0 terminal events" in p for p in problems)

    store = good_store()
    store.jobs[1] = replace(store.jobs[1], state="failed")
    assert any("ended as failed" in p for p in check_ended_once(store, good_ledger()))


def test_a_job_that_ended_twice_is_a_violation() -> None:
    store = good_store()
    store.events.append(Event(2, 0, "failed", 31.0))
    assert check_ended_once(store, good_ledger()) == [
        "job 2 has 2 terminal events, not 1 (succeeded at 30.000, failed at 31.000)"
    ]


def test_work_after_the_end_or_a_success_no_process_finished_is_a_violation() -> None:
    store = good_store()
    store.attempts.append(Attempt(2, 1, 35.0, 36.0, pid=400, outcome="lost"))
    assert any("attempt 1 started at 35.000, after the job ended" in p for p in check_ended_once(store, good_ledger()))

    ledger = parse_ledger([*GOOD_LEDGER, start(2, 1, 401, 400, 35.0, 30, [0])])
    assert any("began at 35.000, after the job ended" in p for p in check_ended_once(good_store(), ledger))

    without_done = parse_ledger([entry for entry in GOOD_LEDGER if '"done"' not in entry or '"job": 1' not in entry])
    problems = check_ended_once(good_store(), without_done)
    assert any("job 1 succeeded with attempt 1, but no process of that attempt finished" in p for p in problems)

    wrong_total = parse_ledger([entry.replace('"total": 435', '"total": 434') for entry in GOOD_LEDGER])
    assert any("not 435" in p for p in check_ended_once(good_store(), wrong_total))


def test_attempts_that_overlap_in_the_store_are_a_violation() -> None:
    store = with_attempt(good_store(), 1, 1, started_at=19.0)
    assert check_store_attempts(store) == ["job 1: attempt 1 started at 19.000 while attempt 0 ran (10.000 to 20.000)"]
    store = with_attempt(good_store(), 1, 0, ended_at=None)
    problems = check_store_attempts(store)
    assert "job 1 attempt 0 never ended in the store" in problems
    assert any("while attempt 0 ran" in p for p in problems)

    store = good_store()
    store.jobs[0] = replace(store.jobs[0], attempts=3)
    assert check_store_attempts(store) == ["job 1 counts 3 attempts, the store holds attempts [0, 1]"]


def test_a_gpu_held_twice_is_a_violation() -> None:
    store = good_store()
    store.placements[1] = replace(store.placements[1], gpu=2)  # job 1's second attempt on job 2's GPU
    problems = check_gpus(store)
    assert problems == [
        f"GPU {NODE}/2 held twice: by job 2 attempt 0 (12.000 to 30.0) and by job 1 attempt 1 from 25.000"
    ]
    assert check_gpus(replace(good_store(), placements=good_store().placements[:3])) == [
        "job 2 attempt 0 held 1 placements on 1 GPUs; the job asked for 2"
    ]
    store = good_store()
    store.placements[0] = replace(store.placements[0], held_until=None)
    problems = check_gpus(store)
    assert f"GPU {NODE}/0 is still held by job 1 attempt 0" in problems
    assert any("outside its lifetime" in p for p in problems)


def test_a_second_process_of_a_job_is_a_violation() -> None:
    ledger = parse_ledger(
        [
            *GOOD_LEDGER,
            line("duplicate", 2, 0, 302, 20.0, holder="pid 301 attempt 0"),
            start(2, 0, 302, 999, 20.0, 12, [2, 3]),
            line("end", 2, 0, 302, 22.0, how="left"),
        ]
    )
    problems = check_processes(good_store(), ledger)
    assert problems[0].startswith("DUPLICATE: job 2 attempt 0: pid 302 found the job's lock held (held by pid 301")
    assert "job 2 attempt 0 ran as 2 processes (pids 301, 302)" in problems
    assert any("pid 302 is the child of pid 999, not of the attempt's launcher (pid 300" in p for p in problems)
    assert any("job 2: pid 302 (attempt 0) began at 20.000 while pid 301 (attempt 0) still ran" in p for p in problems)
    assert any("resumed from step 12" in p for p in check_resumes(good_store(), ledger))


def test_processes_of_two_attempts_at_once_are_a_violation() -> None:
    # Attempt 0's process still ran (it never wrote its end) when attempt 1's began: the store
    # ended attempt 0 too early.
    late = [entry for entry in GOOD_LEDGER if not entry.startswith('{"kind": "end", "job": 1, "attempt": 0')]
    late.append(line("end", 1, 0, 101, 26.0, how="left"))
    problems = check_processes(good_store(), parse_ledger(late))
    assert any("pid 101 ran until 26.000, after the store ended the attempt (20.000)" in p for p in problems)
    assert any("job 1: pid 201 (attempt 1) began at 25.500 while pid 101 (attempt 0) still ran" in p for p in problems)


def test_a_process_on_gpus_not_its_own_or_outside_its_attempt_is_a_violation() -> None:
    ledger = parse_ledger([entry.replace('"gpus": [1]', '"gpus": [2]') for entry in GOOD_LEDGER])
    problems = check_processes(good_store(), ledger)
    assert any("pid 201 ran on GPUs [2], its placement is [1]" in p for p in problems)
    assert any("GPU 2 used by two processes at once: pid 301 (job 2 attempt 0" in p for p in problems)

    early = parse_ledger([entry.replace('"began": 25.5', '"began": 24.0') for entry in GOOD_LEDGER])
    assert any("began at 24.000, before the attempt started" in p for p in check_processes(good_store(), early))

    unknown = parse_ledger([*GOOD_LEDGER, start(2, 5, 501, 500, 31.0, None, [0])])
    assert any("which the store does not have" in p for p in check_processes(good_store(), unknown))


def test_a_commit_of_an_older_attempt_after_a_newer_one_began_is_a_violation() -> None:
    ledger = parse_ledger([*GOOD_LEDGER, line("commit", 1, 0, 101, 26.0, step=15)])
    assert any(
        "attempt 0 (pid 101) committed step 15 at 26.000, after attempt 1 began" in p
        for p in check_processes(good_store(), ledger)
    )


def test_a_resume_from_an_older_checkpoint_is_a_violation() -> None:
    older = parse_ledger([entry.replace('"restored": 10', '"restored": 5') for entry in GOOD_LEDGER])
    problems = check_resumes(good_store(), older)
    assert problems == [
        "job 1 attempt 1 (pid 201) resumed from step 5; the newest checkpoint committed before it is step 10 "
        "(attempt 0)",
        "job 1 attempt 1: the store says it resumed from step 10, its process resumed from 5",
    ]
    scratch = parse_ledger([entry.replace('"restored": 10', '"restored": null') for entry in GOOD_LEDGER])
    problems = check_resumes(with_attempt(good_store(), 1, 1, restored_step=None), scratch)
    assert problems == [
        "job 1 attempt 1 (pid 201) resumed from scratch; the newest checkpoint committed before it is step 10 "
        "(attempt 0)",
        "job 1 attempt 1 resumed from None, older than step 5 the store recorded as committed by an earlier attempt",
    ]


def test_a_resume_older_than_a_commit_the_store_recorded_is_a_violation() -> None:
    # The ledger lost no commit here, but the store has one newer than the step resumed from.
    store = good_store()
    store.commits.append(Commit(1, 0, 12, 19.0))
    assert check_resumes(store, good_ledger()) == [
        "job 1 attempt 1 resumed from 10, older than step 12 the store recorded as committed by an earlier attempt"
    ]


def test_a_resume_from_a_checkpoint_nobody_committed_is_a_violation() -> None:
    ahead = parse_ledger([entry.replace('"restored": 10', '"restored": 15') for entry in GOOD_LEDGER])
    problems = check_resumes(with_attempt(good_store(), 1, 1, restored_step=15), ahead)
    assert problems == [
        "job 1 attempt 1 (pid 201) resumed from step 15; the newest checkpoint committed before it is step 10 "
        "(attempt 0)"
    ]


def test_a_lost_or_doubled_submission_is_a_violation() -> None:
    store = good_store()
    missing = [*GOOD_SUBMISSIONS, Submission(3, "crash-0003", 3, 201)]
    assert check_nothing_lost(store, missing) == [
        "submission crash-0003 was answered 201 as job 3, which the store lacks"
    ]

    swapped = [Submission(1, "crash-0001", 2, 201), Submission(2, "crash-0002", 1, 201)]
    assert len(check_nothing_lost(store, swapped)) == 2

    store.jobs.append(Job(3, "crash-0002", "succeeded", 1, 1))
    assert check_nothing_lost(store, GOOD_SUBMISSIONS) == ["submission crash-0002 is stored 2 times (jobs 2, 3)"]

    store = good_store()
    store.jobs.append(Job(3, "stranger", "succeeded", 1, 1))
    assert check_nothing_lost(store, GOOD_SUBMISSIONS) == [
        "job stranger is in the store, but the harness never submitted it"
    ]

    refused = [*GOOD_SUBMISSIONS, Submission(3, "crash-0003", None, 422)]
    assert check_nothing_lost(good_store(), refused) == ["submission crash-0003 was answered 422, not accepted"]
    conflict = [*GOOD_SUBMISSIONS, Submission(3, "crash-0003", None), Submission(3, "crash-0003", None, 409)]
    assert check_nothing_lost(good_store(), conflict) == ["submission crash-0003 was answered 409, not accepted"]


def test_a_submission_without_an_answer_is_tried_again_and_gets_its_job() -> None:
    lost = Submission(3, "crash-0003", None)
    busy = Submission(3, "crash-0003", None, 503)
    # The lost try never made the job: the retry makes it.
    store = good_store()
    store.jobs.append(Job(3, "crash-0003", "succeeded", 1, 0))
    retried = [*GOOD_SUBMISSIONS, lost, busy, Submission(3, "crash-0003", 3, 201)]
    assert check_nothing_lost(store, retried) == []
    # The lost try made it: the retry is answered with it, as a replay.
    replayed = [*GOOD_SUBMISSIONS, lost, Submission(3, "crash-0003", 3, 201, replayed=True)]
    assert check_nothing_lost(store, replayed) == []
    counts = figures(store, good_ledger(), replayed)
    assert counts["submissions"] == 3
    assert counts["  tried again (no answer, or a 5xx)"] == 1
    assert counts["  retries answered as a replay (the lost try made the job)"] == 1
    assert counts["tries without an answer (killed under them)"] == 1


def test_a_retry_that_makes_another_job_or_none_is_a_violation() -> None:
    store = good_store()
    store.jobs += [Job(3, "crash-0003", "succeeded", 1, 0), Job(4, "crash-0003", "succeeded", 1, 0)]
    doubled = [*GOOD_SUBMISSIONS, Submission(3, "crash-0003", 3, 201), Submission(3, "crash-0003", 4, 201)]
    assert check_nothing_lost(store, doubled) == [
        "submission crash-0003 was answered as 2 different jobs (3, 4)",
        "submission crash-0003 is stored 2 times (jobs 3, 4)",
    ]
    never = [*GOOD_SUBMISSIONS, Submission(3, "crash-0003", None), Submission(3, "crash-0003", None, 503)]
    assert check_nothing_lost(good_store(), never) == ["submission crash-0003 was never answered in 2 tries"]


def test_figures_count_what_the_run_did() -> None:
    counts = figures(good_store(), good_ledger(), GOOD_SUBMISSIONS, kills=[17.0, 27.0])
    assert counts["attempts (store)"] == 3
    assert counts["  preempted (notice, requeued)"] == 1
    assert counts["  alive across a kill (adopted or found ended)"] == 3
    assert counts["  under notice across a kill"] == 1
    assert counts["resumes checked"] == 1
    assert counts["checkpoint commits (ledger)"] == 4
    assert counts["checkpoint commits (store)"] == 3


def test_the_store_is_read_with_the_columns_the_schema_has(tmp_path: Path) -> None:
    # Through importlib: mypy checks this file without gpupool's sources on its path too.
    store_module = importlib.import_module("gpupool.store")
    store_module.Store.open(f"sqlite:///{tmp_path / 'gpupool.db'}").close()
    assert read_store(tmp_path / "gpupool.db") == StoreRows()


def test_the_harness_configuration_is_one_gpupool_takes(tmp_path: Path) -> None:
    config = importlib.import_module("gpupool.config")
    spec = config.parse_spec(harness_config(tmp_path / "data", 18471), "harness")
    assert spec.service.virtual_gpus == 4
    assert spec.service.data_path == tmp_path / "data"


def run_job(tmp_path: Path, attempt: int, steps: int = 4) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GPUPOOL_JOB_ID": "7",
        "GPUPOOL_ATTEMPT": str(attempt),
        "GPUPOOL_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "CUDA_VISIBLE_DEVICES": "1,3",
    }
    command = [sys.executable, str(tmp_path / "job.py"), "--ledger", str(tmp_path), "--seq", "7"]
    command += ["--steps", str(steps), "--step-seconds", "0", "--save-every", "2"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("held", [False, True])
def test_the_job_program_writes_its_ledger_and_finds_a_second_copy(tmp_path: Path, held: bool) -> None:
    (tmp_path / "job.py").write_text(JOB_PROGRAM)
    first = run_job(tmp_path, 0)
    assert first.returncode == 0, first.stderr
    with (tmp_path / "job-7.lock").open("r+") as lock:
        if held:  # as the first attempt, still running, would hold it
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        second = run_job(tmp_path, 1, steps=6)
    assert second.returncode == 0, second.stderr
    ledger = parse_ledger((tmp_path / "ledger.jsonl").read_text().splitlines())
    assert [(s.attempt, s.restored, s.gpus, s.locked) for s in ledger.starts] == [
        (0, None, (1, 3), True),
        (1, 4, (1, 3), not held),
    ]
    assert [c.step for c in ledger.commits] == [2, 4, 6]
    assert [(d.total, d.expected) for d in ledger.dones] == [(6, 6), (15, 15)]
    assert [e.how for e in ledger.ends] == ["done", "done"]
    assert len(ledger.duplicates) == int(held)
    duplicates = [p for p in check_processes(StoreRows(), ledger) if p.startswith("DUPLICATE")]
    assert len(duplicates) == int(held)
    assert check_resumes(StoreRows(), ledger) == []
