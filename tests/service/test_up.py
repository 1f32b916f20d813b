"""`gpupool up` as a real process, driven by the command line; and a kill -9 in the middle."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.executors.proc import kill_attempts
from tests.support.live import Service, assert_no_gpu_held_twice, given_notice, running, state, wait_for


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def test_up_says_where_it_listens_and_that_its_gpus_are_virtual(service: Service) -> None:
    assert service.process is not None
    service.process.terminate()
    service.process.wait(timeout=10)
    out = service.output()
    assert f"gpupool listening on http://127.0.0.1:{service.port}" in out
    assert "2 virtual GPUs" in out


def test_the_service_log_is_lines_with_times_that_tell_decisions_and_adoptions(tmp_path: Path) -> None:
    """Not on a terminal, at 80 columns: one line a record, each with its time, a URL never cut;
    each start and notice at info, and after a kill -9 the attempts it adopted."""
    service = Service(tmp_path)
    service.env = {k: v for k, v in service.env.items() if k != "COLUMNS"} | {"COLUMNS": "80"}
    service.up()
    job = service.submit("--", "sleep", "60")
    wait_for(lambda: state(service, job) == "running")
    service.kill()
    first = service.output()
    service.up()
    wait_for(lambda: state(service, job) == "running")
    assert service.process is not None
    service.process.terminate()
    service.process.wait(timeout=10)
    second = service.output().removeprefix(first)
    kill_attempts(service.data)
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (INFO|WARNING|ERROR) ")
    for line in (first + second).splitlines():
        assert stamp.match(line), f"not a log line: {line!r}"
    assert (
        f"gpupool listening on http://127.0.0.1:{service.port} (API docs: http://127.0.0.1:{service.port}/docs)"
        in first
    )
    assert f"INFO started job {job} (team default, low) on free GPUs" in first
    assert re.search(rf"INFO adopted job {job} attempt 0 ", second), second
    assert "after the start: 1 of 1 live attempt adopted" in second


def test_submit_queue_logs_and_bad_input_through_the_command_line(service: Service, tmp_path: Path) -> None:
    submitted = service.cli(
        "submit", "--priority", "low", "--name", "hello", "--", "sh", "-c", "echo hi from $GPUPOOL_JOB_ID"
    )
    assert submitted.returncode == 0, submitted.stderr
    assert "submitted job 1" in submitted.stdout
    wait_for(lambda: state(service, 1) == "succeeded")
    assert service.cli("logs", "1").stdout == "hi from 1\n"
    assert "hello" in service.cli("queue", "--all").stdout
    too_big = service.cli("submit", "--priority", "low", "--gpus", "5", "--", "true")
    assert too_big.returncode == 2
    assert "can never fit: 5 GPUs, and the nodes it may use have 2 GPUs in all" in too_big.stderr
    unknown = service.cli("submit", "--priority", "vip", "--", "true")
    assert "unknown priority class 'vip'" in unknown.stderr
    assert "job 9" not in service.cli("queue", "--all").stdout


def test_a_kill_9_of_the_scheduler_loses_no_job_and_runs_none_twice(service: Service) -> None:
    # The two jobs run until the test lets them end (not for a time a loaded machine could miss).
    go = service.data.parent / "go"
    until_told = f"while [ ! -e {go} ]; do sleep 0.1; done; echo done"
    for _ in range(2):
        assert service.cli("submit", "--priority", "low", "--", "sh", "-c", until_told).returncode == 0
    assert service.cli("submit", "--priority", "low", "--", "sh", "-c", "echo third").returncode == 0
    wait_for(lambda: state(service, 1) == "running" and state(service, 2) == "running")
    service.kill()
    time.sleep(1.0)
    service.up()
    go.touch()
    wait_for(lambda: all(state(service, j) == "succeeded" for j in (1, 2, 3)), timeout=60)
    for job in (1, 2):
        assert "1 attempt, 0 preemptions" in service.cli("show", str(job)).stdout
    assert service.cli("logs", "1").stdout == "done\n"
    assert_no_gpu_held_twice(service)


def test_teams_are_managed_from_the_command_line_and_tokens_are_scoped(service: Service) -> None:
    made = service.cli("team", "set", "nlp", "--guaranteed-gpus", "1", "--classes", "low", "--new-token")
    assert made.returncode == 0, made.stderr
    token = made.stdout.rsplit(": ", 1)[1].strip()
    listed = service.cli("team", "list").stdout
    assert "nlp" in listed
    assert "low" in listed
    assert "high" in service.cli("classes").stdout
    as_nlp = {**service.env, "GPUPOOL_TOKEN": token}
    command = [
        sys.executable,
        "-m",
        "gpupool",
        "submit",
        "--config",
        str(service.config),
        "--priority",
        "high",
        "--",
        "true",
    ]
    refused = subprocess.run(command, env=as_nlp, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 5  # refused: the token may not
    assert "team nlp may not use class high (allowed: low)" in refused.stderr
    other = subprocess.run(
        [*command[:-3], "low", "--team", "default", "--", "true"],
        env=as_nlp,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "the token of team nlp may not act on jobs of team default" in other.stderr


def test_a_malformed_configuration_is_refused_with_its_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("service: {port: 8470\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpupool", "up", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "bad.yaml: line 2, column 1: not valid YAML" in result.stderr


def test_a_kill_9_during_preemptions_in_flight_loses_no_job_and_runs_none_twice(service: Service) -> None:
    def trainer(steps: int) -> list[str]:
        return [sys.executable, "-m", "gpupool.examples.trainer", "--steps", str(steps), "--step-seconds", "1"]

    # 20 steps: the victims are still far from their end when the notice comes on a loaded machine
    # (with 6, one finished during its notice and was no preemption).
    for _ in range(2):
        assert service.cli("submit", "--priority", "low", "--", *trainer(20)).returncode == 0
    wait_for(lambda: state(service, 1) == "running" and state(service, 2) == "running")
    time.sleep(1.5)
    assert service.cli("submit", "--priority", "high", "--gpus", "2", "--", *trainer(2)).returncode == 0
    # The notice's record, not the state it leaves in: a loaded machine's reads can miss the
    # second or so a victim drains (a CI run did), and a kill just after it still tests a restart.
    wait_for(lambda: any(given_notice(service, job) for job in (1, 2)), timeout=20)
    service.kill()  # while the victims drain, most times
    service.up()
    wait_for(lambda: all(state(service, j) == "succeeded" for j in (1, 2, 3)), timeout=90)
    for job in (1, 2):
        assert "1 preemption;" in service.cli("show", str(job)).stdout
        assert "done: 20 steps" in service.cli("logs", str(job)).stdout
    assert_no_gpu_held_twice(service)
