"""The store as the scheduling core sees it: a snapshot in, a plan recorded before it is acted on."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from gpupool.errors import Conflict
from gpupool.model import Plan, Preempt, Reason, Snapshot, Wait
from gpupool.store.attempts import AttemptsStore
from gpupool.store.reads import JOB_COLUMNS, TIME_LIMIT, ReadsStore, core_job
from gpupool.store.schema import BudgetRow, JobRow

__all__ = ["JOB_COLUMNS", "TIME_LIMIT", "SchedulingStore", "core_job"]

GROW = "grow"
"""The `reason` of a growth's notice (an elastic job given free GPUs nobody waits for)."""


class SchedulingStore(AttemptsStore, ReadsStore):
    def snapshot(self, now: float) -> Snapshot:
        return self.snapshot_with_holds(now)[0]

    def snapshot_with_holds(self, now: float) -> tuple[Snapshot, list[Wait]]:
        """Nodes, live attempts with their GPUs, pending jobs and budget use, in one read; and
        the pending jobs held back from the core (dependencies, array limits, launch back-offs),
        with why."""
        read = self.read_scheduling(now)
        assert read.nodes is not None
        running = [j.running for j in read.jobs if j.running is not None]
        pending = [j.pending for j in read.jobs if j.pending is not None and j.id not in read.holds]
        return Snapshot(read.nodes, running, pending, read.usage, teams=read.teams), list(read.holds.values())

    def give_notice(self, job_id: int, for_job: int, deadline: float, now: float, message: str) -> None:
        """Record one notice, by priority, as a plan of it alone (`record_plan`)."""
        self.record_plan(
            Plan(preemptions=(Preempt(str(job_id), str(for_job), deadline, Reason.PRIORITY, message),)), now
        )

    def budget_use(self, now: float) -> tuple[list[BudgetRow], dict[tuple[str, str], float]]:
        """Every budget, and GPU-seconds spent per (team, class) inside its window."""
        with self.reading() as s:
            return list(s.scalars(select(BudgetRow).order_by(BudgetRow.team, BudgetRow.priority))), self._usage(s, now)

    def record_plan(self, plan: Plan, now: float, tokens: Mapping[str, str] | None = None) -> None:
        """Write every decision of `plan`, with its reason, in one transaction, before any of it
        is carried out, with the hash of each new attempt's token (`tokens`, by job) so that its
        reports are accepted from its first instant. If any start would hold a GPU that is
        already held, nothing is written."""
        try:
            with self.transaction() as s:
                nominated = set(plan.nominated)
                for p in plan.preemptions:
                    victim = int(p.victim)
                    attempt = self.locked_job(s, victim).attempts - 1
                    self.notice_in(
                        s, victim, attempt, int(p.for_job), p.deadline, now, p.reason.value, p.message, p.keep
                    )
                    if p.for_job in nominated:  # each job its notices are for, at its first
                        nominated.discard(p.for_job)
                        preemptor = s.get(JobRow, int(p.for_job), with_for_update=True)
                        if preemptor is not None and preemptor.nominated_at is None:
                            preemptor.nominated_at = now
                for grow in plan.grows:
                    job_id = int(grow.job)
                    attempt = self.locked_job(s, job_id).attempts - 1
                    self.notice_in(s, job_id, attempt, job_id, grow.deadline, now, GROW, grow.message, grow.placement)
                for start in plan.starts:
                    token = (tokens or {}).get(start.job)
                    self.start_in(s, int(start.job), start.placement, now, start.message, token, start.priority)
                if plan.waits:
                    reasons = [
                        {
                            "id": int(w.job),
                            "wait_reason": w.reason.value,
                            "wait_message": w.message,
                            "held_gpus": {a.node: list(a.gpus) for a in w.placement} or None,
                        }
                        for w in plan.waits
                    ]
                    s.execute(update(JobRow), reasons)
        except IntegrityError as exc:
            raise Conflict("the plan would hold a GPU that is already held; nothing was recorded") from exc
