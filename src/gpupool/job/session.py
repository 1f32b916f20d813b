"""`Job`: a training loop that survives preemption.

    job = Job(model=model, optimizer=optimizer, scheduler=scheduler, data=batches)
    for step in job.steps(10_000):
        train_step(model, optimizer, next(loader))
    job.finish()

`Job(...)` resumes every registered object (anything with `state_dict()`/`load_state_dict()`)
from the newest whole checkpoint; `steps()` yields step numbers from there. Between two steps
it heartbeats, saves when a periodic checkpoint is due, and on notice saves (when the save fits
before the deadline), acknowledges and ends the process: gpupool requeues the job and the next
attempt resumes. Random number generators are restored last, when the first step begins.
The lower-level calls for a custom loop: `should_stop()`, `step_done()`, `save()`, `leave()`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from gpupool.job import state
from gpupool.job.checkpoints import Checkpoint, CheckpointDir, Restored
from gpupool.job.failpoints import failpoint
from gpupool.job.link import SchedulerLink
from gpupool.units import parse_duration

log = logging.getLogger("gpupool.job")

FIRST_AUTO_SAVE = 300.0
"""With `save_every="auto"`, seconds before the first save, which measures what a save costs."""


class Job:
    def __init__(
        self,
        *,
        data: state.Stateful | None = None,
        save_every: int | str | None = "auto",
        keep: int = 2,
        heartbeat_every: float = 2.0,
        directory: str | Path | None = None,
        link: SchedulerLink | None = None,
        **objects: state.Stateful,
    ) -> None:
        """`save_every`: a number of steps, a duration ("10m"), "auto" (the Young/Daly interval
        from the measured save time and the interruption interval the scheduler passes), or
        None (only on notice and at the end). `data` is saved per rank, the others by rank 0."""
        self.link = link or SchedulerLink()
        self.objects = objects
        self.data = data
        self.every_steps, self.every_seconds = _interval(save_every)
        self.heartbeat_every = heartbeat_every
        self.checkpoints = CheckpointDir(
            Path(directory) if directory is not None else self.link.checkpoint_dir, keep=keep, attempt=self.link.attempt
        )
        self.step = 0
        self.saved_step: int | None = None
        self.save_seconds: float | None = None
        """How long the last save blocked training."""
        self.last_commit = time.monotonic()
        self.last_heartbeat = -math.inf
        self.phase = "startup"
        self.restored: Restored | None = None
        self._rng: dict[str, Any] | None = None
        self.link.install_signals()
        self._set_phase("restore")
        began = time.monotonic()
        found = self.checkpoints.restore(self._load)
        self.restore_seconds = time.monotonic() - began
        if found is not None:
            self.restored, self._rng = found
            self.step = self.saved_step = self.restored.checkpoint.step
            skipped = f" (skipped: {'; '.join(self.restored.skipped)})" if self.restored.skipped else ""
            log.warning("attempt %s resumes from step %s%s", self.link.attempt, self.step, skipped)

    # --- the loop -------------------------------------------------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """Step numbers from the resumed one to `total` - 1; leaves the process on notice."""
        while self.step < total:
            if self.should_stop():
                self.leave()
            yield self.step
            self.step_done()

    def should_stop(self) -> bool:
        """Whether a notice came (by any channel). The first call also restores the RNG."""
        self._begin()
        return self.link.notice() is not None

    def step_done(self) -> None:
        """A step completed: the data moves on, a heartbeat and a periodic save when due."""
        self._begin()
        self.step += 1
        if self.data is not None and hasattr(self.data, "advance"):
            self.data.advance()
        if time.monotonic() - self.last_heartbeat >= self.heartbeat_every:
            self.heartbeat()
        if self._save_due():
            self.save()

    def heartbeat(self) -> None:
        self.last_heartbeat = time.monotonic()
        self.link.heartbeat(self.step, self.phase)

    def leave(self) -> NoReturn:
        """On notice: save if the save fits before the deadline, acknowledge, end the process
        (exit 0; gpupool requeues a job it gave notice whatever the exit code)."""
        notice = self.link.notice()
        if self.saved_step != self.step:
            margin = 1.5 * (self.save_seconds or 0.0) + 1.0
            if notice is None or self.link.seconds_left(notice) > margin:
                self.save()
            else:
                log.warning("no time to save step %s before the deadline; resuming from %s", self.step, self.saved_step)
        self.link.report("ack", {})
        self.link.restore_signals()
        raise SystemExit(0)

    def finish(self) -> None:
        """The work is done: a last checkpoint, then tell gpupool (the job succeeds)."""
        self._begin()
        if self.saved_step != self.step:
            self.save()
        self.link.report("complete", {})
        self.link.restore_signals()

    # --- checkpoints ----------------------------------------------------------------------------

    def save(self) -> Checkpoint:
        """Checkpoint the current step boundary now (blocking), and report the commit."""
        self._set_phase("save")
        began = time.monotonic()
        folder = self.checkpoints.begin(self.step)
        state.write(folder / "objects.pt", {name: obj.state_dict() for name, obj in self.objects.items()})
        failpoint("save:between-files")
        rank = {"rng": state.capture_rng(), "data": self.data.state_dict() if self.data is not None else None}
        state.write(folder / "rank-0.pt", rank)
        checkpoint = self.checkpoints.commit(folder, self.step, {"world": 1})
        self.save_seconds = time.monotonic() - began
        self.last_commit = time.monotonic()
        self.saved_step = self.step
        self.link.report("checkpoint", {"step": self.step, "path": str(checkpoint.path), "seconds": self.save_seconds})
        self._set_phase("train")
        return checkpoint

    def _load(self, checkpoint: Checkpoint) -> dict[str, Any]:
        objects = state.read(checkpoint.path / "objects.pt")
        rank = state.read(checkpoint.path / "rank-0.pt")
        missing = set(self.objects) - set(objects)
        if missing:
            raise ValueError(f"the checkpoint has no state for {', '.join(sorted(missing))}")
        for name, obj in self.objects.items():
            obj.load_state_dict(objects[name])
        if self.data is not None:
            self.data.load_state_dict(rank["data"])
        rng: dict[str, Any] = rank["rng"]
        return rng

    def _save_due(self) -> bool:
        if self.every_steps is not None:
            return self.step % self.every_steps == 0
        if self.every_seconds is None:
            return False
        interval = self.every_seconds
        if math.isnan(interval):  # auto
            interval = FIRST_AUTO_SAVE
            if self.save_seconds is not None:
                interval = math.sqrt(2 * self.save_seconds * self.link.interruption_interval)
        return time.monotonic() - self.last_commit >= interval

    def _begin(self) -> None:
        if self.phase in ("startup", "restore"):
            if self._rng is not None:
                state.restore_rng(self._rng)
                self._rng = None
            self.phase = "train"
            # Productive work starts now; tell gpupool which checkpoint it starts from.
            restored = {"restored_step": self.step, "restore_seconds": self.restore_seconds} if self.restored else {}
            self.last_heartbeat = time.monotonic()
            self.link.heartbeat(self.step, self.phase, **restored)

    def _set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.heartbeat()


def _interval(save_every: int | str | None) -> tuple[int | None, float | None]:
    """(every N steps, every S seconds); NaN seconds stands for "auto"."""
    if save_every is None:
        return None, None
    if save_every == "auto":
        return None, math.nan
    if isinstance(save_every, int) and not isinstance(save_every, bool):
        if save_every < 1:
            raise ValueError(f"save_every: {save_every} steps; give a positive number")
        return save_every, None
    return None, parse_duration(save_every)
