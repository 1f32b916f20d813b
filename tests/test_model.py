"""The data model's own helpers."""

from __future__ import annotations

from dataclasses import fields, replace

from gpupool.model import Allocation, Job, Notice, RunningJob


def test_checkpointed_is_replace_of_the_last_checkpoint_alone() -> None:
    """`checkpointed` spells every field out for speed: a field added to RunningJob must be
    added there too, or it would be dropped at the next commit the simulator follows."""
    running = RunningJob(
        Job("j", "team", "high", 2, 1.0),
        (Allocation("n0", (0, 1)),),
        5.0,
        last_checkpoint_at=7.0,
        notice=Notice("other", 99.0),
        priority="normal",
    )
    assert [f.name for f in fields(RunningJob)] == [
        "job",
        "placement",
        "started_at",
        "last_checkpoint_at",
        "notice",
        "priority",
    ], "a new field: carry it in RunningJob.checkpointed, then list it here"
    assert running.checkpointed(42.0) == replace(running, last_checkpoint_at=42.0)
    assert running.checkpointed(None) == replace(running, last_checkpoint_at=None)
