"""What the simulator knows of each job beside what the core sees: its simulated progress,
and its attempts as the live service would have recorded them, for the accounting both share."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.accounting import INTERRUPTED, AttemptRecord, Commit, account
from gpupool.settle import AttemptOutcome
from gpupool.sim.jobmodel import Attempt, Interruption
from gpupool.sim.records import JobRecord

Ended = tuple[int, Attempt, float, AttemptOutcome, float | None, "Interruption | None", int]
"""An attempt that ended: (its number, its progress, when it ended, its outcome, when it was
given notice, what its notice let it keep, its GPUs): what its `AttemptRecord` is made of,
when needed."""


@dataclass(slots=True)
class Live:
    """A simulated job's changing state."""

    record: JobRecord
    waiting_since: float = 0.0
    """When its present wait in line began (its arrival, or its last requeue)."""
    committed: float = 0.0
    """Work covered by its last committed checkpoint."""
    attempt_no: int = -1
    attempt: Attempt | None = None
    gpus: int = 0
    """The GPUs its attempt runs on (an elastic job's size)."""
    notice_at: float | None = None
    cut: Interruption | None = None
    """Set with the notice: when the attempt will release its GPUs and what it keeps."""
    ended: list[Ended] = field(default_factory=list)
    """Its attempts that ended, for the accounting shared with the live service."""

    def end(self, now: float, outcome: AttemptOutcome) -> None:
        """Its attempt ended at `now` with `outcome`."""
        assert self.attempt is not None
        self.ended.append((self.attempt_no, self.attempt, now, outcome, self.notice_at, self.cut, self.gpus))
        self.attempt = None
        self.notice_at = None
        self.cut = None


def record_of(ended: Ended) -> AttemptRecord:
    """An attempt as the live service would have recorded it: its checkpoint commits are
    the one a notice found last and the one a notice's save made (steps count milliseconds
    of the job's work, so that the next attempt's restored step names one of them)."""
    number, attempt, now, outcome, notice_at, cut, gpus = ended
    commits = []
    if outcome in (AttemptOutcome.NODE_LOST, AttemptOutcome.FAILED):
        at_loss = attempt.at(notice_at if notice_at is not None else now)
        if at_loss.last_commit_at is not None:
            commits.append(Commit(at_loss.last_commit_at, _step(at_loss.committed)))
    elif notice_at is not None and cut is not None:
        at_notice = attempt.at(notice_at)
        if at_notice.last_commit_at is not None:
            commits.append(Commit(at_notice.last_commit_at, _step(at_notice.committed)))
        if cut.committed > at_notice.committed:
            commits.append(Commit(cut.release_at, _step(cut.committed)))
    return AttemptRecord(
        number,
        gpus,
        attempt.start,
        now,
        attempt.productive_start,
        notice_at,
        _step(attempt.committed) if number > 0 else None,
        attempt.restore,
        tuple(commits),
        outcome.value,
    )


def charge(live: Live, now: float) -> None:
    """The job has ended: charge its interruptions, as the service's accounting does (a job
    that was never interrupted lost nothing, and its attempts need no record)."""
    job = live.record.job
    if any(ended[3] in INTERRUPTED for ended in live.ended):
        records = [record_of(ended) for ended in live.ended]
        for cut in account(0, job.team, job.priority, records, now).interruptions:
            lost = cut.wasted + cut.drain + (cut.restart or 0.0)
            live.record.wasted += cut.wasted
            live.record.drain += cut.drain
            live.record.restart += cut.restart or 0.0
            if cut.cause == AttemptOutcome.NODE_LOST:
                live.record.lost_to_nodes += lost
            elif cut.cause == AttemptOutcome.FAILED:
                live.record.lost_to_failure += lost
            elif cut.cause == AttemptOutcome.RESIZED:
                live.record.lost_to_resizes += lost
    live.ended = []


def _step(work: float) -> int:
    return round(work * 1000)
