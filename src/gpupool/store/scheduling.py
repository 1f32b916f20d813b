"""The store as the scheduling core sees it: a snapshot in, a plan recorded before it is acted on."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.errors import Conflict
from gpupool.model import (
    Allocation,
    Job,
    JobState,
    Node,
    Notice,
    Plan,
    PriorityBudget,
    Reason,
    RunningJob,
    Snapshot,
    Team,
    Wait,
)
from gpupool.settle import AttemptOutcome
from gpupool.store.attempts import AttemptsStore
from gpupool.store.holds import HoldsStore
from gpupool.store.schema import AttemptRow, BudgetRow, JobRow, NodeRow, PlacementRow, TeamRow

# What the core needs of a job, read as plain columns: the pending queue can be long, and the
# snapshot is read at every decision, so no ORM objects are built for it.
JOB_COLUMNS = (
    JobRow.id,
    JobRow.team,
    JobRow.priority,
    JobRow.gpus,
    JobRow.submit_time,
    JobRow.gpus_per_node,
    JobRow.gpu_type,
    JobRow.preemptions,
    JobRow.max_preemptions,
    JobRow.nominated_at,
)


def core_job(columns: Sequence[Any], expected_restart: float, queued_at: float | None = None) -> Job:
    """A `Job` for the core from the values of `JOB_COLUMNS`; ids give the arrival order."""
    job_id, team, priority, gpus, submit_time, gpus_per_node, gpu_type, preemptions, cap, nominated_at = columns
    return Job(
        str(job_id),
        team,
        priority,
        gpus,
        submit_time,
        gpus_per_node,
        gpu_type,
        preemptions,
        cap,
        expected_restart,
        order=job_id,
        nominated=nominated_at is not None,
        queued_at=queued_at,
    )


TIME_LIMIT = "time-limit"
"""The `Notice.for_job` of an attempt that leaves at its time limit: no job has that id."""


def _latest(*times: float | None) -> float | None:
    """The latest of the times given, None if none is."""
    return max((t for t in times if t is not None), default=None)


def _maybe_int(value: object) -> int | None:
    return None if value is None else int(str(value))


class SchedulingStore(AttemptsStore, HoldsStore):
    def snapshot(self, now: float) -> Snapshot:
        return self.snapshot_with_holds(now)[0]

    def snapshot_with_holds(self, now: float) -> tuple[Snapshot, list[Wait]]:
        """Nodes, live attempts with their GPUs, pending jobs and budget use, in one read; and
        the pending jobs held back from the core (dependencies, array limits), with why."""
        with self.reading() as s:
            nodes = [
                Node(n.name, n.gpus, n.gpu_type, n.team)
                for n in s.scalars(select(NodeRow).where(NodeRow.up).order_by(NodeRow.name))
            ]
            size = {n.name: n.gpus for n in nodes}
            held: dict[tuple[int, int], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
            for p in s.scalars(select(PlacementRow).where(PlacementRow.held_until.is_(None))):
                # GPUs of a node that left (or came back smaller) are nobody's to give: the core
                # sees only those that are up; the attempt on them is ended by its executor.
                if p.gpu < size.get(p.node, 0):
                    held[(p.job_id, p.attempt)][p.node].append(p.gpu)
            live = s.execute(select(AttemptRow, *JOB_COLUMNS).join(JobRow).where(AttemptRow.ended_at.is_(None)))
            startup = self._startup_times(s)
            running = []
            for attempt, *job in live:
                job_id = job[0]
                placement = tuple(
                    Allocation(node, tuple(sorted(gpus)))
                    for node, gpus in sorted(held[(job_id, attempt.attempt)].items())
                )
                notice = None
                if attempt.notice_at is not None and attempt.notice_deadline is not None:
                    notice = Notice(str(attempt.notice_for), attempt.notice_deadline)
                elif attempt.timeout_at is not None and attempt.notice_deadline is not None:
                    # At its time limit: it leaves by the deadline, for no one in particular (the
                    # core lets a waiting job hold its GPUs instead of preempting others).
                    notice = Notice(TIME_LIMIT, attempt.notice_deadline)
                running.append(
                    RunningJob(
                        core_job(job, startup.get(job_id, 0.0)),
                        placement,
                        attempt.started_at,
                        attempt.last_checkpoint_at,
                        notice,
                        attempt.priority,
                    )
                )
            depends = JobRow.dependencies.is_not(None) & JobRow.dependency_met_at.is_(None)
            pending_rows = s.execute(
                select(
                    *JOB_COLUMNS,
                    depends,
                    JobRow.array_id,
                    JobRow.array_index,
                    JobRow.array_limit,
                    JobRow.dependency_met_at,
                )
                .where(JobRow.state == JobState.PENDING.value)
                .order_by(JobRow.id)
            ).all()
            extra = len(JOB_COLUMNS)
            special = [
                (
                    int(r[0]),
                    bool(r[extra]),
                    _maybe_int(r[extra + 1]),
                    _maybe_int(r[extra + 2]),
                    _maybe_int(r[extra + 3]),
                )
                for r in pending_rows
                if r[extra] or r[extra + 3] is not None
            ]
            holds = self._holds(s, special)
            holds.update(self._launch_retries(s, now))
            ran = self._last_ran(s)
            # Its present wait in line began when its last attempt that ran ended, or when its
            # dependency was met, whichever is later (None: at submit).
            pending = [
                core_job(r[:extra], startup.get(r[0], 0.0), _latest(ran.get(r[0]), r.dependency_met_at))
                for r in pending_rows
                if r[0] not in holds
            ]
            snapshot = Snapshot(nodes, running, pending, self._usage(s, now), teams=self._teams(s))
            return snapshot, list(holds.values())

    @staticmethod
    def _last_ran(s: Session) -> dict[int, float]:
        """Per pending job that ran before, when its last attempt that ran ended (one the
        scheduler failed to launch never ran)."""
        rows = s.execute(
            select(AttemptRow.job_id, func.max(AttemptRow.ended_at))
            .join(JobRow)
            .where(
                JobRow.state == JobState.PENDING.value,
                AttemptRow.outcome.is_distinct_from(AttemptOutcome.NOT_LAUNCHED.value),
            )
            .group_by(AttemptRow.job_id)
        )
        return {job_id: ended for job_id, ended in rows if ended is not None}

    @staticmethod
    def _launch_retries(s: Session, now: float) -> dict[int, Wait]:
        """Pending jobs in their back-off after the scheduler failed to launch them."""
        rows = s.execute(
            select(JobRow.id, JobRow.retry_after, JobRow.launch_error, JobRow.launch_failures).where(
                JobRow.state == JobState.PENDING.value, JobRow.retry_after > now
            )
        )
        return {
            job_id: Wait(
                str(job_id),
                Reason.LAUNCH_RETRY,
                f"the scheduler could not launch it ({error}; {failures} time(s) in a row): it is tried "
                f"again at {datetime.fromtimestamp(retry_after or now, UTC):%H:%M:%S} UTC",
            )
            for job_id, retry_after, error, failures in rows
        }

    @staticmethod
    def _teams(s: Session) -> dict[str, Team]:
        """Each team's policy as the store holds it: the one source the core decides by."""
        budgets: dict[str, list[PriorityBudget]] = defaultdict(list)
        for b in s.scalars(select(BudgetRow).order_by(BudgetRow.team, BudgetRow.priority)):
            budgets[b.team].append(PriorityBudget(b.priority, b.gpu_hours, b.window))
        return {
            t.name: Team(t.name, t.weight, t.guaranteed_gpus, tuple(budgets[t.name]))
            for t in s.scalars(select(TeamRow).order_by(TeamRow.name))
        }

    @staticmethod
    def _startup_times(s: Session) -> dict[int, float]:
        """Per job, how long its latest attempt took from allocation to its first productive
        step: the best guess of what its next restart costs."""
        live_states = [
            JobState.PENDING.value,
            JobState.STARTING.value,
            JobState.RUNNING.value,
            JobState.PREEMPTING.value,
        ]
        rows = s.execute(
            select(AttemptRow.job_id, AttemptRow.started_at, AttemptRow.productive_at)
            .join(JobRow)
            .where(AttemptRow.productive_at.is_not(None), JobRow.state.in_(live_states))
            .order_by(AttemptRow.job_id, AttemptRow.attempt)
        )
        return {job_id: (productive or started) - started for job_id, started, productive in rows}

    def budget_use(self, now: float) -> tuple[list[BudgetRow], dict[tuple[str, str], float]]:
        """Every budget, and GPU-seconds spent per (team, class) inside its window."""
        with self.reading() as s:
            return list(s.scalars(select(BudgetRow).order_by(BudgetRow.team, BudgetRow.priority))), self._usage(s, now)

    @staticmethod
    def _usage(s: Session, now: float) -> dict[tuple[str, str], float]:
        """GPU-seconds per (team, class) inside each budget's window, for the budgets that exist,
        metered at the class each attempt ran at (a demoted attempt uses the lower class's)."""
        budgets = list(s.scalars(select(BudgetRow)))
        usage: dict[tuple[str, str], float] = {}
        for budget in budgets:
            since = now - budget.window
            rows = s.execute(
                select(AttemptRow.started_at, AttemptRow.ended_at, JobRow.gpus)
                .join(JobRow)
                .where(JobRow.team == budget.team)
                .where(func.coalesce(AttemptRow.priority, JobRow.priority) == budget.priority)
                .where((AttemptRow.ended_at.is_(None)) | (AttemptRow.ended_at > since))
            )
            usage[(budget.team, budget.priority)] = sum(
                gpus * max(0.0, min(ended if ended is not None else now, now) - max(started, since))
                for started, ended, gpus in rows
            )
        return usage

    def record_plan(self, plan: Plan, now: float, tokens: Mapping[str, str] | None = None) -> None:
        """Write every decision of `plan`, with its reason, in one transaction, before any of it
        is carried out, with the hash of each new attempt's token (`tokens`, by job) so that its
        reports are accepted from its first instant. If any start would hold a GPU that is
        already held, nothing is written."""
        try:
            with self.transaction() as s:
                for p in plan.preemptions:
                    victim = int(p.victim)
                    attempt = self.locked_job(s, victim).attempts - 1
                    self.notice_in(s, victim, attempt, int(p.for_job), p.deadline, now, p.reason.value, p.message)
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
