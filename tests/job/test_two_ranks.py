"""Two ranks on gloo: a notice that only rank 1 sees stops both at the same step, one checkpoint
holds both ranks' state, and the resumed run is bit-identical to an uninterrupted one; a rank
killed while it writes its part of a background save leaves the previous checkpoint in force."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.up import free_port

SCRIPT = Path(__file__).with_name("two_ranks.py")
STEPS = 30


def run(checkpoints: Path, *extra: str, code: int = 0, failpoint: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_CHECKPOINT_DIR"] = str(checkpoints)
    if failpoint:
        env["GPUPOOL_FAILPOINT"] = failpoint
    command = [sys.executable, str(SCRIPT), "--steps", str(STEPS), "--port", str(free_port()), *extra]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout


def losses(output: str, rank: int) -> dict[int, str]:
    found = re.findall(rf"^rank {rank} step (\d+) loss (\S+)$", output, re.MULTILINE)
    return {int(step): bits for step, bits in found}


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> str:
    return run(tmp_path_factory.mktemp("golden"))


def test_a_notice_to_one_rank_stops_both_at_one_step_and_the_resume_is_bit_identical(
    tmp_path: Path, golden: str
) -> None:
    first = run(tmp_path, "--notice-rank1-at", "5", code=75)
    last = {rank: max(losses(first, rank)) for rank in (0, 1)}
    assert last[0] == last[1] >= 5, f"ranks stopped at different steps: {last}"
    assert last[0] < STEPS - 1, "it stopped early, on notice"
    (checkpoint,) = tmp_path.glob("step-*")
    files = sorted(p.name for p in checkpoint.iterdir() if "DIGESTS" not in p.name)  # hashed after the commit
    assert files == ["MANIFEST.json", "objects.pt", "rank-0.pt", "rank-1.pt"]
    # Resumed, given notice again: the ranks still agree about every 5 steps (they time their
    # steps from the resume, not from step 0).
    second = run(tmp_path, "--notice-rank1-at", "15", code=75)
    assert f"rank 1 from step {last[0] + 1}" in second
    again = {rank: max(losses(second, rank)) for rank in (0, 1)}
    assert again[0] == again[1]
    assert 15 <= again[0] <= 15 + 8, f"stopped at {again}, long after its notice"
    third = run(tmp_path)
    for rank in (0, 1):
        assert {**losses(first, rank), **losses(second, rank), **losses(third, rank)} == losses(golden, rank)
    assert third.strip().splitlines()[-1] == golden.strip().splitlines()[-1]


def test_one_rank_killed_while_writing_a_background_save_leaves_the_previous_checkpoint_in_force(
    tmp_path: Path, golden: str
) -> None:
    saves = ("--save-every", "10")
    run(tmp_path, *saves, "--failpoint-rank", "1", failpoint="save:between-files@2", code=128 + 9)
    assert [p.name for p in tmp_path.glob("step-*") if ".tmp-" not in p.name] == ["step-000000010"]
    resumed = run(tmp_path, *saves)
    assert "rank 0 from step 10" in resumed and "rank 1 from step 10" in resumed
    for rank in (0, 1):
        assert all(losses(golden, rank)[s] == bits for s, bits in losses(resumed, rank).items())
        assert sorted(losses(resumed, rank)) == list(range(10, STEPS))
    assert resumed.strip().splitlines()[-1] == golden.strip().splitlines()[-1]


def test_a_notice_to_one_rank_with_background_saves_stops_both_and_the_resume_is_bit_identical(
    tmp_path: Path, golden: str
) -> None:
    saves = ("--save-every", "4")
    first = run(tmp_path, *saves, "--notice-rank1-at", "9", code=75)
    last = {rank: max(losses(first, rank)) for rank in (0, 1)}
    assert last[0] == last[1] >= 9
    resumed = run(tmp_path, *saves)
    assert f"rank 1 from step {last[0] + 1}" in resumed, "the steps since the last background save were saved"
    for rank in (0, 1):
        assert {**losses(first, rank), **losses(resumed, rank)} == losses(golden, rank)
    assert resumed.strip().splitlines()[-1] == golden.strip().splitlines()[-1]
