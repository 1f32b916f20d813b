"""A Lightning job and a Hugging Face Trainer job, each preempted twice through the live
scheduler: the attempts together print the loss bits of a run that nobody interrupted, each
victim saves at its notice (nothing wasted), and the restart's phases add up to its cost."""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live import Service, preempted, running, uninterrupted

pytest.importorskip("lightning", reason="needs gpupool[lightning]")
pytest.importorskip("transformers", reason="needs gpupool[huggingface]")


def losses(output: str) -> dict[str, str]:
    return dict(re.findall(r"^((?:rank \d+ )?step \d+(?: batch \d+)?) loss (\S+)$", output, re.MULTILINE))


def finals(output: str) -> set[str]:
    """What each rank says of its final state."""
    return set(re.findall(r"^(?:rank \d+ )?done: .*$", output, re.MULTILINE))


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path, grace="10s"))


@pytest.mark.parametrize(
    ("trainer", "steps", "notices"),
    [
        # Two DDP processes on the job's two GPUs, which Lightning starts itself.
        pytest.param("lightning_trainer --devices 2", 30, ("rank 0 step 5 ", "rank 0 step 15 "), id="lightning-ddp"),
        pytest.param("hf_trainer", 45, ("step 5 ", "step 36 "), id="huggingface"),  # 32 steps an epoch
    ],
)
def test_a_framework_job_preempted_twice_by_the_scheduler_is_bit_identical(
    service: Service, tmp_path: Path, trainer: str, steps: int, notices: tuple[str, str]
) -> None:
    example, *options = trainer.split()
    command = [sys.executable, "-m", f"gpupool.examples.{example}", *options, "--steps", str(steps)]
    golden = uninterrupted(command, tmp_path / "golden", timeout=180)
    job, outputs = preempted(service, [*command, "--step-seconds", "0.1"], notices, timeout=90)

    assert (job["attempts"], job["preemptions"]) == (3, 2)
    assert job["history"][-1]["step"] == steps, "the final step reaches gpupool before the end"
    for earlier, later in itertools.pairwise(outputs):
        last = max(int(key.split("step ")[1].split()[0]) for key in losses(earlier))
        assert f"step-{last + 1:09d}" in later, "resumed from the step after the last one it trained"
    merged: dict[str, str] = {}
    for output in outputs:
        for key, bits in losses(output).items():
            assert merged.setdefault(key, bits) == bits, f"{key} differs on resume"
    assert merged == losses(golden)
    assert finals(outputs[-1]) == finals(golden), "the same final state"
    account = job["account"]
    assert all(cut["wasted"] == 0 for cut in account["interruptions"]), "each victim saved at its notice"
    assert all(cut["drain"] > 0 for cut in account["interruptions"]), "the save on notice, charged as drain"
    for cut in account["interruptions"]:
        phases = cut["restart_phases"]
        assert [p for p in phases if p in ("launch", "imports", "model build", "restore")] == [
            "launch",
            "imports",
            "model build",
            "restore",
        ], phases
        assert sum(phases.values()) == pytest.approx(cut["restart"])
