"""`Job`: a training loop that survives preemption.

    job = Job(model=model, optimizer=optimizer, scheduler=scheduler, data=batches)
    for step in job.steps(10_000):
        train_step(model, optimizer, next(loader))
    job.finish()

`Job(...)` resumes every registered object (anything with `state_dict()`/`load_state_dict()`)
from the newest whole checkpoint; `steps()` yields step numbers from there. Between two steps
it heartbeats, saves when a periodic checkpoint is due (in the background: see `saves`), and on
notice saves (when the save fits before the deadline), acknowledges and ends the process:
gpupool requeues the job and the next attempt resumes. Random number generators are restored
last, when the first step begins.

In a torch.distributed job every rank makes its `Job` (after `init_process_group`); the ranks
agree every second or so (one small all-reduce on a CPU group of their own) on whether to stop
or save, so they do it at the same step. Rank 0 saves the registered objects, every rank its
RNG and `data` position, and rank 0 commits the one checkpoint and speaks to gpupool.
The lower-level calls for a custom loop: `should_stop()`, `step_done()`, `save()`, `leave()`.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from gpupool.job import restart, sharded, state
from gpupool.job.checkpoints import Checkpoint, CheckpointDir, Restored
from gpupool.job.link import Notice, SchedulerLink
from gpupool.job.ranks import Ranks
from gpupool.job.resume import Loader, resume
from gpupool.job.saves import Saved, Saves
from gpupool.units import parse_duration

log = logging.getLogger("gpupool.job")

LEAVE_CODE = 75
"""EX_TEMPFAIL: the job stopped early, saved, and wants to go on."""
EXIT_SECONDS = 1.0
"""Of a notice's time, what leaving takes after the last save (acknowledge, exit)."""
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
        agree_every: float = 1.0,
        directory: str | Path | None = None,
        link: SchedulerLink | None = None,
        save_in_background: bool = True,
        **objects: state.Stateful,
    ) -> None:
        """`save_every`: a number of steps, a duration ("10m"), "auto" (the Young/Daly interval
        from the measured save time and the interruption interval the scheduler passes), or
        None (only on notice and at the end). `data` is saved per rank, the others by rank 0.
        `agree_every`: about how many seconds apart the ranks agree on stopping and saving.
        `save_in_background`: periodic saves copy the state to CPU memory (which stays held
        between saves: as much as the checkpoint) and are written while training goes on;
        False writes them in line. Saves on notice and at the end are always in line."""
        entered = time.time()
        self.link = link or SchedulerLink()
        self.ranks = Ranks()
        self.objects = objects
        self.trained, self.plain = sharded.split(objects) if "torch" in sys.modules else ({}, dict(objects))
        """The sharded modules with their optimizers (saved by every rank, through DCP), and the rest."""
        self.data = data
        self.every_steps, self.every_seconds = save_interval(save_every)
        self.heartbeat_every = heartbeat_every
        self.agree_every = agree_every
        root = Path(directory) if directory is not None else self.link.checkpoint_dir
        self.checkpoints = CheckpointDir(root, keep=keep, attempt=self.link.attempt)
        self.saves = Saves(self.checkpoints, self.ranks, self.link, background=save_in_background)
        self.step = 0
        self.saved_step: int | None = None
        self.last_checkpoint: Checkpoint | None = None
        """The newest committed by this attempt (on rank 0)."""
        self.save_seconds: float | None = None
        """How long the last save blocked training."""
        self.whole_save_seconds: float | None = None
        """How long the last save took from the step boundary to its commit."""
        self.in_line_seconds: float | None = None
        """How long the last save in line took: what an emergency save on notice will take. Until
        there was one, the last background save's whole time stands for it (more, as a rule: a
        background write shares the CPU with training, at the lowest priority)."""
        self.last_commit = time.monotonic()
        self.last_heartbeat = -math.inf
        self.phase = "startup"
        self.restored: Restored | None = None
        self._rng: dict[str, Any] | None = None
        self._agree_every = 1
        self._agreed: tuple[int, tuple[bool, bool]] = (-1, (False, False))
        self._last_agreed = (time.monotonic(), 0)
        self.link.install_signals()
        self._set_phase("restore")
        began = time.monotonic()
        self._restore()
        self.restore_seconds = time.monotonic() - began
        self._startup = (entered, time.time())
        """When `Job()` began and ended: its restore, between the set-up and the data position."""
        self._first_steps: restart.FirstSteps | None = None

    # --- the loop -------------------------------------------------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """Step numbers from the resumed one to `total` - 1; leaves the process on notice."""
        while self.step < total:
            if self.should_stop():
                self.leave()
            yield self.step
            self.step_done()

    def should_stop(self) -> bool:
        """Whether a notice came (by any channel; all ranks answer alike, at the steps where
        they agree). The first call also restores the RNG."""
        self._begin()
        if self.ranks.world == 1:
            return self.link.notice() is not None
        return self._agreement()[0]

    def step_done(self) -> None:
        """A step completed: the data moves on, a heartbeat and a periodic save when due."""
        self._begin()
        self._collect()
        self.step += 1
        if self.data is not None and hasattr(self.data, "advance"):
            self.data.advance()
        timed = self._first_steps.step_done(time.monotonic()) if self._first_steps is not None else None
        if timed is not None and self.ranks.first:
            self.link.heartbeat(self.step, self.phase, time.monotonic() - self.last_commit, **timed)
        if time.monotonic() - self.last_heartbeat >= self.heartbeat_every:
            self.heartbeat()
        if self._save_due():
            if self.saves.background:
                self._save_in_background()
            else:
                self.save()

    def heartbeat(self) -> None:
        self.last_heartbeat = time.monotonic()
        if self.ranks.first:
            self.link.heartbeat(self.step, self.phase, time.monotonic() - self.last_commit)

    def leave(self) -> NoReturn:
        """On notice: let a background save in flight commit if it can before the deadline,
        save in line if the save fits, acknowledge, leave torch.distributed (every process group:
        the process ends), end the process with LEAVE_CODE (gpupool
        requeues a job it gave notice whatever the exit code; a SIGTERM from anyone else must
        not read as success)."""
        self._begin()
        notice = self.link.notice()
        unfinished = self._finish_in_flight(notice)
        short = unfinished or (
            notice is not None and too_late(self.link, notice, self.in_line_seconds or self.whole_save_seconds)
        )
        (no_time,) = self.ranks.agree([float(short)])
        if self.step == 0 and self.restored is None:
            pass  # nothing trained yet: a fresh start is this state (and saving it may change it)
        elif self.saved_step != self.step:
            if no_time:
                log.warning("no time to save step %s before the deadline; resuming from %s", self.step, self.saved_step)
            else:
                self.save()
        if self.ranks.first:
            self.link.report("ack", {})
        self.link.restore_signals()
        self.ranks.close()
        raise SystemExit(LEAVE_CODE)

    def finish(self) -> None:
        """The work is done: a last checkpoint, then tell gpupool (the job succeeds)."""
        self._begin()
        self._collect(wait=True)
        if self.saved_step != self.step:
            self.save()
        self.checkpoints.wait_for_digests()
        if self.ranks.first:
            self.link.report("complete", {})
        self.link.restore_signals()

    # --- checkpoints ----------------------------------------------------------------------------

    def save(self) -> Checkpoint | None:
        """Checkpoint the current step boundary now, in line (on every rank at the same step;
        after the background save in flight, if any), and report the commit. Returns the
        checkpoint on rank 0."""
        self._begin()
        self._collect(wait=True)
        if self.saved_step == self.step:  # the save in flight, or the one resumed, was of this step
            if self.last_checkpoint is None and self.restored is not None:
                return self.restored.checkpoint if self.ranks.first else None
            return self.last_checkpoint
        self._set_phase("save")
        saved = self.saves.in_line(self.step, self._files())
        self._saved(saved)
        self.in_line_seconds = saved.whole
        self._set_phase("train")
        return saved.checkpoint

    def _save_in_background(self) -> None:
        self._collect(wait=True)  # at most one save in flight
        if self.saved_step == self.step:
            return
        self._set_phase("save")
        self.saves.start(self.step, self._files())
        self._set_phase("train")

    def _files(self) -> dict[str, Any]:
        """The checkpoint's files at this step boundary: rank 0's objects, every rank's RNG and data."""
        files: dict[str, Any] = {}
        if self.trained:  # first: a collective, which every rank must reach whatever fails after
            files[sharded.FOLDER] = {name: trained.state_dict() for name, trained in self.trained.items()}
        if self.ranks.first:
            files["objects.pt"] = {name: obj.state_dict() for name, obj in self.plain.items()}
        files[state.rank_file(self.ranks.rank)] = state.rank_state(
            self.data.state_dict() if self.data is not None else None
        )
        return files

    def _collect(self, *, wait: bool = False) -> None:
        """Take in the background save that ended (waiting for it with `wait`); a save that
        failed raises here, at a step boundary, as it would have in line."""
        if wait:
            self.saves.wait()
        flight = self.saves.ended()
        if flight is None:
            return
        if flight.error is not None:
            raise flight.error
        if flight.saved is not None:
            self._saved(flight.saved)

    def _finish_in_flight(self, notice: Notice | None) -> bool:
        """On notice, with a background save in flight: wait for its commit while the deadline
        allows (less a second to leave); otherwise it must not commit. Whether one was abandoned
        (on any rank: every rank takes part, in flight or not, and they all answer alike)."""
        flight = self.saves.in_flight
        finished = True
        if flight is not None:
            left = self.link.seconds_left(notice) if notice is not None else math.inf
            finished = self.saves.wait(None if math.isinf(left) else max(0.0, left - EXIT_SECONDS))
        (unfinished,) = self.ranks.agree([float(not finished)])
        if unfinished:
            if flight is not None and not flight.done.is_set() and flight.abandon():
                log.warning("the save of step %s could not end before the deadline; abandoned", flight.step)
            return True
        try:
            self._collect()
        except Exception as exc:  # the emergency save in line may still succeed
            log.warning("the background save of step %s failed: %s", flight.step if flight else "?", exc)
        return False

    def _saved(self, saved: Saved) -> None:
        self.saved_step = saved.step
        self.save_seconds, self.whole_save_seconds = saved.blocked, saved.whole
        self.last_commit = saved.began + saved.blocked  # work from here on is at risk
        if saved.checkpoint is not None:
            self.last_checkpoint = saved.checkpoint

    def _restore(self) -> None:
        found = resume(self.checkpoints, self.ranks, Loader(self.ranks, self.plain, self.trained, self.data))
        if found is None:
            return
        self.restored, self._rng = found
        self.step = self.saved_step = self.restored.checkpoint.step
        skipped = f" (skipped: {'; '.join(self.restored.skipped)})" if self.restored.skipped else ""
        log.warning("attempt %s resumes from step %s%s", self.link.attempt, self.step, skipped)

    def _save_due(self) -> bool:
        if self.every_steps is not None:
            return self.step % self.every_steps == 0
        if self.every_seconds is None:
            return False
        if self.ranks.world == 1:
            return self._time_to_save()
        return self._agreement()[1]

    def _time_to_save(self) -> bool:
        interval = self.every_seconds
        if interval is None:
            return False
        if self.saves.in_flight is not None:
            return False
        if math.isnan(interval):
            interval = auto_interval(self.save_seconds, self.whole_save_seconds, self.link.interruption_interval)
        return time.monotonic() - self.last_commit >= interval

    def _agreement(self) -> tuple[bool, bool]:
        """(stop, save), the same on every rank. Ranks agree every `_agree_every` steps, about
        every `agree_every` seconds: that count is itself agreed, so they all agree at the same
        steps; in between, neither."""
        if self.step % self._agree_every:
            return False, False
        if self._agreed[0] == self.step:  # asked again at this step (save due, then stop?)
            return self._agreed[1]
        now = time.monotonic()
        since, at_step = self._last_agreed
        step_seconds = (now - since) / (self.step - at_step) if self.step > at_step else 0.0
        stop, save, slowest = self.ranks.agree(
            [float(self.link.notice() is not None), float(self._time_to_save()), step_seconds]
        )
        if slowest > 0:
            self._agree_every = max(1, int(self.agree_every / slowest))
        self._last_agreed = (now, self.step)
        self._agreed = (self.step, (bool(stop), bool(save)))
        return self._agreed[1]

    def _begin(self) -> None:
        if self.phase in ("startup", "restore"):
            if self._rng is not None:
                state.restore_rng(self._rng)
                self._rng = None
            self.phase = "train"
            # Productive work starts now; tell gpupool which checkpoint it starts from.
            self.last_heartbeat = time.monotonic()
            self._last_agreed = (self.last_heartbeat, self.step)
            self._first_steps = restart.FirstSteps(self.last_heartbeat)
            if self.ranks.first:
                entered, restored = self._startup
                said: dict[str, object] = restart.startup(entered, restored)
                if self.restored is not None:
                    skipped = [reason[:400] for reason in self.restored.skipped[:20]]
                    said |= {"restored_step": self.step, "restore_seconds": self.restore_seconds}
                    said["restore_skipped"] = skipped
                self.link.heartbeat(self.step, self.phase, time.monotonic() - self.last_commit, **said)

    def _set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.heartbeat()


def too_late(link: SchedulerLink, notice: Notice, save_seconds: float | None) -> bool:
    """Whether a save of `save_seconds` (as the last one took) no longer fits before the notice's
    deadline, with a margin: better the previous checkpoint than a save cut short."""
    return link.seconds_left(notice) <= 1.5 * (save_seconds or 0.0) + EXIT_SECONDS


def auto_interval(save_seconds: float | None, whole_seconds: float | None, interruption_interval: float) -> float:
    """Seconds between saves with `save_every="auto"`: FIRST_AUTO_SAVE until a save was measured,
    then Young/Daly on what a save blocks, but never sooner than a save takes whole (the next
    would wait for the one in flight)."""
    if save_seconds is None or whole_seconds is None:
        return FIRST_AUTO_SAVE
    return max(math.sqrt(2 * save_seconds * interruption_interval), whole_seconds)


def save_interval(save_every: int | str | None) -> tuple[int | None, float | None]:
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
