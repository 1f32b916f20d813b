"""What a Slurm user reaches for, through `gpupool up` with real processes: dependencies,
arrays and their limits, batch scripts with directives, log paths, `--wait` outcomes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live import Service, running, state, wait_for


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def job(service: Service, job_id: int) -> dict[str, object]:
    response = service.get(f"/jobs/{job_id}")
    assert response is not None
    shown: dict[str, object] = response.json()
    return shown


def test_dependencies_wait_for_the_outcome_and_a_dependency_that_cannot_be_met_cancels(
    service: Service, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    first = service.submit("--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done")
    then = service.submit("--after", str(first), "--", "true")
    doomed = service.submit("--", "sh", "-c", "exit 4")
    never = service.submit("--after", f"ok:{doomed}", "--", "true")
    anyway = service.submit("--after", f"any:{doomed}", "--", "true")
    wait_for(lambda: job(service, then)["wait_reason"] == "dependency")
    assert f"waits for job {first} to succeed" in str(job(service, then)["wait_message"])
    gate.touch()
    wait_for(lambda: all(state(service, j) in ("succeeded", "cancelled") for j in (then, never, anyway)))
    assert (state(service, then), state(service, never), state(service, anyway)) == (
        "succeeded",
        "cancelled",
        "succeeded",
    )
    events = service.cli("events", "--job", str(never)).stdout
    assert f"job {doomed} ended failed, so it can never succeed" in events
    unknown = service.cli("submit", "--priority", "low", "--after", "999", "--", "true")
    assert unknown.returncode == 3, "not found, as the exit codes' table says"
    assert "after: no job 999" in unknown.stderr


def test_an_array_runs_at_most_its_limit_at_once_even_across_a_kill_9(service: Service, tmp_path: Path) -> None:
    array = service.submit(
        "--array",
        "0-5%1",
        "-o",
        str(tmp_path / "out-%A_%a.txt"),
        "--",
        "sh",
        "-c",
        "echo task $GPUPOOL_ARRAY_INDEX; sleep 2",
    )
    wait_for(lambda: state(service, array) == "running")
    service.kill()
    service.up()
    wait_for(lambda: all(state(service, array + i) == "succeeded" for i in range(6)), timeout=90)
    for i in range(6):
        assert (tmp_path / f"out-{array}_{i}.txt").read_text() == f"task {i}\n"
    # From the store's placements: never two tasks holding GPUs at the same time (the pool has 2).
    spans: list[tuple[float, float]] = []
    for i in range(6):
        history: list[dict[str, float]] = job(service, array + i)["history"]  # type: ignore[assignment]
        spans.extend((a["started_at"], a["ended_at"]) for a in history)
    for (_, end), (start, _) in itertools.pairwise(sorted(spans)):
        assert start >= end, "two tasks of a %1 array ran at once"
    tasks = service.get(f"/jobs?array={array}").json()  # type: ignore[union-attr]
    assert [t["task"] for t in tasks] == [f"{array}_{i}" for i in range(6)]


def test_a_batch_script_is_read_for_directives_and_runs_as_it_was_submitted(service: Service, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/sh\n#GPUPOOL --name scripted --priority low\n#GPUPOOL -o out-%j.log\n#GPUPOOL --mem 64M\n"
        'echo "job $GPUPOOL_JOB_ID says $1"\n'
    )
    given = ("--name", "mine", "--mem-per-gpu", "32M")  # the script's --mem gives way to --mem-per-gpu
    done = service.cli("submit", "--parsable", "--chdir", str(tmp_path), *given, str(script), "hello")
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    script.write_text("#!/bin/sh\necho changed\n")  # the job runs the copy taken at submit
    wait_for(lambda: state(service, job_id) == "succeeded")
    shown = job(service, job_id)
    assert (shown["name"], shown["priority"]) == ("mine", "low")  # the command line wins over a directive
    assert (shown["mem"], shown["mem_per_gpu"]) == (None, 32 << 20)
    assert (tmp_path / f"out-{job_id}.log").read_text() == f"job {job_id} says hello\n"
    assert service.cli("logs", str(job_id)).stdout == f"job {job_id} says hello\n"


def test_a_batch_scripts_elastic_sizes_are_read_and_the_command_lines_gpus_override_them(
    service: Service, tmp_path: Path
) -> None:
    script = tmp_path / "elastic.sh"
    script.write_text("#!/bin/sh\n#GPUPOOL -p low --gpus 1-2 --resize-step pow2\ntrue\n")
    elastic = service.cli("submit", "--parsable", "--chdir", str(tmp_path), str(script))
    assert elastic.returncode == 0, elastic.stderr
    assert (job(service, int(elastic.stdout))["gpus"], job(service, int(elastic.stdout))["sizes"]) == (2, [1, 2])
    # --gpus on the command line: the script's sizes and step give way, whole.
    rigid = service.cli("submit", "--parsable", "--chdir", str(tmp_path), "--gpus", "1", str(script))
    assert rigid.returncode == 0, rigid.stderr
    assert (job(service, int(rigid.stdout))["gpus"], job(service, int(rigid.stdout))["sizes"]) == (1, None)
    script.write_text("#!/bin/sh\n#GPUPOOL -p low --nodes 1-2 --gpus-per-node 2\ntrue\n")
    again = service.cli("submit", "--parsable", "--chdir", str(tmp_path), "--gpus", "2", str(script))
    assert again.returncode == 0, again.stderr
    assert job(service, int(again.stdout))["sizes"] is None


def test_submit_wait_ends_with_the_jobs_outcome(service: Service) -> None:
    assert service.cli("submit", "--wait", "--priority", "low", "--", "sh", "-c", "exit 3").returncode == 3
    assert service.cli("submit", "--wait", "--priority", "low", "--wrap", "true").returncode == 0
    timed_out = service.cli("submit", "--wait", "--priority", "low", "-t", "0:01", "--", "sleep", "60")
    assert timed_out.returncode == 124
    assert "timeout" in timed_out.stderr


def test_a_dependency_holds_across_a_kill_9_and_is_met_after_the_restart(service: Service, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    first = service.submit("--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done")
    then = service.submit("--after", f"ok:{first}", "--", "true")
    wait_for(lambda: job(service, then)["wait_reason"] == "dependency")
    service.kill()
    gate.touch()  # the first job ends while nobody watches
    service.up()
    wait_for(lambda: state(service, then) == "succeeded", timeout=60)
    assert state(service, first) == "succeeded"
    assert job(service, then)["attempts"] == 1
