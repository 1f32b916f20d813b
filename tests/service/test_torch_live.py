"""A PyTorch job (`gpupool.examples.torch_trainer`) preempted twice through the live scheduler,
once mid-epoch and once in the next epoch: its attempts together print the same per-step loss
bits, and end with the same state hash, as a run that nobody interrupted."""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live import Service, preempted, running, uninterrupted

STEPS = 40  # 16 steps an epoch
TRAINER = [sys.executable, "-m", "gpupool.examples.torch_trainer", "--steps", str(STEPS)]


def losses(output: str) -> dict[int, str]:
    return {int(s): bits for s, bits in re.findall(r"^step (\d+) epoch \d+ loss (\S+)$", output, re.MULTILINE)}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def test_a_pytorch_job_preempted_twice_by_the_scheduler_is_bit_identical(service: Service, tmp_path: Path) -> None:
    golden = uninterrupted(TRAINER, tmp_path / "golden", timeout=120)
    job, outputs = preempted(service, [*TRAINER, "--step-seconds", "0.1"], ("step 7 ", "step 20 "), timeout=60)

    assert (job["attempts"], job["preemptions"]) == (3, 2)
    for earlier, later in itertools.pairwise(outputs):
        assert f"from step {max(losses(earlier)) + 1}" in later, "resumed right after its last step"
    merged: dict[int, str] = {}
    for output in outputs:
        for step, bits in losses(output).items():
            assert merged.setdefault(step, bits) == bits
    assert merged == losses(golden)
    assert outputs[-1].strip().splitlines()[-1] == golden.strip().splitlines()[-1]
    assert all(i["wasted"] == 0 for i in job["account"]["interruptions"]), "each victim saved at its notice"
    # Each restart, phase by phase: what the job said adds up to what the accounting charges,
    # within a heartbeat (the first step's heartbeat reaches the scheduler a moment after).
    costs = {cost["attempt"]: cost for cost in job["account"]["attempts"]}
    for cut in job["account"]["interruptions"]:
        phases = cut["restart_phases"]
        named = [p for p in phases if p in ("launch", "imports", "model build", "restore")]
        assert named == ["launch", "imports", "model build", "restore"], phases
        assert sum(phases.values()) == pytest.approx(cut["restart"])
        following = job["history"][cut["attempt"] + 1]
        said = following["restart"]
        launch = said["process_started_at"] - following["started_at"]
        startup = costs[following["attempt"]]["startup"] / job["gpus"]
        assert 0 <= launch + sum(said["phases"].values()) <= startup + 0.01
        assert startup - (launch + sum(said["phases"].values())) < 2.0, "within a heartbeat"
        assert said["first_step"] > 0 and said["steady_step"] > 0
