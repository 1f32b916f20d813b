"""Real job processes with `gpupool.job`: killed at every phase of a save, in line or in the
background (SIGKILL from a failpoint), or given notice by SIGTERM, they resume from the newest
committed checkpoint, never from step 0 while one exists, and print the very same per-step loss
bits as an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

STEPS = 20
TRAINER = [sys.executable, "-m", "gpupool.examples.trainer", "--steps", str(STEPS), "--save-every", "5"]


def run(
    checkpoints: Path, *, failpoint: str | None = None, step_seconds: float = 0.0, in_line: bool = False
) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_CHECKPOINT_DIR"] = str(checkpoints)
    if failpoint:
        env["GPUPOOL_FAILPOINT"] = failpoint
    command = [*TRAINER, "--step-seconds", str(step_seconds), *(["--save-in-line"] if in_line else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout


def losses(output: str) -> dict[int, str]:
    return {int(step): bits for step, bits in re.findall(r"^step (\d+) loss (\S+)$", output, re.MULTILINE)}


def resumed_from(output: str) -> int:
    found = re.search(r"from step (\d+)", output)
    assert found is not None, output
    return int(found.group(1))


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, str], str]:
    code, output = run(tmp_path_factory.mktemp("golden"))
    assert code == 0, output
    assert sorted(losses(output)) == list(range(STEPS))
    return losses(output), output.strip().splitlines()[-1]


PHASES = [
    ("save:staging@2", 5),
    ("save:between-files@2", 5),
    ("save:before-manifest@2", 5),
    ("save:before-rename@2", 5),
    # Renamed into place is committed: LATEST is for people, resume checks every manifest.
    ("save:before-latest@2", 10),
    # The third save (step 15) is committed, then dies pruning step 5.
    ("save:during-prune", 15),
]
"""Where a save is killed, and the step the next attempt resumes from."""


@pytest.mark.parametrize(
    ("failpoint", "resumes_from", "in_line"),
    [pytest.param(*phase, False, id=f"background-{phase[0]}") for phase in PHASES]
    + [pytest.param(*phase, True, id=f"in-line-{phase[0]}") for phase in PHASES if "staging" not in phase[0]],
)
def test_a_kill_at_any_phase_of_a_save_resumes_from_the_newest_committed_checkpoint_bit_identical(
    tmp_path: Path, golden: tuple[dict[int, str], str], failpoint: str, resumes_from: int, in_line: bool
) -> None:
    code, first = run(tmp_path, failpoint=failpoint, in_line=in_line)
    assert code == -signal.SIGKILL, first
    code, second = run(tmp_path)
    assert code == 0, second
    assert resumed_from(second) == resumes_from
    expected, final = golden
    assert {**losses(first), **losses(second)} == expected
    assert all(expected[s] == bits for s, bits in losses(second).items())
    assert second.strip().splitlines()[-1] == final
    assert not list(tmp_path.glob("*.tmp-*")), "the torn save was cleared by the next attempt's commit"


def test_a_notice_by_sigterm_saves_at_the_next_step_boundary_and_the_resume_is_bit_identical(
    tmp_path: Path, golden: tuple[dict[int, str], str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_CHECKPOINT_DIR"] = str(tmp_path)
    command = [*TRAINER, "--step-seconds", "0.05", "--save-every", "1000"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith("step 7 "):
            process.send_signal(signal.SIGTERM)
            break
    # Not communicate(): it reads the pipe itself and would miss what the loop above buffered.
    rest = process.stdout.read()
    process.wait(timeout=30)
    first = "".join(seen) + rest
    assert process.returncode == 75, first  # EX_TEMPFAIL: saved, stopped early
    last = max(losses(first))
    code, second = run(tmp_path, step_seconds=0.0)
    assert code == 0, second
    assert resumed_from(second) == last + 1
    assert {**losses(first), **losses(second)} == golden[0]
    assert second.strip().splitlines()[-1] == golden[1]
