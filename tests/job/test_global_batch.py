"""A constant global batch across a resize (issue 36): a 2-rank job at a global batch of 16
shrunk to 1 rank goes on with 2 accumulated batches a step, and each step's loss over the global
batch stays that of a run that kept its 2 ranks (the same items, summed in another order)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("elastic_ranks.py")
STEPS = 30


def run(checkpoints: Path, ranks: int, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_CHECKPOINT_DIR"] = str(checkpoints)
    command = [sys.executable, str(SCRIPT), "--steps", str(STEPS), "--ranks", str(ranks), "--global-batch", "16"]
    done = subprocess.run([*command, *extra], env=env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def global_losses(output: str) -> dict[int, float]:
    """Each step's loss over its global batch: the mean of its ranks' (each the mean of theirs)."""
    by_step: dict[int, list[float]] = {}
    for step, bits in re.findall(r"^rank \d+ step (\d+) loss (\S+)$", output, re.MULTILINE):
        by_step.setdefault(int(step), []).append(float.fromhex(bits))
    return {step: sum(losses) / len(losses) for step, losses in by_step.items()}


def test_a_job_shrunk_to_one_rank_keeps_its_global_batch_and_its_loss_curve(tmp_path: Path) -> None:
    kept = global_losses(run(tmp_path / "two", 2))
    before = run(tmp_path / "elastic", 2, "--until", "9")
    after = run(tmp_path / "elastic", 1)
    assert "rank 0 of 1 from step 10" in after
    resized = {**global_losses(before), **global_losses(after)}
    assert sorted(resized) == sorted(kept) == list(range(STEPS))
    for step in range(STEPS):
        assert abs(resized[step] - kept[step]) <= 1e-5 * max(1.0, abs(kept[step])), f"step {step}"
