"""Real PyTorch on the CPU, real processes: a training run preempted at awkward points (first
step, mid-epoch, at an epoch boundary, during a save, twice in one epoch) prints the very same
per-step loss bits and ends with the very same state hash as a run that was never interrupted."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

STEPS = 40  # 16 steps an epoch
TRAINER = [sys.executable, "-m", "gpupool.examples.torch_trainer", "--steps", str(STEPS)]


def environment(checkpoints: Path, failpoint: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_CHECKPOINT_DIR"] = str(checkpoints)
    if failpoint:
        env["GPUPOOL_FAILPOINT"] = failpoint
    return env


def attempt(
    checkpoints: Path, notice_after: str | None, *, failpoint: str | None = None, leaves: bool = False, **options: str
) -> str:
    """One attempt; SIGTERM (a notice) once a line starting with `notice_after` is printed. It
    must exit 0 when it finished, 75 when it left on a notice."""
    command = [*TRAINER, "--step-seconds", "0.05" if notice_after else "0"]
    for key, value in options.items():
        command += [f"--{key.replace('_', '-')}", *([value] if value else [])]
    process = subprocess.Popen(command, env=environment(checkpoints, failpoint), stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if notice_after is not None and line.startswith(notice_after):
            process.send_signal(signal.SIGTERM)
            break
    # Not communicate(): it reads the pipe itself and would miss what the loop above buffered.
    rest = process.stdout.read()
    process.wait(timeout=120)
    assert process.returncode == (75 if leaves or notice_after else 0), "".join(seen) + rest
    return "".join(seen) + rest


def losses(output: str) -> dict[int, str]:
    return {int(s): bits for s, bits in re.findall(r"^step (\d+) epoch \d+ loss (\S+)$", output, re.MULTILINE)}


def final(output: str) -> str:
    return output.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> str:
    output = attempt(tmp_path_factory.mktemp("golden"), None)
    assert sorted(losses(output)) == list(range(STEPS))
    return output


@pytest.mark.parametrize(
    "notices",
    [
        pytest.param(["attempt 0"], id="first-step"),
        pytest.param(["step 7 "], id="mid-epoch"),
        pytest.param(["step 15 "], id="epoch-boundary"),
        pytest.param(["step 3 ", "step 9 "], id="twice-in-one-epoch"),
    ],
)
def test_preempted_at_awkward_points_the_run_is_bit_identical(tmp_path: Path, golden: str, notices: list[str]) -> None:
    outputs = [attempt(tmp_path, after) for after in notices]
    outputs.append(attempt(tmp_path, None))
    for earlier, later in itertools.pairwise(outputs):
        found = re.search(r"from step (\d+)", later)
        assert found is not None, later
        resumed = int(found.group(1))
        assert resumed == max(losses(earlier), default=-1) + 1, "resumed from the step after the last one run"
    merged: dict[int, str] = {}
    for output in outputs:
        for step, bits in losses(output).items():
            assert merged.setdefault(step, bits) == bits
    assert merged == losses(golden)
    assert final(outputs[-1]) == final(golden)


def test_a_notice_during_a_save_in_line_leaves_at_the_next_boundary_without_saving_again(
    tmp_path: Path, golden: str
) -> None:
    options = {"save_every": "10", "save_in_line": ""}
    first = attempt(tmp_path, None, failpoint="save:before-manifest=SIGTERM", leaves=True, **options)
    assert max(losses(first)) == 9, "it left right after the save of step 10 committed"
    assert [p.name for p in sorted(tmp_path.glob("step-*"))] == ["step-000000010"]
    second = attempt(tmp_path, None)
    assert "from step 10" in second
    assert {**losses(first), **losses(second)} == losses(golden)
    assert final(second) == final(golden)


def test_a_notice_during_a_background_save_lets_it_commit_then_saves_the_steps_since(
    tmp_path: Path, golden: str
) -> None:
    first = attempt(tmp_path, None, failpoint="save:before-manifest=SIGTERM", save_every="10", leaves=True)
    left_after = max(losses(first))
    assert left_after >= 9, "training went on while step 10 was written"
    names = [p.name for p in sorted(tmp_path.glob("step-*"))]
    assert names[0] == "step-000000010", "the save in flight committed"
    assert names[-1] == f"step-{left_after + 1:09d}", "and the steps run since were saved on leaving"
    second = attempt(tmp_path, None)
    assert f"from step {left_after + 1}" in second
    assert {**losses(first), **losses(second)} == losses(golden)
    assert final(second) == final(golden)


@pytest.mark.parametrize(
    ("failpoint", "resumes_from"),
    [
        ("save:staging@2", 10),
        ("save:between-files@2", 10),
        ("save:before-manifest@2", 10),
        ("save:before-rename@2", 10),
        ("save:before-latest@2", 20),
        ("save:during-prune", 30),
    ],
)
def test_a_sigkill_at_any_phase_of_a_save_resumes_from_the_newest_committed_checkpoint(
    tmp_path: Path, golden: str, failpoint: str, resumes_from: int
) -> None:
    command = [*TRAINER, "--save-every", "10"]
    env = environment(tmp_path, failpoint)
    killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = attempt(tmp_path, None, save_every="10")
    assert f"from step {resumes_from}" in resumed, "never from step 0 while a committed checkpoint exists"
    merged = {**losses(killed.stdout), **losses(resumed)}
    assert merged == losses(golden)
    assert all(losses(golden)[s] == bits for s, bits in losses(resumed).items())
    assert final(resumed) == final(golden)
