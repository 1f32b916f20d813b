"""What the simulator knows of each job beside what the core sees: its simulated progress,
and its attempts as the live service would have recorded them, for the accounting both share."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.accounting import INTERRUPTED, AttemptRecord, Commit, account
from gpupool.settle import AttemptOutcome
from gpupool.sim.jobmodel import Attempt, Interruption
from gpupool.sim.records import JobRecord


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
    notice_at: float | None = None
    cut: Interruption | None = None
    """Set with the notice: when the attempt will release its GPUs and what it keeps."""
    attempts: list[AttemptRecord] = field(default_factory=list)
    """What each ended attempt did, for the accounting shared with the live service."""


def record_attempt(live: Live, attempt: Attempt, now: float, outcome: AttemptOutcome) -> AttemptRecord:
    """The attempt as the live service would have recorded it: its checkpoint commits are
    the one a notice found last and the one a notice's save made (steps count milliseconds
    of the job's work, so that the next attempt's restored step names one of them)."""
    commits = []
    if outcome in (AttemptOutcome.NODE_LOST, AttemptOutcome.FAILED):
        at_loss = attempt.at(live.notice_at if live.notice_at is not None else now)
        if at_loss.last_commit_at is not None:
            commits.append(Commit(at_loss.last_commit_at, _step(at_loss.committed)))
    elif live.notice_at is not None and live.cut is not None:
        at_notice = attempt.at(live.notice_at)
        if at_notice.last_commit_at is not None:
            commits.append(Commit(at_notice.last_commit_at, _step(at_notice.committed)))
        if live.cut.committed > at_notice.committed:
            commits.append(Commit(live.cut.release_at, _step(live.cut.committed)))
    return AttemptRecord(
        live.attempt_no,
        live.record.job.gpus,
        attempt.start,
        now,
        attempt.productive_start,
        live.notice_at,
        _step(attempt.committed) if live.attempt_no > 0 else None,
        attempt.restore,
        tuple(commits),
        outcome.value,
    )


def charge(live: Live, now: float) -> None:
    """The job has ended: charge its interruptions, as the service's accounting does."""
    job = live.record.job
    if any(a.outcome in INTERRUPTED for a in live.attempts):  # else it lost nothing
        for cut in account(0, job.team, job.priority, live.attempts, now).interruptions:
            lost = cut.wasted + cut.drain + (cut.restart or 0.0)
            live.record.wasted += cut.wasted
            live.record.drain += cut.drain
            live.record.restart += cut.restart or 0.0
            if cut.cause == AttemptOutcome.NODE_LOST:
                live.record.lost_to_nodes += lost
            elif cut.cause == AttemptOutcome.FAILED:
                live.record.lost_to_failure += lost
    live.attempts = []


def _step(work: float) -> int:
    return round(work * 1000)
