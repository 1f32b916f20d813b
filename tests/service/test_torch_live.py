"""A PyTorch job (`gpupool.examples.torch_trainer`) preempted twice through the live scheduler,
once mid-epoch and once in the next epoch: its attempts together print the same per-step loss
bits, and end with the same state hash, as a run that nobody interrupted."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.live import Service, running, state, wait_for

STEPS = 40  # 16 steps an epoch
TRAINER = [sys.executable, "-m", "gpupool.examples.torch_trainer", "--steps", str(STEPS)]


def losses(output: str) -> dict[int, str]:
    return {int(s): bits for s, bits in re.findall(r"^step (\d+) epoch \d+ loss (\S+)$", output, re.MULTILINE)}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def test_a_pytorch_job_preempted_twice_by_the_scheduler_is_bit_identical(service: Service, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_CHECKPOINT_DIR"] = str(tmp_path / "golden")
    golden = subprocess.run(TRAINER, env=env, capture_output=True, text=True, timeout=120, check=True).stdout

    token = (service.data / "admin.token").read_text().strip()
    api = httpx.Client(base_url=f"http://127.0.0.1:{service.port}", headers={"Authorization": f"Bearer {token}"})

    def log(attempt: int) -> str:
        response = api.get("/jobs/1/logs", params={"attempt": attempt})
        return response.text if response.is_success else ""

    command = [*TRAINER, "--step-seconds", "0.1"]
    api.post("/jobs", json={"command": command, "priority": "low", "gpus": 2}).raise_for_status()
    urgent = {"command": ["sleep", "0.3"], "priority": "high", "gpus": 2}
    for attempt, after in ((0, "step 7 "), (1, "step 20 ")):
        wait_for(lambda a=attempt, s=after: s in log(a), timeout=60)  # type: ignore[misc]
        api.post("/jobs", json=urgent).raise_for_status()
    wait_for(lambda: state(service, 1) == "succeeded", timeout=120)

    job = api.get("/jobs/1").json()
    assert (job["attempts"], job["preemptions"]) == (3, 2)
    outputs = [log(a) for a in range(3)]
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
