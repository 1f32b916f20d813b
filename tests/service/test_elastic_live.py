"""An elastic job through the live scheduler, on the local executor, with real processes: a
2-rank gloo DDP job (`--gpus 1-2`, a rank per GPU) shrinks to 1 rank for a high job, then grows
back to 2 once that job is done. It never goes back in line; each resumed step's loss, on every
rank, equals a run by hand at the same size from the same checkpoint; and its account charges
both resizes to their cause."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.live import Service, assert_no_gpu_held_twice, given_notice, running, state, wait_for

SCRIPT = Path(__file__).parents[1] / "job" / "elastic_ranks.py"
STEPS = 200
JOB = [sys.executable, str(SCRIPT), "--steps", str(STEPS)]


def losses(output: str) -> dict[tuple[int, int], str]:
    found = re.findall(r"^rank (\d+) step (\d+) loss (\S+)$", output, re.MULTILINE)
    return {(int(rank), int(step)): bits for rank, step, bits in found}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path, grace="20s", more="elastic: {min_time_at_size: 10s}\n"))


def job(service: Service, job_id: int) -> dict[str, Any]:
    response = service.get(f"/jobs/{job_id}?account=true")
    assert response is not None and response.is_success
    return dict(response.json())


def by_hand(sizes: list[int], stops: list[int], checkpoints: Path) -> str:
    """The job run by hand at each of `sizes` in turn, each stopping after its step of `stops`
    (the last runs to the end), from the checkpoint the one before saved: all their output."""
    outputs = []
    for size, stop in zip(sizes, [*stops, -1], strict=True):
        env = {"GPUPOOL_CHECKPOINT_DIR": str(checkpoints), "PATH": "/usr/bin:/bin"}
        command = [*JOB, "--ranks", str(size), "--until", str(stop)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    return "".join(outputs)


def test_a_ddp_job_shrinks_for_a_high_job_then_grows_back_and_goes_on_from_its_checkpoints(
    service: Service, tmp_path: Path
) -> None:
    job_id = service.submit("--gpus", "1-2", "--", *JOB, "--step-seconds", "0.05")
    wait_for(lambda: "rank 1 step 10 " in service.cli("logs", str(job_id)).stdout, timeout=120)
    high = service.run_cli(service.env, "submit", "--parsable", "-p", "high", "--gpus", "1", "--", "sleep", "1")
    assert high.returncode == 0, high.stderr
    wait_for(lambda: state(service, job_id) == "succeeded", timeout=240)

    shown = job(service, job_id)
    history = shown["history"]
    assert [(a["gpus"], a["outcome"]) for a in history] == [(2, "resized"), (1, "resized"), (2, "succeeded")]
    assert shown["preemptions"] == 0, "a resize is no preemption"
    for earlier, later in itertools.pairwise(history):
        assert later["started_at"] == earlier["ended_at"], "started again at once, never back in line"
    assert state(service, int(high.stdout)) == "succeeded"
    causes = [i["cause"] for i in shown["account"]["interruptions"]]
    assert causes == ["resized", "resized"]

    # The attempts that trained (on a loaded machine, the one at 1 GPU may be given notice to
    # grow before its first step: it then saves nothing, and the next resumes where it did).
    logs = [service.cli("logs", str(job_id), "--attempt", str(a)).stdout for a in range(3)]
    trained = [(attempt["gpus"], log) for attempt, log in zip(history, logs, strict=True) if losses(log)]
    stops = [max(step for _, step in losses(log)) for _, log in trained[:-1]]
    for (_, log), stop in zip(trained[1:], stops, strict=True):
        assert f"from step {stop + 1}" in log, "resumed right after its last step"
    live: dict[tuple[int, int], str] = {}
    for _, log in trained:
        live.update(losses(log))
    assert sorted(step for rank, step in live if rank == 0) == list(range(STEPS)), "every step once"
    sizes = [gpus for gpus, _ in trained]
    assert live == losses(by_hand(sizes, stops, tmp_path / "by-hand")), "each step, on each rank, bit for bit"
    assert logs[-1].strip().splitlines()[-1].startswith("done: state ")

    shown_text = service.cli("show", str(job_id)).stdout
    assert "1 to 2 GPUs (elastic: 1, 2, ran at 2 → 1 → 2)" in shown_text
    events = [(e["kind"], e["reason"]) for e in service.get(f"/events?job={job_id}").json()]  # type: ignore[union-attr]
    assert events.count(("preempting", "priority")) == 1 and events.count(("preempting", "grow")) == 1
    assert_no_gpu_held_twice(service)


def test_a_kill_9_during_a_resize_loses_no_job_and_runs_none_twice(service: Service) -> None:
    def trainer(steps: int) -> list[str]:
        return [sys.executable, "-m", "gpupool.examples.trainer", "--steps", str(steps), "--step-seconds", "1"]

    job_id = service.submit("--gpus", "1-2", "--", *trainer(20))
    wait_for(lambda: state(service, job_id) == "running", timeout=60)
    time.sleep(1.5)
    assert service.cli("submit", "--priority", "high", "--", *trainer(2)).returncode == 0
    wait_for(lambda: given_notice(service, job_id), timeout=20)
    service.kill()  # while it drains for its shrink, most times
    service.up()
    wait_for(lambda: state(service, job_id) == "succeeded" and state(service, job_id + 1) == "succeeded", timeout=120)
    shown = job(service, job_id)
    history = shown["history"]
    assert [(a["gpus"], a["outcome"]) for a in history[:1]] == [(2, "resized")]
    assert history[1]["gpus"] == 1, "its next attempt ran at the size the shrink kept"
    assert history[-1]["outcome"] == "succeeded" and shown["preemptions"] == 0
    for earlier, later in itertools.pairwise(history):
        assert later["started_at"] >= earlier["ended_at"], "never two attempts at once"
    logs = [service.cli("logs", str(job_id), "--attempt", str(a["attempt"])).stdout for a in history]
    steps: dict[str, str] = {}
    for log in logs:
        for step, bits in re.findall(r"^step (\d+) loss (\S+)$", log, re.MULTILINE):
            assert steps.setdefault(step, bits) == bits, f"step {step} came out otherwise when done again"
    assert sorted(map(int, steps)) == list(range(20)), "every step, none lost"
    assert "done: 20 steps" in logs[-1]
    assert_no_gpu_held_twice(service)
