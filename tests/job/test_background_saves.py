"""Background saves in one process: the staged copy is the state at the step boundary, a notice
during a save lets it commit when the deadline allows and abandons it when not, and a write that
fails raises at the next step boundary as a save in line would."""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from gpupool.job import Job, checkpoints, state
from gpupool.job.checkpoints import CheckpointDir
from gpupool.job.link import SchedulerLink
from gpupool.job.session import LEAVE_CODE
from gpupool.job.staging import Stager


class Weights:
    """A tensor that training changes in place, as an optimizer does."""

    def __init__(self) -> None:
        self.tensor = torch.zeros(1000)

    def state_dict(self) -> dict[str, Any]:
        return {"tensor": self.tensor}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.tensor.copy_(saved["tensor"])


def link(tmp_path: Path) -> SchedulerLink:
    return SchedulerLink(
        {"GPUPOOL_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "GPUPOOL_NOTICE_FILE": str(tmp_path / "notice")}
    )


def slowed(monkeypatch: pytest.MonkeyPatch, step: int, until: threading.Event, fail: bool = False) -> None:
    """The writes of checkpoint `step` wait for `until` (a slow disk), or fail (a full one)."""
    write = state.write

    def slow(path: Path, value: Any) -> None:
        if f"step-{step:09d}" in str(path):
            if fail:
                raise OSError(28, "No space left on device")
            until.wait(30)
        write(path, value)

    monkeypatch.setattr(state, "write", slow)


def slow_second_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Job, threading.Event]:
    """A job saving every 2 steps in the background, whose write of step 2 waits for the event."""
    released = threading.Event()
    slowed(monkeypatch, 2, released)
    return Job(weights=Weights(), save_every=2, link=link(tmp_path)), released


def notice(tmp_path: Path, seconds: float) -> None:
    (tmp_path / "notice").write_text(json.dumps({"deadline": time.time() + seconds}))


def train(job: Job, at_step_2: Callable[[], None], steps: int = 100) -> list[int]:
    """Run the loop; at step 2 (the save of step 2 is in flight then) call `at_step_2`."""
    reached = []
    for step in job.steps(steps):
        reached.append(step)
        if step == 2:
            assert job.saves.in_flight is not None, "step 2 is being written"
            at_step_2()
    return reached


def committed(tmp_path: Path) -> list[int]:
    return [c.step for c in CheckpointDir(tmp_path / "ckpt").committed()]


def test_the_checkpoint_holds_the_state_of_its_step_though_training_changed_it_during_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = threading.Event()
    slowed(monkeypatch, 2, released)
    weights = Weights()
    job = Job(weights=weights, save_every=2, keep=3, link=link(tmp_path))
    for step in job.steps(6):
        weights.tensor.add_(1)
        if step == 3:
            assert job.saves.in_flight is not None, "step 2 is still being written"
            released.set()
    job.finish()
    for step in (2, 4, 6):
        saved = state.read(tmp_path / "ckpt" / f"step-{step:09d}" / "objects.pt")
        assert torch.equal(saved["weights"]["tensor"], torch.full((1000,), float(step)))
    assert committed(tmp_path) == [6, 4, 2]


def test_a_notice_during_a_background_save_lets_it_commit_then_saves_the_steps_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, released = slow_second_save(tmp_path, monkeypatch)

    def noticed() -> None:
        notice(tmp_path, 60)
        threading.Timer(0.3, released.set).start()

    with pytest.raises(SystemExit) as leaving:
        train(job, noticed)
    assert leaving.value.code == LEAVE_CODE
    assert committed(tmp_path) == [3, 2], "the save in flight committed, then step 3 was saved in line"


def test_a_notice_whose_deadline_the_save_in_flight_cannot_meet_abandons_it_and_leaves_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, released = slow_second_save(tmp_path, monkeypatch)
    given = []

    def noticed_briefly() -> None:
        given.append((job.saves.in_flight, time.time()))
        notice(tmp_path, 1.5)

    with pytest.raises(SystemExit) as leaving:
        train(job, noticed_briefly)
    left = time.time()
    assert leaving.value.code == LEAVE_CODE
    [(flight, noticed)] = given
    assert left - noticed < 1.5, "it left before the deadline"
    assert flight is not None and flight.abandoned
    released.set()  # the slow disk is done at last: the abandoned save must not commit now
    assert flight.done.wait(10)
    assert committed(tmp_path) == []
    assert flight.saved is None


