"""`gpupool export` of a live workload with a known schedule, then `gpupool simulate` of the
export: the replay gives the same interruptions and waits within a stated tolerance.

Through `gpupool up` with real `gpupool.job` trainers on 2 virtual GPUs: a low job runs, a high
job arrives and preempts it, the low job resumes from its notice's checkpoint. The simulator
does not model a process's start-up on its first attempt (about a second here: Python and its
imports) nor the control loop's tick (0.2 s), so each class's mean wait may differ by the
tolerance below, and no more."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live import Service, running, state, wait_for

WAIT_TOLERANCE = 5.0
"""Seconds: start-ups and loop ticks, which the replay leaves out (see the module's text)."""


def trainer(steps: int) -> list[str]:
    return [
        sys.executable, "-m", "gpupool.examples.trainer",
        "--steps", str(steps), "--step-seconds", "0.2", "--save-every", "10",
    ]  # fmt: skip


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def test_export_then_simulate_reproduces_the_interruptions_and_waits(service: Service, tmp_path: Path) -> None:
    low = service.submit("--gpus", "2", "--", *trainer(40))
    wait_for(lambda: "step 5 " in service.cli("logs", str(low)).stdout, timeout=60)
    high = service.submit("--gpus", "2", "--priority", "high", "--", *trainer(10))
    wait_for(lambda: state(service, low) == "succeeded" and state(service, high) == "succeeded", timeout=120)

    history, machines = tmp_path / "out" / "history.csv", tmp_path / "out" / "machines.csv"
    exported = service.cli("export", "-o", str(history), "--machines", str(machines))
    assert exported.returncode == 0, exported.stderr
    assert "2 jobs" in exported.stdout
    assert f"gpupool simulate --trace {history} --machines {machines} --priority-from class" in exported.stdout
    rows = {row["job_id"]: row for row in csv.DictReader(history.open())}
    assert (rows[str(low)]["class"], rows[str(low)]["preemptions"], rows[str(high)]["class"]) == ("low", "1", "high")
    assert 7.0 <= float(rows[str(low)]["duration"]) <= 10.0  # 40 steps of 0.2 s, less what the notice cut
    assert rows[str(low)]["save_cost"] and rows[str(low)]["restart_cost"]
    assert machines.read_text().splitlines()[1:] == ["virtual,2,1"]

    report = tmp_path / "replay.json"
    replayed = service.run_cli(
        service.env, "simulate", "--trace", str(history), "--machines", str(machines), "--priority-from", "class",
        "--policy", "pool-priority", "--json", str(report),
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    (result,) = json.loads(report.read_text())
    assert result["jobs"] == 2
    assert result["preemptions"] == 1
    assert result["by_priority"]["low"]["preemptions"] == 1
    for cls, job in (("low", low), ("high", high)):
        live = float(rows[str(job)]["wait"])
        simulated = result["by_priority"][cls]["wait"]["mean"]
        assert abs(simulated - live) <= WAIT_TOLERANCE, (cls, live, simulated)
