"""Findings of a review of the day-one change, through `gpupool up` with real processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_up import Service, running, state

from gpupool.testing import wait_for


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def submit(service: Service, *args: str) -> int:
    done = service.cli("submit", "--parsable", "--priority", "low", *args)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_a_name_that_looks_like_markup_breaks_neither_submit_nor_queue(service: Service) -> None:
    done = service.cli("submit", "--priority", "low", "--name", "run[/]", "--", "sleep", "600")
    assert done.returncode == 0, done.stderr
    assert "run[/]" in done.stdout
    listed = service.cli("queue")
    assert listed.returncode == 0, listed.stderr
    assert "run[/]" in listed.stdout
    assert "run[/]" in service.cli("show", "1").stdout


def test_cancelling_an_array_whose_first_tasks_ended_stops_the_rest_quietly(service: Service) -> None:
    array = submit(service, "--array", "0-3%1", "--", "sh", "-c", 'test "$GPUPOOL_ARRAY_INDEX" = 0 || sleep 600')
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
    job = submit(service, "--chdir", str(tmp_path), "--", "./train.py")
    wait_for(lambda: state(service, job) in ("succeeded", "failed"))
    assert state(service, job) == "succeeded", service.cli("logs", "--stderr", str(job)).stdout
    assert service.cli("logs", str(job)).stdout == "found\n"


def test_logs_follow_a_shared_output_file_once_across_retries(service: Service, tmp_path: Path) -> None:
    out = tmp_path / "shared.log"
    job = submit(
        service, "--max-failures", "1", "-o", str(out), "--", "sh", "-c", 'echo "attempt $GPUPOOL_ATTEMPT"; exit 1'
    )
    followed = service.cli("logs", "-f", str(job))
    assert followed.returncode == 1, followed.stderr
    assert followed.stdout == "attempt 0\nattempt 1\n"
    assert json.loads(service.cli("show", "--json", str(job)).stdout)["attempts"] == 2