def test_a_save_abandoned_while_its_commit_fsyncs_never_commits_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = threading.Event()
    fsync = checkpoints.fsync_path

    def slow_fsync(path: Path) -> None:
        if "step-000000002.tmp" in str(path):
            released.wait(30)  # a slow disk, inside the commit: past the check before the rename
        fsync(path)

    monkeypatch.setattr(checkpoints, "fsync_path", slow_fsync)
    job = Job(weights=Weights(), save_every=2, link=link(tmp_path))
    given = []

    def noticed_briefly() -> None:
        given.append(job.saves.in_flight)
        notice(tmp_path, 1.5)

    with pytest.raises(SystemExit):
        train(job, noticed_briefly)
    [flight] = given
    assert flight is not None and flight.abandoned
    released.set()
    assert flight.done.wait(10)
    assert committed(tmp_path) == [], "the rename that would commit it did not happen"
    assert not list((tmp_path / "ckpt").glob("step-000000002.tmp-*")), "its files are gone"


def test_a_save_right_after_a_resume_returns_the_checkpoint_it_resumed_from(tmp_path: Path) -> None:
    job = Job(weights=Weights(), save_every=None, link=link(tmp_path))
    for _ in job.steps(3):
        pass
    job.finish()
    resumed = Job(weights=Weights(), save_every=None, link=link(tmp_path))
    checkpoint = resumed.save()
    assert checkpoint is not None and checkpoint.step == 3
    resumed.link.restore_signals()


def test_a_background_write_that_fails_raises_at_the_next_step_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slowed(monkeypatch, 2, threading.Event(), fail=True)
    job = Job(weights=Weights(), save_every=2, link=link(tmp_path))

    def failed() -> None:
        assert job.saves.in_flight is not None
        assert job.saves.in_flight.done.wait(10)

    with pytest.raises(OSError, match="No space left"):
        train(job, failed)
    assert job.step == 2, "raised at the end of step 2, the first boundary after the failure"
    job.link.restore_signals()
    assert committed(tmp_path) == []


class Pair(NamedTuple):
    first: Any
    second: Any


def test_staging_copies_every_kind_of_value_and_keeps_its_buffers_between_saves() -> None:
    weights = collections.OrderedDict(w=torch.arange(4.0), step=torch.tensor(3))
    weights._metadata = {"": {"version": 2}}  # type: ignore[attr-defined]
    value = {"model": weights, "pair": Pair([1, 2], (torch.ones(2),)), "lr": 0.1, "names": ["a"]}
    stager = Stager()
    staged = stager.stage(value)
    assert type(staged["model"]) is collections.OrderedDict
    assert staged["model"]._metadata == {"": {"version": 2}}  # type: ignore[attr-defined]
    assert isinstance(staged["pair"], Pair) and isinstance(staged["pair"].second, tuple)
    assert staged["names"] is not value["names"]
    weights["w"].add_(1)
    assert torch.equal(staged["model"]["w"], torch.arange(4.0)), "a copy, not a view"
    again = stager.stage(value)
    assert again["model"]["w"].data_ptr() == staged["model"]["w"].data_ptr(), "the buffer is reused"
    assert torch.equal(again["model"]["w"], torch.arange(4.0) + 1)
    assert stager.held_bytes == 4 * 4 + 8 + 2 * 4
    weights["w"] = torch.zeros(8)
    grown = stager.stage(value)
    assert grown["model"]["w"].shape == (8,) and stager.held_bytes == 8 * 4 + 8 + 2 * 4


def test_a_resumed_optimizer_does_not_keep_the_checkpoint_file_mapped(tmp_path: Path) -> None:
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    job = Job(model=model, optimizer=optimizer, save_every=None, link=link(tmp_path))
    job.save()
    job.link.restore_signals()
    again = torch.nn.Linear(64, 64)
    resumed_optimizer = torch.optim.Adam(again.parameters())
    resumed = Job(model=again, optimizer=resumed_optimizer, save_every=None, link=link(tmp_path))
    resumed.link.restore_signals()
    assert torch.equal(again.weight, model.weight)
    assert torch.equal(
        resumed_optimizer.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"]
    )
    maps = Path("/proc/self/maps").read_text()
    assert str(tmp_path / "ckpt") not in maps, "the file is no longer mapped: pruning it frees its space"


def test_batches_resharded_keep_the_epoch_and_the_items_used_at_another_world_and_batch_size() -> None:
    from gpupool.job import Batches

    before = Batches(512, batch_size=8, seed=3, rank=1, world=2)
    before.epoch, before.used = 2, 160  # 10 steps of 8 on each of 2 ranks
    after = Batches(512, batch_size=4, seed=3, rank=3, world=4)
    after.load_state_dict(after.resharded(before.state_dict()))
    assert (after.epoch, after.used, after.position) == (2, 160, 10), "160 items: 10 steps of 4 on each of 4 ranks"
