"""Pending jobs the scheduling core does not see yet: those that wait on another job's outcome
(dependencies, as Slurm's afterok/afternotok/afterany) and array tasks past their array's limit
of tasks at once. Each is held with a reason a person can read, like any other wait."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gpupool.model import Reason, Wait
from gpupool.settle import ENDED, JobState
from gpupool.store.base import StoreBase, chunks, indexed
from gpupool.store.schema import DEPENDENCIES_UNMET, EventRow, JobRow

LIVE = (JobState.STARTING.value, JobState.RUNNING.value, JobState.PREEMPTING.value)
KINDS = {"ok": "to succeed", "notok": "to fail", "any": "to end"}
"""Dependency kinds, and what each waits for."""


class Verdict(Enum):
    MET = "met"
    WAITING = "waiting"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class Dependency:
    verdict: Verdict
    message: str


def judge(kind: str, job: int, states: Sequence[JobState]) -> Dependency:
    """Whether a dependency on `job` (its tasks' states, for an array) is met, may still be, or
    never can be."""
    target = f"job {job}"
    ended = [s for s in states if s in ENDED]
    if not states:
        return Dependency(Verdict.NEVER, f"{target} does not exist")
    if kind == "ok":
        bad = next((s for s in ended if s is not JobState.SUCCEEDED), None)
        if bad is not None:
            return Dependency(Verdict.NEVER, f"{target} ended {bad.value}, so it can never succeed")
    if len(ended) == len(states) and kind == "notok" and all(s is JobState.SUCCEEDED for s in ended):
        # For an array, as Slurm: met once every task ended and one of them did not succeed.
        return Dependency(Verdict.NEVER, f"{target} succeeded, so it can never fail")
    if len(ended) == len(states):
        return Dependency(Verdict.MET, f"{target} ended as asked ({KINDS[kind]})")
    now = ", ".join(sorted({s.value for s in states if s not in ENDED}))
    return Dependency(Verdict.WAITING, f"waits for {target} {KINDS[kind]} (it is {now})")


def combined(dependencies: Iterable[Dependency]) -> Dependency:
    """All must be met: one that never can be decides, else one still waiting."""
    items = list(dependencies)
    for verdict in (Verdict.NEVER, Verdict.WAITING):
        found = next((d for d in items if d.verdict is verdict), None)
        if found is not None:
            return found
    return Dependency(Verdict.MET, "; ".join(d.message for d in items))


class HoldsStore(StoreBase):
    @staticmethod
    def _dependencies(s: Session, waiting: Sequence[tuple[int, list[list[object]]]]) -> dict[int, Dependency]:
        """The verdict on each job's dependencies, from one read of the jobs they name (an
        array's id names all its tasks)."""
        targets = {int(str(job)) for _, deps in waiting for _, job in deps}
        states: dict[int, list[JobState]] = defaultdict(list)
        rows = [
            row
            for some in chunks(targets)
            for row in s.execute(
                select(JobRow.id, JobRow.array_id, JobRow.state).where(
                    or_(JobRow.id.in_(some), JobRow.array_id.in_(some))
                )
            )
        ]
        for job_id, array_id, state in rows:
            # A task counts for its array's id and, when it is named itself, for its own.
            if array_id in targets:
                states[array_id].append(JobState(state))
            if job_id in targets and array_id != job_id:
                states[job_id].append(JobState(state))
        return {
            job_id: combined(judge(str(kind), int(str(job)), states.get(int(str(job)), [])) for kind, job in deps)
            for job_id, deps in waiting
        }

    def settle_dependencies(self, now: float) -> bool:
        """Release the pending jobs whose dependencies are met; cancel, saying why, those whose
        dependencies can never be met. Returns whether any job changed."""
        with self.reading() as s:
            unmet = [r[0] for r in indexed(s, "id", "jobs", "ix_jobs_dependencies_unmet", DEPENDENCIES_UNMET)]
            if not unmet:
                return False
            waiting = [
                (job_id, deps)
                for some in chunks(unmet)
                for job_id, deps in s.execute(select(JobRow.id, JobRow.dependencies).where(JobRow.id.in_(some)))
                if deps
            ]
            if not waiting:
                return False
            verdicts = self._dependencies(s, waiting)
        decided = {j: d for j, d in verdicts.items() if d.verdict is not Verdict.WAITING}
        if not decided:
            return False
        with self.transaction() as s:
            for job_id, dependency in decided.items():
                job = self.locked_job(s, job_id)
                if job.state != JobState.PENDING.value or job.dependency_met_at is not None:
                    continue
                if dependency.verdict is Verdict.MET:
                    job.dependency_met_at = now
                    s.add(EventRow(time=now, kind="dependency_met", job_id=job_id, message=dependency.message))
                else:
                    self.move(
                        s,
                        job,
                        JobState.CANCELLED,
                        now,
                        f"cancelled: its dependency can never be met: {dependency.message}",
                    )
                    job.ended_at = now
        return True

    @staticmethod
    def _holds(s: Session, pending: Sequence[tuple[int, bool, int | None, int | None, int | None]]) -> dict[int, Wait]:
        """Of the pending jobs `(id, waits on a dependency, array id, array index, array limit)`,
        those the core must not see yet, each with why."""
        holds: dict[int, Wait] = {}
        waiting = [job_id for job_id, depends, *_ in pending if depends]
        if waiting:
            rows = [
                row
                for some in chunks(waiting)
                for row in s.execute(select(JobRow.id, JobRow.dependencies).where(JobRow.id.in_(some)))
            ]
            for job_id, dependency in HoldsStore._dependencies(s, [(j, d) for j, d in rows if d]).items():
                holds[job_id] = Wait(str(job_id), Reason.DEPENDENCY, dependency.message)
        limits = {array: limit for _, _, array, _, limit in pending if array is not None and limit is not None}
        if limits:
            live = Counter(
                dict(
                    s.execute(
                        select(JobRow.array_id, func.count())
                        .where(JobRow.array_id.in_(list(limits)), JobRow.state.in_(LIVE))
                        .group_by(JobRow.array_id)
                    ).all()
                )
            )
            room = {array: limit - live[array] for array, limit in limits.items()}
            for job_id, _, array, _, limit in sorted(pending, key=lambda p: (p[2] or 0, p[3] or 0)):
                if array is None or limit is None or job_id in holds:
                    continue
                if room[array] > 0:
                    room[array] -= 1
                    continue
                next_up = limit - live[array]
                message = f"array {array} may run {limit} tasks at once: {live[array]} running" + (
                    f", {next_up} next in line before this one" if next_up > 0 else ""
                )
                holds[job_id] = Wait(str(job_id), Reason.ARRAY_LIMIT, message)
        return holds
