"""The plain-`torchrun` recipe of docs/job-library.md: `torchrun --standalone --nproc-per-node 2 -m
gpupool.examples.fsdp_trainer`, given notice as gpupool gives it (the notice file, then SIGTERM
to the process group), leaves with every rank's shards saved, and the next `torchrun` resumes
bit-identical to a run nobody interrupted."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
TRAINER = ["-m", "gpupool.examples.fsdp_trainer", "--steps", "30", "--save-every", "8"]


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    return env | {
        "GPUPOOL_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "GPUPOOL_NOTICE_FILE": str(tmp_path / "notice"),
    }


def losses(output: str) -> dict[tuple[int, int], str]:
    found = re.findall(r"^rank (\d) step (\d+) loss (\S+)$", output, re.MULTILINE)
    return {(int(rank), int(step)): bits for rank, step, bits in found}


def finished(output: str) -> str:
    found = re.search(r"^done: .* state (\w+)$", output, re.MULTILINE)
    assert found is not None, output
    return found.group(1)


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("golden")
    done = subprocess.run(
        [*TORCHRUN, *TRAINER], env=environment(folder), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_torchrun_given_notice_leaves_saved_and_resumes_bit_identical(tmp_path: Path, golden: str) -> None:
    command = [*TORCHRUN, *TRAINER, "--step-seconds", "0.05"]
    process = subprocess.Popen(
        command, env=environment(tmp_path), stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith("rank 1 step 11 "):
            (tmp_path / "notice").write_text(f'{{"deadline": {time.time() + 60}}}')
            os.killpg(process.pid, signal.SIGTERM)  # as gpupool's launcher does: the whole group
            break
    rest = process.stdout.read()
    process.wait(timeout=120)
    first = "".join(seen) + rest
    assert process.returncode != 0, "torchrun reports its workers' early exit as a failure; gpupool requeues"
    stopped = {rank: max(step for r, step in losses(first) if r == rank) for rank in (0, 1)}
    assert stopped[0] == stopped[1] >= 11, stopped
    (tmp_path / "notice").unlink()
    resumed = subprocess.run(
        command, env=environment(tmp_path), capture_output=True, text=True, timeout=300, check=False
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"from step {stopped[0] + 1}" in resumed.stdout
    merged = {**losses(first), **losses(resumed.stdout)}
    assert merged == losses(golden)
    assert finished(resumed.stdout) == finished(golden)
