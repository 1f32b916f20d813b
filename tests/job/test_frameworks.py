"""The Lightning and Hugging Face examples as real processes: a SIGTERM (gpupool's notice by
signal) in the middle of training makes each save through its framework, leave with exit code
75, and the next run resume; the runs together print the loss bits of a run never stopped."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="needs gpupool[lightning]")
pytest.importorskip("transformers", reason="needs gpupool[huggingface]")

LIGHTNING = [sys.executable, "-m", "gpupool.examples.lightning_trainer"]
HUGGINGFACE = [sys.executable, "-m", "gpupool.examples.hf_trainer"]


def losses(output: str) -> dict[str, str]:
    """'step N [batch M]' -> the loss's bits."""
    return dict(re.findall(r"^(step \d+(?: batch \d+)?) loss (\S+)$", output, re.MULTILINE))


def resumed_from(output: str) -> str:
    """What the example says it resumes from: a checkpoint's path, or 'the start'."""
    found = re.search(r"^attempt \d+: from (.*)$", output, re.MULTILINE)
    assert found is not None, output[-3000:]
    return found.group(1)


def environment(checkpoints: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    return {**env, "GPUPOOL_CHECKPOINT_DIR": str(checkpoints)}


def run(command: list[str], checkpoints: Path, *, notice_at: str | None = None) -> tuple[int, str]:
    """Run to the end, or send SIGTERM once the line starting `notice_at` is printed."""
    process = subprocess.Popen(
        [*command, "--step-seconds", "0.05"],
        env=environment(checkpoints),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if notice_at is not None and line.startswith(f"{notice_at} "):
            process.send_signal(signal.SIGTERM)
    return process.wait(timeout=120), "".join(lines)


def golden(command: list[str], checkpoints: Path) -> str:
    return subprocess.run(
        command, env=environment(checkpoints), capture_output=True, text=True, timeout=180, check=True
    ).stdout


@pytest.mark.parametrize(
    ("command", "notices"),
    [
        pytest.param([*LIGHTNING, "--steps", "30"], ["step 7 batch 7", "step 19 batch 19"], id="lightning"),
        pytest.param(
            [*LIGHTNING, "--steps", "12", "--accumulate", "3"],
            ["step 3 batch 10", "step 8 batch 24"],
            id="lightning-accumulating",
        ),
        # 32 steps an epoch: the second notice comes in the second epoch.
        pytest.param([*HUGGINGFACE, "--steps", "50"], ["step 9", "step 40"], id="huggingface"),
    ],
)
def test_a_framework_job_given_notice_twice_resumes_bit_identical(
    command: list[str], notices: list[str], tmp_path: Path
) -> None:
    expected = golden(command, tmp_path / "golden")
    merged: dict[str, str] = {}
    outputs = []
    for notice_at in [*notices, None]:
        code, output = run(command, tmp_path / "checkpoints", notice_at=notice_at)
        assert code == (75 if notice_at else 0), output[-3000:]
        outputs.append(output)
        for key, bits in losses(output).items():
            assert merged.setdefault(key, bits) == bits, f"{key} differs on resume"
    assert merged == losses(expected)
    assert outputs[-1].strip().splitlines()[-1] == expected.strip().splitlines()[-1], "the same final state"
    for earlier, later in itertools.pairwise(outputs):
        last_step = max(int(key.split()[1]) for key in losses(earlier))
        assert f"step-{last_step + 1:09d}" in resumed_from(later), "resumed at the step after the last one it trained"


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_one_before_used(tmp_path: Path) -> None:
    command = [*LIGHTNING, "--steps", "12", "--save-every", "4"]
    checkpoints = tmp_path / "checkpoints"
    code, _ = run(command, checkpoints, notice_at="step 9 batch 9")
    assert code == 75
    newest = checkpoints / "step-000000010"
    manifest = json.loads((newest / "MANIFEST.json").read_text())
    assert manifest["framework"] == "lightning" and "lightning.ckpt" in manifest["files"]
    with (newest / "lightning.ckpt").open("r+b") as damaged:
        damaged.truncate(100)
    code, output = run(command, checkpoints)
    assert code == 0, output[-3000:]
    assert "step-000000008" in resumed_from(output)
    assert list(checkpoints.glob("step-000000010.damaged-*")) or not newest.exists()
    assert losses(output) == {
        k: v for k, v in losses(golden(command, tmp_path / "golden")).items() if int(k.split()[1]) >= 8
    }


def test_lightning_left_to_itself_would_not_resume_and_is_told_so(tmp_path: Path) -> None:
    """A job that forgets `ckpt_path=` starts over: the callback says checkpoints were there."""
    checkpoints = tmp_path / "checkpoints"
    code, _ = run([*LIGHTNING, "--steps", "8"], checkpoints, notice_at="step 3 batch 3")
    assert code == 75
    script = (
        "import sys; sys.argv = ['x', '--steps', '8'];"
        "import gpupool.integrations.lightning as g; g.GpupoolCallback.ckpt_path = property(lambda self: None);"
        "import gpupool.examples.lightning_trainer as t; t.main()"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=environment(checkpoints),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "was not told to resume from one" in out.stderr
