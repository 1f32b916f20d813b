"""What people change of a job after they submitted it, as Slurm's scontrol does: hold and
release a pending job, update its time limit, class or dependencies, requeue a running one.

Each is one transaction that records an event saying who did what. Who may do which (a user
may not raise a time limit, nor release the admin's hold) is the caller's to say: `by_admin`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.errors import Conflict, Forbidden, InvalidInput, NotFound
from gpupool.settle import ENDED, JobState
from gpupool.store.attempts import AttemptsStore
from gpupool.store.holds import KINDS as DEPENDENCY_KINDS
from gpupool.store.reads import REQUEUE
from gpupool.store.schema import EventRow, JobRow, PriorityClassRow, TeamRow
from gpupool.units import human_seconds


@dataclass(frozen=True, slots=True)
class JobUpdate:
    """What `update` changes: only the fields given (None: unchanged)."""

    time_limit: float | None = None
    priority: str | None = None
    dependencies: Sequence[tuple[str, int]] | None = None


class ChangesStore(AttemptsStore):
    def hold_job(self, job_id: int, now: float, *, by_admin: bool) -> JobRow:
        """Hold a pending job: it waits, whatever else it waits on, until released."""
        with self.transaction() as s:
            job = self._pending(s, job_id, "hold")
            if job.held_by == "admin" or (job.held_by == "user" and not by_admin):
                return job
            job.held_by = "admin" if by_admin else "user"
            self._said(s, job, now, "held", f"held by the {job.held_by}")
            return job

    def release_hold(self, job_id: int, now: float, *, by_admin: bool) -> JobRow:
        """Release a held job (the admin's hold only by the admin)."""
        with self.transaction() as s:
            job = self.locked_job(s, job_id)
            if job.held_by is None:
                raise Conflict(f"job {job.label} is not held")
            if job.held_by == "admin" and not by_admin:
                raise Forbidden(f"job {job.label} is held by the admin: only the admin may release it")
            job.held_by = None
            self._said(s, job, now, "released", "released: it waits in line again")
            return job

    def update_job(self, job_id: int, change: JobUpdate, now: float, *, by_admin: bool) -> JobRow:
        """Change a job's time limit (a user only lowers it, or sets one where there was none;
        the admin also raises it), its class or its dependencies (while it waits)."""
        with self.transaction() as s:
            job = self.locked_job(s, job_id)
            if JobState(job.state) in ENDED:
                raise Conflict(f"job {job.label} has already ended ({job.state})")
            said = []
            if change.time_limit is not None:
                said.append(self._new_time_limit(job, change.time_limit, by_admin))
            if change.priority is not None:
                said.append(self._new_class(s, job, change.priority))
            if change.dependencies is not None:
                said.append(self._new_dependencies(s, job, change.dependencies))
            if said:
                self._said(s, job, now, "updated", "; ".join(said))
            return job

    def requeue_job(self, job_id: int, now: float, why: str = "by a person") -> JobRow:
        """Give a running job's live attempt notice, with its class's grace, as a preemption for
        no job: it saves, leaves and goes back in line. `why` says who or what requeued it."""
        with self.transaction() as s:
            job = self.locked_job(s, job_id)
            if job.state not in (JobState.STARTING.value, JobState.RUNNING.value):
                what = "waits in line already" if job.state == JobState.PENDING.value else f"is {job.state}"
                raise Conflict(f"job {job.label} {what}: only a starting or running job is requeued")
            attempt = job.attempts - 1
            row = self.live_attempt(s, job_id, attempt)
            if row.timeout_at is not None or job.cancel_requested_at is not None:
                why = "reached its time limit" if row.timeout_at is not None else "is being cancelled"
                raise Conflict(f"job {job.label} {why}: it ends, it is not requeued")
            cls = s.get(PriorityClassRow, row.priority or job.priority)
            grace = cls.grace_period if cls is not None else 0.0
            message = f"requeued {why}: notice given, it leaves within {human_seconds(grace)} and waits in line"
            self.notice_in(s, job_id, attempt, None, now + grace, now, REQUEUE, message)
            return job

    # --- each change ----------------------------------------------------------------------

    @staticmethod
    def _pending(s: Session, job_id: int, action: str) -> JobRow:
        job = AttemptsStore.locked_job(s, job_id)
        if job.state != JobState.PENDING.value:
            raise Conflict(f"job {job.label} is {job.state}: only a waiting job can be put on {action}")
        return job

    @staticmethod
    def _new_time_limit(job: JobRow, limit: float, by_admin: bool) -> str:
        if not limit > 0:
            raise InvalidInput(f"time_limit: {limit} is not a positive number of seconds")
        if not by_admin and job.time_limit is not None and limit > job.time_limit:
            raise Forbidden(
                f"time_limit: only the admin raises a time limit (job {job.label}'s is "
                f"{human_seconds(job.time_limit)}; {human_seconds(limit)} asked)"
            )
        before = "none" if job.time_limit is None else human_seconds(job.time_limit)
        job.time_limit = limit
        return f"time limit {before} → {human_seconds(limit)}"

    @staticmethod
    def _new_class(s: Session, job: JobRow, priority: str) -> str:
        if job.state != JobState.PENDING.value:
            raise Conflict(f"job {job.label} is {job.state}: its class changes only while it waits")
        if s.get(PriorityClassRow, priority) is None:
            raise NotFound(f"priority: unknown priority class {priority!r}")
        team = s.get(TeamRow, job.team)  # a removed team has no live job
        if team is not None and team.allowed_classes is not None and priority not in team.allowed_classes:
            allowed = ", ".join(team.allowed_classes)
            raise Forbidden(f"team {job.team} may not use class {priority} (allowed: {allowed})")
        before, job.priority = job.priority, priority
        return f"class {before} → {priority}"

    @staticmethod
    def _new_dependencies(s: Session, job: JobRow, dependencies: Sequence[tuple[str, int]]) -> str:
        if job.state != JobState.PENDING.value:
            raise Conflict(f"job {job.label} is {job.state}: its dependencies change only while it waits")
        for kind, _ in dependencies:
            if kind not in DEPENDENCY_KINDS:
                raise InvalidInput(f"after: unknown kind {kind!r} (known: {', '.join(DEPENDENCY_KINDS)})")
        named = {target for _, target in dependencies}
        known = set(s.scalars(select(JobRow.id).where(JobRow.id.in_(named)))) if named else set()
        missing = sorted(named - known)
        if missing:
            raise NotFound(f"after: no job {', '.join(map(str, missing))}")
        if _waits_for(s, named, job.id):
            raise InvalidInput(f"after: job {job.label} would wait for itself (its dependencies lead back to it)")
        job.dependencies = [[kind, target] for kind, target in dependencies] or None
        job.dependency_met_at = None
        words = ", ".join(f"{kind}:{target}" for kind, target in dependencies) or "none"
        return f"dependencies → {words}"

    @staticmethod
    def _said(s: Session, job: JobRow, now: float, kind: str, message: str) -> None:
        s.add(EventRow(time=now, kind=kind, job_id=job.id, message=message))


def _waits_for(s: Session, targets: set[int], job_id: int) -> bool:
    """Whether `job_id` is among the jobs `targets` wait for, directly or not (a dependency on
    an array's id stands for each of its tasks)."""
    seen: set[int] = set()
    frontier = set(targets)
    while frontier:
        seen |= frontier
        query = select(JobRow.id, JobRow.dependencies).where(JobRow.id.in_(frontier) | JobRow.array_id.in_(frontier))
        rows = list(s.execute(query))
        if job_id in frontier or job_id in {found for found, _ in rows}:
            return True
        frontier = {int(target) for _, dependencies in rows for _, target in dependencies or []} - seen
    return False
