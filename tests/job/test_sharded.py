"""FSDP2 (`fully_shard`) on 2 and 4 ranks over gloo, on the CPU: sharded checkpoints written by
every rank through `torch.distributed.checkpoint`, committed once all of them have; a resume at
the same world size is bit-identical to an uninterrupted run; one at another world size resumes
the very same state; a rank killed during a sharded save, or a damaged shard, leaves the
previous checkpoint in force. (On GPUs the same code runs with NCCL for the training; it is
tested only where a GPU is lent.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.up import free_port

SCRIPT = Path(__file__).with_name("sharded_ranks.py")
STEPS = 24


def run(checkpoints: Path, world: int, *extra: str, code: int = 0, failpoint: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_CHECKPOINT_DIR"] = str(checkpoints)
    if failpoint:
        env["GPUPOOL_FAILPOINT"] = failpoint
    command = [sys.executable, str(SCRIPT), "--world", str(world), "--steps", str(STEPS), "--port", str(free_port())]
    done = subprocess.run([*command, *extra], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout


def losses(output: str, rank: int) -> dict[int, str]:
    return {int(s): bits for s, bits in re.findall(rf"^rank {rank} step (\d+) loss (\S+)$", output, re.MULTILINE)}


def state(output: str, when: str) -> str:
    found = re.search(rf"^{when}.*: state (\w+)$", output, re.MULTILINE)
    assert found is not None, output
    return found.group(1)


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    return {world: run(tmp_path_factory.mktemp(f"golden{world}"), world) for world in (2, 4)}


def assert_continues(golden: str, world: int, *outputs: str) -> None:
    for rank in range(world):
        merged: dict[int, str] = {}
        for output in outputs:
            for step, bits in losses(output, rank).items():
                assert merged.setdefault(step, bits) == bits, f"rank {rank} step {step} ran twice, differently"
        assert merged == losses(golden, rank)
    assert state(outputs[-1], "done") == state(golden, "done")


@pytest.mark.parametrize("world", [2, 4])
def test_a_sharded_job_preempted_resumes_bit_identical_at_the_same_world_size(
    tmp_path: Path, golden: dict[int, str], world: int
) -> None:
    first = run(tmp_path, world, "--save-every", "8", "--notice-at", "10", code=75)
    last = max(losses(first, 0))
    assert all(max(losses(first, rank)) == last for rank in range(world)), "every rank stopped at one step"
    checkpoint = tmp_path / f"step-{last + 1:09d}"
    shards = sorted(p.name for p in (checkpoint / "sharded").iterdir())
    assert shards == [".metadata", *(f"__{rank}_0.distcp" for rank in range(world))], "every rank wrote its own"
    assert "objects.pt" in os.listdir(checkpoint)
    resumed = run(tmp_path, world, "--save-every", "8")
    assert f"rank {world - 1} from step {last + 1}" in resumed
    assert_continues(golden[world], world, first, resumed)


def test_resumed_at_another_world_size_the_state_is_the_same_laid_out_anew(tmp_path: Path) -> None:
    saved = run(tmp_path, 2, "--steps", "12")
    resumed = run(tmp_path, 4, "--steps", "16", "--resumed-hash")
    assert "rank 3 from step 12" in resumed
    assert state(resumed, "resumed") == state(saved, "done"), "the parameters and Adam's moments, resharded"
    assert sorted(losses(resumed, 3)) == list(range(12, 16))


def test_a_rank_killed_during_a_sharded_save_leaves_the_previous_checkpoint_in_force(
    tmp_path: Path, golden: dict[int, str]
) -> None:
    saves = ("--save-every", "8")
    killed = run(tmp_path, 2, *saves, "--failpoint-rank", "1", failpoint="save:shards@2", code=128 + signal.SIGKILL)
    assert [p.name for p in tmp_path.glob("step-*") if ".tmp-" not in p.name] == ["step-000000008"]
    resumed = run(tmp_path, 2, *saves)
    assert "rank 1 from step 8" in resumed
    assert_continues(golden[2], 2, killed, resumed)


def test_a_damaged_shard_sets_its_checkpoint_aside_and_the_one_before_is_used(
    tmp_path: Path, golden: dict[int, str]
) -> None:
    first = run(tmp_path, 2, "--save-every", "8", "--steps", "20")
    shard = tmp_path / "step-000000020" / "sharded" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])
    resumed = run(tmp_path, 2, "--save-every", "8")
    assert "rank 1 from step 16" in resumed
    names = sorted(p.name for p in tmp_path.glob("step-*"))
    assert names == ["step-000000016", "step-000000024"], "set aside at the resume, pruned after the next commit"
    assert_continues(golden[2], 2, first, resumed)


def test_a_shard_that_does_not_load_on_its_rank_makes_every_rank_resume_from_the_one_before(
    tmp_path: Path, golden: dict[int, str]
) -> None:
    first = run(tmp_path, 2, "--save-every", "8", "--steps", "20")
    newest = tmp_path / "step-000000020"
    (newest / "DIGESTS.json").unlink()  # as if the job died before hashing: sizes alone say it is whole
    shard = newest / "sharded" / "__1_0.distcp"
    shard.write_bytes(bytes(shard.stat().st_size))  # the same size, nothing readable in it
    resumed = run(tmp_path, 2, "--save-every", "8")
    assert "rank 0 from step 16" in resumed and "rank 1 from step 16" in resumed, "one choice, on every rank"
    assert_continues(golden[2], 2, first, resumed)
