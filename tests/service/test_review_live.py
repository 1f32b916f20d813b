"""Findings of a review of the day-one change, through `gpupool up` with real processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live import Service, running, state, wait_for


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def test_a_name_that_looks_like_markup_breaks_neither_submit_nor_queue(service: Service) -> None:
    done = service.cli("submit", "--priority", "low", "--name", "run[/]", "--", "sleep", "600")
    assert done.returncode == 0, done.stderr
    assert "run[/]" in done.stdout
    listed = service.cli("queue")
    assert listed.returncode == 0, listed.stderr
    assert "run[/]" in listed.stdout
    assert "run[/]" in service.cli("show", "1").stdout


def test_cancelling_an_array_whose_first_tasks_ended_stops_the_rest_quietly(service: Service) -> None:
    array = service.submit("--array", "0-3%1", "--", "sh", "-c", 'test "$GPUPOOL_ARRAY_INDEX" = 0 || sleep 600')
    wait_for(lambda: state(service, array) == "succeeded" and state(service, array + 1) == "running")
    done = service.cli("cancel", str(array))
    assert done.returncode == 0, done.stderr
    assert "error" not in done.stderr
    wait_for(lambda: all(state(service, array + i) == "cancelled" for i in (1, 2, 3)))


def test_a_script_without_directives_runs_in_place_next_to_its_modules(service: Service, tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("WORD = 'found'\n")
    script = tmp_path / "train.py"
    script.write_text("#!/usr/bin/env python3\nimport helper\nprint(helper.WORD)\n")
    script.chmod(0o755)
    job = service.submit("--chdir", str(tmp_path), "--", "./train.py")
    wait_for(lambda: state(service, job) in ("succeeded", "failed"))
    assert state(service, job) == "succeeded", service.cli("logs", "--stderr", str(job)).stdout
    assert service.cli("logs", str(job)).stdout == "found\n"


def test_logs_follow_a_shared_output_file_once_across_retries(service: Service, tmp_path: Path) -> None:
    out = tmp_path / "shared.log"
    job = service.submit(
        "--max-failures", "1", "-o", str(out), "--", "sh", "-c", 'echo "attempt $GPUPOOL_ATTEMPT"; exit 1'
    )
    followed = service.cli("logs", "-f", str(job))
    assert followed.returncode == 1, followed.stderr
    assert followed.stdout == "attempt 0\nattempt 1\n"
    assert json.loads(service.cli("show", "--json", str(job)).stdout)["attempts"] == 2


def test_a_script_named_without_a_path_or_not_executable_runs_as_sbatch_would(service: Service, tmp_path: Path) -> None:
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\necho plain from $(pwd)\n")
    plain.chmod(0o755)
    bare = tmp_path / "bare.sh"
    bare.write_text("#!/bin/sh\necho bare\n")  # not executable: run from a copy, as sbatch does
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    jobs = []
    for script in ("plain.sh", "bare.sh"):
        done = service.run_cli(
            service.env, "submit", "--parsable", "-p", "low", "-D", str(elsewhere), script, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        jobs.append(int(done.stdout))
    wait_for(lambda: all(state(service, j) in ("succeeded", "failed") for j in jobs))
    assert service.cli("logs", str(jobs[0])).stdout == f"plain from {elsewhere}\n"
    assert service.cli("logs", str(jobs[1])).stdout == "bare\n"


def test_cancel_names_each_job_once_and_says_when_an_array_has_ended(service: Service) -> None:
    array = service.submit("--array", "0-1", "--", "true")
    wait_for(lambda: all(state(service, array + i) == "succeeded" for i in (0, 1)))
    done = service.cli("cancel", str(array))
    assert done.returncode == 5
    assert f"array {array} has already ended" in done.stderr
    waiting = service.submit("--array", "0-2%1", "--", "sleep", "600")
    twice = service.cli("cancel", str(waiting), f"{waiting}_2")
    assert twice.returncode == 0, twice.stderr
    assert twice.stdout.count(f"job {waiting}_2:") == 1
