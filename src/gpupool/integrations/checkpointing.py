"""What a framework's callback needs of gpupool: where to resume from, when to save, where to
write, the commit and its report, heartbeats with the restart's phases, and how to leave.

The framework writes the checkpoint itself (its own format, its own state: model, optimizer,
schedulers, loop counters); `Checkpointing` hands it a fresh folder and commits what it wrote,
as `gpupool.job` commits its own saves. Saves are in line (the framework's save blocks training;
no background write). Every rank makes one; the ranks agree on stopping and saving through
`gpupool.job.ranks.Ranks`, made once the framework has set up torch.distributed
(`training_started`), and rank 0 commits and speaks to gpupool.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import NoReturn

from gpupool.job import restart
from gpupool.job.checkpoints import Checkpoint, CheckpointDir, Restored
from gpupool.job.link import SchedulerLink
from gpupool.job.ranks import Ranks
from gpupool.job.session import LEAVE_CODE, auto_interval, save_interval, too_late

log = logging.getLogger("gpupool.job")


class Checkpointing:
    def __init__(
        self,
        *,
        save_every: int | str | None = "auto",
        keep: int = 2,
        heartbeat_every: float = 2.0,
        directory: str | Path | None = None,
        link: SchedulerLink | None = None,
    ) -> None:
        """`save_every`: a number of steps, a duration ("10m"), "auto" (Young/Daly from the
        measured save time and the scheduler's interruption interval) or None (only on notice)."""
        self.entered = time.time()
        self.link = link or SchedulerLink()
        self.every_steps, self.every_seconds = save_interval(save_every)
        self.heartbeat_every = heartbeat_every
        root = Path(directory) if directory is not None else self.link.checkpoint_dir
        self.checkpoints = CheckpointDir(root, keep=keep, attempt=self.link.attempt)
        self.ranks = Ranks(alone=True)  # until the framework has set up torch.distributed
        self.restored: Restored | None = None
        self.saved_step: int | None = None
        self.save_seconds: float | None = None
        """How long the last save blocked training (all of it: saves are in line)."""
        self.last_commit = time.monotonic()
        self.last_heartbeat = -math.inf
        self._looked = False
        self._restored_at: float | None = None
        self._first_steps: restart.FirstSteps | None = None
        self.link.install_signals()

    # --- resuming -------------------------------------------------------------------------------

    def resume_from(self, name: str) -> Path | None:
        """`name` in the newest committed checkpoint that is whole (damaged ones are set aside),
        None when there is none; raises CheckpointError when checkpoints exist but none is whole."""
        if not self._looked:
            self._looked = True
            found = self.checkpoints.restore(lambda checkpoint: checkpoint)
            if found is not None:
                self.restored = found[0]
                self.saved_step = self.restored.checkpoint.step
                skipped = f" (skipped: {'; '.join(self.restored.skipped)})" if self.restored.skipped else ""
                log.warning("attempt %s resumes from step %s%s", self.link.attempt, self.saved_step, skipped)
        return None if self.restored is None else self.restored.checkpoint.path / name

    # --- the loop -------------------------------------------------------------------------------

    def training_started(self) -> None:
        """The framework has restored its state and set up its ranks: the "restore" phase ends."""
        if self._restored_at is None:
            self._restored_at = time.time()
            self.ranks = Ranks()  # collective: every rank reaches it alike
            self.link.install_signals()  # again: the framework may have put its own handlers in
            if self.ranks.first and self.checkpoints.committed() and not self._looked:
                log.warning("checkpoints exist in %s but the framework was not told to resume from one", self.root)

    def first_step(self, step: int) -> None:
        """The first step begins (at `step`): the start-up is over; tell gpupool how it went."""
        if self._first_steps is not None:
            return
        self.training_started()
        self.last_heartbeat = time.monotonic()
        self._first_steps = restart.FirstSteps(self.last_heartbeat)
        if self.ranks.first:
            assert self._restored_at is not None
            # On a first attempt the framework's time before the first step is its set-up alone.
            restoring = "restore" if self.restored is not None else "framework set-up"
            said = restart.startup(self.entered, self._restored_at, restoring)
            if self.restored is not None:
                said |= {"restored_step": step, "restore_skipped": [r[:400] for r in self.restored.skipped[:20]]}
            self.link.heartbeat(step, "train", time.monotonic() - self.last_commit, **said)

    def step_done(self, step: int) -> tuple[bool, bool]:
        """A step completed (`step` of them in all): heartbeats, and (stop, save) as every rank
        agrees: stop on notice, save when a periodic save is due."""
        self.first_step(step - 1)
        if self.ranks.first:
            timed = self._first_steps.step_done(time.monotonic()) if self._first_steps is not None else None
            if timed is not None:
                self.link.heartbeat(step, "train", time.monotonic() - self.last_commit, **timed)
            if time.monotonic() - self.last_heartbeat >= self.heartbeat_every:
                self.heartbeat(step, "train")
        stop, save = self.ranks.agree([float(self.link.notice() is not None), float(self._save_due(step))])
        return bool(stop), bool(save)

    def heartbeat(self, step: int, phase: str) -> None:
        self.last_heartbeat = time.monotonic()
        if self.ranks.first:
            self.link.heartbeat(step, phase, time.monotonic() - self.last_commit)

    def time_to_save(self, step: int) -> bool:
        """On notice: whether a save of `step` is needed and fits before the deadline (the same
        answer on every rank)."""
        no_time = self.out_of_time(self.save_seconds)
        if self.saved_step == step:
            return False
        if no_time:
            log.warning("no time to save step %s before the deadline; resuming from %s", step, self.saved_step)
        return not no_time

    def out_of_time(self, seconds: float | None) -> bool:
        """On notice: whether the time left before the deadline is too short for `seconds` more
        of saving (the same answer on every rank: a collective)."""
        notice = self.link.notice()
        late = notice is not None and too_late(self.link, notice, seconds)
        (no_time,) = self.ranks.agree([float(late)])
        return bool(no_time)

    def _save_due(self, step: int) -> bool:
        if self.every_steps is not None:
            return step % self.every_steps == 0
        interval = self.every_seconds
        if interval is None:
            return False
        if math.isnan(interval):
            interval = auto_interval(self.save_seconds, self.save_seconds, self.link.interruption_interval)
        return time.monotonic() - self.last_commit >= interval

    # --- saving ---------------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.checkpoints.root

    def begin(self, step: int) -> Path:
        """A fresh folder for checkpoint `step`, on every rank (the same one: rank 0's)."""
        self.heartbeat(step, "save")
        folder = str(self.checkpoints.begin(step)) if self.ranks.first else None
        return Path(self.ranks.share(folder))

    def commit(self, folder: Path, step: int, began: float, **meta: object) -> Checkpoint | None:
        """Commit what every rank wrote into `folder` as checkpoint `step` (the save began at
        `began`, `time.monotonic()`), and report it. The checkpoint on rank 0."""
        self.ranks.agree([0.0])  # every rank has written its part
        checkpoint = None
        if self.ranks.first:
            checkpoint = self.checkpoints.commit(folder, step, {"world": self.ranks.world, **meta})
        self.saved_step = step
        self.save_seconds = time.monotonic() - began
        self.last_commit = time.monotonic()
        if checkpoint is not None:
            body = {"step": step, "path": str(checkpoint.path), "seconds": self.save_seconds, "background_seconds": 0.0}
            self.link.report("checkpoint", body)
        self.heartbeat(step, "train")
        return checkpoint

    # --- the end --------------------------------------------------------------------------------

    def leave(self) -> NoReturn:
        """After the save on notice (or without one, when it did not fit): acknowledge and end
        the process with LEAVE_CODE; gpupool requeues the job and the next attempt resumes."""
        if self.ranks.first:
            self.link.report("ack", {})
        self.link.restore_signals()
        raise SystemExit(LEAVE_CODE)

    def complete(self, step: int) -> None:
        """Training is over after `step` steps: tell gpupool (the job succeeds)."""
        self.checkpoints.wait_for_digests()
        if self.ranks.first:
            self.link.heartbeat(step, "train", time.monotonic() - self.last_commit)
            self.link.flush()  # the final step, before the job ends
            self.link.report("complete", {})
