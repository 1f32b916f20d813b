"""How a simulated job makes progress, checkpoints, and loses work when interrupted.

An attempt restores for `restart_cost` seconds (attempts after the first), then computes;
after every `interval` seconds of computing it blocks for `save_cost` seconds to write a
checkpoint, which counts once the save ends (a checkpoint commit). Progress is a closed form
of time, so the simulator needs no event per checkpoint. An elastic job's attempt at another
size than its trace's computes at its own `pace` (`sim.elastic`): a second of computing is
`pace` seconds of the trace's work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class JobModel:
    """Checkpoint and restart costs, in seconds, shared by every job of a run."""

    interval: dict[str, float]
    """Seconds of progress between periodic checkpoints, per priority class (inf: never)."""
    default_interval: float = 1800.0
    save_cost: float = 30.0
    """Blocking time of one checkpoint save, periodic or emergency."""
    restart_cost: float = 60.0
    """Time from the start of a resumed attempt to its first productive step."""

    def interval_of(self, priority: str) -> float:
        return self.interval.get(priority, self.default_interval)


class Phase(StrEnum):
    RESTORE = "restore"
    TRAIN = "train"
    SAVE = "save"


@dataclass(frozen=True, slots=True)
class Progress:
    phase: Phase
    progress: float
    """Seconds of the job's work done, saved or not."""
    committed: float
    """Seconds of work covered by the last committed checkpoint."""
    last_commit_at: float | None
    """When this attempt last committed a checkpoint; None before its first."""
    save_ends_at: float | None = None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a simulated job: a closed form of its progress over time."""

    start: float
    restore: float
    committed: float
    """Work covered by the checkpoint this attempt resumed from."""
    work: float
    interval: float
    save_cost: float
    pace: float = 1.0
    """Seconds of the job's work done per second of computing (1.0 at its trace's size)."""

    @property
    def productive_start(self) -> float:
        return self.start + self.restore

    def finish_time(self) -> float:
        remaining = max(0.0, self.work - self.committed)
        if self.pace != 1.0:
            remaining /= self.pace
        saves = 0 if not math.isfinite(self.interval) or remaining == 0 else math.ceil(remaining / self.interval) - 1
        return self.productive_start + remaining + saves * self.save_cost

    def cycles_by(self, t: float) -> int:
        """How many train-and-save cycles have ended at or before t (0 before the first), exact
        where `floor((t - start) / cycle)` rounds across a commit time: a commit is at or
        before t exactly when its time, computed as everywhere here, is."""
        cycle = self.interval + self.save_cost
        k = max(0, math.floor((t - self.productive_start) / cycle))
        while self.productive_start + (k + 1) * cycle <= t:
            k += 1
        while k > 0 and self.productive_start + k * cycle > t:
            k -= 1
        return k

    def commits_around(self, t: float) -> tuple[float | None, float | None]:
        """When the last checkpoint commit at or before t ended (None if none has), and when the
        first one after t will (None if none comes before the finish): `at(t).last_commit_at`
        and `next_commit_after(t)` in one step, for a driver that follows every commit."""
        if not math.isfinite(self.interval):
            return None, None
        cycle = self.interval + self.save_cost
        k = self.cycles_by(t)
        last = self.productive_start + k * cycle if k > 0 else None
        following = self.productive_start + (k + 1) * cycle
        return last, following if following < self.finish_time() else None

    def next_commit_after(self, t: float) -> float | None:
        """When the first checkpoint commit after t ends, or None if none comes before the finish."""
        if not math.isfinite(self.interval):
            return None
        cycle = self.interval + self.save_cost
        commit = self.productive_start + (self.cycles_by(t) + 1) * cycle
        return commit if commit < self.finish_time() else None

    def at(self, t: float) -> Progress:
        """Where the attempt stands at time t (t before the finish time)."""
        if t < self.productive_start:
            return Progress(Phase.RESTORE, self.committed, self.committed, None)
        elapsed = t - self.productive_start
        pace = self.pace
        if not math.isfinite(self.interval):
            return Progress(Phase.TRAIN, min(self.work, self.committed + elapsed * pace), self.committed, None)
        cycle = self.interval + self.save_cost
        k = self.cycles_by(t)
        within = max(0.0, elapsed - k * cycle)
        committed = self.committed + k * self.interval * pace
        last = self.productive_start + k * cycle if k > 0 else None
        if within < self.interval:
            return Progress(Phase.TRAIN, min(self.work, committed + within * pace), committed, last)
        save_ends = self.productive_start + k * cycle + cycle
        return Progress(Phase.SAVE, min(self.work, committed + self.interval * pace), committed, last, save_ends)


@dataclass(frozen=True, slots=True)
class Interruption:
    """What a notice at time t costs: when the GPUs are released and what is kept."""

    release_at: float
    committed: float
    """Work the next attempt resumes from."""
    wasted: float
    """Seconds of progress thrown away (done after the last commit, not saved)."""


def interrupt(attempt: Attempt, t: float, deadline: float) -> Interruption:
    """Notice at t, to be gone by `deadline`: save at once if the save fits, else stop.

    A job in the middle of a periodic save finishes it when the rest of the save fits.
    """
    now = attempt.at(t)
    if now.phase is Phase.RESTORE:
        return Interruption(t, attempt.committed, 0.0)
    if now.phase is Phase.SAVE:
        assert now.save_ends_at is not None
        if now.save_ends_at <= deadline:
            return Interruption(now.save_ends_at, now.progress, 0.0)
        return Interruption(t, now.committed, now.progress - now.committed)
    if t + attempt.save_cost <= deadline and now.progress > now.committed:
        return Interruption(t + attempt.save_cost, now.progress, 0.0)
    return Interruption(t, now.committed, now.progress - now.committed)
