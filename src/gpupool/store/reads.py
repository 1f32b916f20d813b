"""What the scheduling core reads of the store: everything, or what changed since a read.

Every write to what the core reads leaves the job's id in the `changes` journal (a trigger,
migration 0011), so a read can take only the jobs changed since an earlier one. Where a read
stands in the journal is its `position`: on SQLite, whose writers take turns, the last change
made; on PostgreSQL, whose transactions commit in any order, the oldest transaction the read
does not see yet, so that the next read takes every change it could not see (some twice: a
job read twice is read as it is, which changes nothing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select, text, true
from sqlalchemy.orm import Session

from gpupool.model import (
    Allocation,
    Job,
    Node,
    Notice,
    PriorityBudget,
    Reason,
    RunningJob,
    Team,
    Wait,
    budget_use,
    job_label,
)
from gpupool.settle import AttemptOutcome, JobState
from gpupool.store.base import chunks
from gpupool.store.holds import HoldsStore
from gpupool.store.schema import (
    ATTEMPT_GPUS,
    AttemptRow,
    BudgetRow,
    ChangeRow,
    JobRow,
    NodeRow,
    PlacementRow,
    TeamRow,
    placement_of,
)

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
    JobRow.array_id,
    JobRow.array_index,
    JobRow.sizes,
)
HOLD_COLUMNS = (
    JobRow.dependencies.is_not(None) & JobRow.dependency_met_at.is_(None),
    JobRow.array_id,
    JobRow.array_index,
    JobRow.array_limit,
    JobRow.dependency_met_at,
    JobRow.launch_error,
    JobRow.retry_after,
    JobRow.launch_failures,
    JobRow.held_by,
)
"""What decides whether a job in line is held back from the core (`_special`, `_launch_retries`)."""

TIME_LIMIT = "time-limit"
"""The `Notice.for_job` of an attempt that leaves at its time limit: no job has that id."""
REQUEUE = "requeue"
"""The `Notice.for_job` of an attempt a person requeued (`gpupool requeue`): it leaves for no job."""

CHANGES_AT_MOST = 5000
"""Jobs changed since the last read beyond which a read takes everything (fewer queries)."""


def core_job(columns: Sequence[Any], expected_restart: float, queued_at: float | None = None) -> Job:
    """A `Job` for the core from the values of `JOB_COLUMNS`; ids give the arrival order."""
    *head, sizes = columns
    job_id, team, priority, gpus, submit_time, per_node, gpu_type, preemptions, cap, nominated_at, array, index = head
    return Job(
        str(job_id),
        team,
        priority,
        gpus,
        submit_time,
        per_node,
        gpu_type,
        preemptions,
        cap,
        expected_restart,
        order=job_id,
        nominated=nominated_at is not None,
        queued_at=queued_at,
        task=job_label(job_id, array, index) if array is not None else None,
        sizes=tuple(sizes or ()),
    )


@dataclass(frozen=True, slots=True)
class JobNow:
    """One job as the scheduling core may see it now: its live attempt (`running`), and it in
    line (`pending`; None: it is not), with whether its holds are read again at every read
    (`watched`: in line with dependencies, an array's limit or a launch back-off). A job with
    neither has ended."""

    id: int
    running: RunningJob | None = None
    pending: Job | None = None
    watched: bool = False
    reason: str | None = None
    """In line: the reason to wait the store holds for it (the last one written)."""


@dataclass(frozen=True, slots=True)
class SchedulingRead:
    """What the scheduling core reads of the store, in one transaction: everything (`nodes`
    given), or the jobs changed since an earlier read (`nodes` None: they did not change)."""

    position: int
    """Where the change journal stood for this read (the next read starts from it)."""
    nodes: list[Node] | None
    jobs: list[JobNow]
    holds: dict[int, Wait]
    """The held jobs among those in line read or watched, with why."""
    usage: dict[tuple[str, str], float]
    teams: dict[str, Team]
    whole: SchedulingRead | None = None
    """Everything, read in the same transaction (asked for to check the changes against it)."""


class ReadsStore(HoldsStore):
    def read_scheduling(
        self, now: float, since: int | None = None, watched: Collection[int] = (), *, whole: bool = False
    ) -> SchedulingRead:
        """Everything the core reads; or, `since` the position of an earlier read, the jobs
        changed since, with the holds of those and of the `watched` ones (a change of the
        nodes, or more than CHANGES_AT_MOST changed jobs, reads everything). `whole`: read
        everything too, in the same transaction."""
        with self.reading() as s:
            position = self._position(s)
            changed = self._changed_since(s, since) if since is not None else None
            usage, teams = self._usage(s, now), self._teams(s)
            if changed is None:
                return self._read_whole(s, now, position, usage, teams)
            read = SchedulingRead(position, None, *self._jobs_now(s, now, changed, watched), usage, teams)
            if whole:
                read = replace(read, whole=self._read_whole(s, now, position, usage, teams))
            return read

    def prune_changes(self, position: int) -> int:
        """Forget the changes a read at `position` has taken (every later read starts there or
        after); returns how many were forgotten."""
        with self.transaction() as s:
            sqlite = s.get_bind().dialect.name == "sqlite"
            seen = ChangeRow.seq <= position if sqlite else ChangeRow.xid < position
            return int(getattr(s.execute(delete(ChangeRow).where(seen)), "rowcount", 0) or 0)

    @staticmethod
    def _position(s: Session) -> int:
        """Where the journal stands for this transaction's reads (see the module's docstring)."""
        if s.get_bind().dialect.name == "sqlite":
            last = s.execute(text("SELECT seq FROM sqlite_sequence WHERE name = 'changes'")).scalar()
            return int(last or 0)
        return int(s.execute(text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")).scalar_one())

    @staticmethod
    def _changed_since(s: Session, position: int) -> list[int] | None:
        """The jobs changed since `position`; None when the nodes changed or too many jobs did
        (everything is read then)."""
        sqlite = s.get_bind().dialect.name == "sqlite"
        after = ChangeRow.seq > position if sqlite else ChangeRow.xid >= position
        ids = list(s.scalars(select(ChangeRow.job_id).where(after).distinct().limit(CHANGES_AT_MOST + 1)))
        if None in ids or len(ids) > CHANGES_AT_MOST:
            return None
        return [i for i in ids if i is not None]

    def _read_whole(
        self, s: Session, now: float, position: int, usage: dict[tuple[str, str], float], teams: dict[str, Team]
    ) -> SchedulingRead:
        nodes = [
            Node(n.name, n.gpus, n.gpu_type, n.team)
            for n in s.scalars(select(NodeRow).where(NodeRow.up).order_by(NodeRow.name))
        ]
        return SchedulingRead(position, nodes, *self._jobs_now(s, now, None, ()), usage, teams)

    def _jobs_now(
        self, s: Session, now: float, ids: Sequence[int] | None, watched: Collection[int]
    ) -> tuple[list[JobNow], dict[int, Wait]]:
        """The jobs of `ids` (None: every job running or in line) as they are now, and the holds
        of those in line among them and of the `watched` ones."""

        def only(column: Any) -> Any:
            return column.in_(ids) if ids is not None else true()

        startup = self._startup_times(s, ids)
        found = {j.id: j for j in self._running_now(s, only, startup)}
        in_line = JobRow.state == JobState.PENDING.value
        query = select(*JOB_COLUMNS, *HOLD_COLUMNS, JobRow.wait_reason).where(in_line).order_by(JobRow.id)
        rows = list(s.execute(query.where(only(JobRow.id))))
        read = set(ids) if ids is not None else set()
        for others in chunks(j for j in watched if j not in read):
            rows += s.execute(query.where(JobRow.id.in_(others)))
        extra = len(JOB_COLUMNS)
        specials = {int(r[0]): special for r in rows if (special := _special(r[0], r[extra:])) is not None}
        holds = self._holds(s, list(specials.values()))
        holds.update(_launch_retries(rows, now))
        holds.update(_held(rows))
        ran = self._last_ran(s, ids)
        for r in rows:
            job_id = int(r[0])
            if ids is not None and job_id not in read:
                continue  # watched for its holds only: it did not change
            # Its present wait in line began when its last attempt that ran ended, or when its
            # dependency was met, whichever is later (None: at submit).
            pending = core_job(r[:extra], startup.get(job_id, 0.0), _latest(ran.get(job_id), r.dependency_met_at))
            watch = job_id in specials or r.retry_after is not None
            before = found.get(job_id)
            found[job_id] = JobNow(
                job_id, before.running if before is not None else None, pending, watch, r.wait_reason
            )
        for job_id in read:
            found.setdefault(job_id, JobNow(job_id))
        return list(found.values()), holds

    @staticmethod
    def _running_now(s: Session, only: Any, startup: Mapping[int, float]) -> list[JobNow]:
        """The live attempts of the jobs `only` lets through, as the core sees them."""
        held: dict[tuple[int, int], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        # GPUs of a node that left (or came back smaller) are nobody's to give: the core sees
        # only those that are up; the attempt on them is ended by its executor.
        placements = (
            select(PlacementRow.job_id, PlacementRow.attempt, PlacementRow.node, PlacementRow.gpu)
            .join(NodeRow, NodeRow.name == PlacementRow.node)
            .where(PlacementRow.held_until.is_(None), NodeRow.up, PlacementRow.gpu < NodeRow.gpus)
            # A growth's added GPUs are its notice's (`Notice.keep`), not the attempt's.
            .where(PlacementRow.added.is_not(True))
        )
        for job_id, attempt_no, node, gpu in s.execute(placements.where(only(PlacementRow.job_id))):
            held[(job_id, attempt_no)][node].append(gpu)
        up = dict(s.execute(select(NodeRow.name, NodeRow.gpus).where(NodeRow.up)).all())
        live = s.execute(
            select(AttemptRow, *JOB_COLUMNS).join(JobRow).where(AttemptRow.ended_at.is_(None), only(JobRow.id))
        )
        found = []
        for attempt, *job in live:
            job_id = job[0]
            placement = tuple(
                Allocation(node, tuple(sorted(gpus))) for node, gpus in sorted(held[(job_id, attempt.attempt)].items())
            )
            notice = None
            if attempt.notice_at is not None and attempt.notice_deadline is not None:
                for_job = REQUEUE if attempt.notice_for is None else str(attempt.notice_for)
                notice = Notice(for_job, attempt.notice_deadline, placement_of(attempt.notice_keep, up))
            elif attempt.timeout_at is not None and attempt.notice_deadline is not None:
                # At its time limit: it leaves by the deadline, for no one in particular (the
                # core lets a waiting job hold its GPUs instead of preempting others).
                notice = Notice(TIME_LIMIT, attempt.notice_deadline)
            core = core_job(job, startup.get(job_id, 0.0))
            running = RunningJob(
                core.at_size(attempt.gpus or core.gpus),
                placement,
                attempt.started_at,
                attempt.last_checkpoint_at,
                notice,
                attempt.priority,
            )
            found.append(JobNow(job_id, running))
        return found

    @staticmethod
    def _last_ran(s: Session, ids: Sequence[int] | None) -> dict[int, float]:
        """Per pending job of `ids` (None: all) that ran before, when its last attempt that ran
        ended (one the scheduler failed to launch never ran)."""
        query = (
            select(AttemptRow.job_id, func.max(AttemptRow.ended_at))
            .join(JobRow)
            .where(
                JobRow.state == JobState.PENDING.value,
                AttemptRow.outcome.is_distinct_from(AttemptOutcome.NOT_LAUNCHED.value),
            )
            .group_by(AttemptRow.job_id)
        )
        if ids is not None:
            query = query.where(JobRow.id.in_(ids))
        return {job_id: ended for job_id, ended in s.execute(query) if ended is not None}

    @staticmethod
    def _startup_times(s: Session, ids: Sequence[int] | None = None) -> dict[int, float]:
        """Per job of `ids` (None: all), how long its latest attempt took from allocation to its
        first productive step: the best guess of what its next restart costs."""
        live_states = [
            JobState.PENDING.value,
            JobState.STARTING.value,
            JobState.RUNNING.value,
            JobState.PREEMPTING.value,
        ]
        query = (
            select(AttemptRow.job_id, AttemptRow.started_at, AttemptRow.productive_at)
            .join(JobRow)
            .where(AttemptRow.productive_at.is_not(None), JobRow.state.in_(live_states))
            .order_by(AttemptRow.job_id, AttemptRow.attempt)
        )
        if ids is not None:
            query = query.where(JobRow.id.in_(ids))
        return {job_id: (productive or started) - started for job_id, started, productive in s.execute(query)}

    @staticmethod
    def _teams(s: Session) -> dict[str, Team]:
        """Each team's policy as the store holds it: the one source the core decides by."""
        budgets: dict[str, list[PriorityBudget]] = defaultdict(list)
        for b in s.scalars(select(BudgetRow).order_by(BudgetRow.team, BudgetRow.priority)):
            budgets[b.team].append(PriorityBudget(b.priority, b.gpu_hours, b.window))
        return {
            t.name: Team(t.name, t.weight, t.guaranteed_gpus, tuple(budgets[t.name]))
            for t in s.scalars(select(TeamRow).where(TeamRow.removed_at.is_(None)).order_by(TeamRow.name))
        }

    @staticmethod
    def _usage(s: Session, now: float) -> dict[tuple[str, str], float]:
        """GPU-seconds per (team, class) inside each budget's window, for the budgets that exist,
        metered at the class each attempt ran at (a demoted attempt uses the lower class's)."""
        budgets = list(s.scalars(select(BudgetRow)))
        usage: dict[tuple[str, str], float] = {}
        for budget in budgets:
            since = now - budget.window
            rows = s.execute(
                select(AttemptRow.started_at, AttemptRow.ended_at, ATTEMPT_GPUS)
                .join(JobRow)
                .where(JobRow.team == budget.team)
                .where(func.coalesce(AttemptRow.priority, JobRow.priority) == budget.priority)
                .where((AttemptRow.ended_at.is_(None)) | (AttemptRow.ended_at > since))
            )
            usage[(budget.team, budget.priority)] = budget_use(rows, now, budget.window)
        return usage


def _latest(*times: float | None) -> float | None:
    """The latest of the times given, None if none is."""
    return max((t for t in times if t is not None), default=None)


def _maybe_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _special(job_id: object, hold: Sequence[Any]) -> tuple[int, bool, int | None, int | None, int | None] | None:
    """(id, waits on a dependency, array id, array index, array limit) of a job in line that
    waits on dependencies or is an array's task with a limit (`HoldsStore._holds`); None if not."""
    depends, array_id, array_index, array_limit = bool(hold[0]), hold[1], hold[2], hold[3]
    if not depends and array_limit is None:
        return None
    return (int(str(job_id)), depends, _maybe_int(array_id), _maybe_int(array_index), _maybe_int(array_limit))


def _held(rows: Sequence[Any]) -> dict[int, Wait]:
    """The jobs of `rows` a person holds (`gpupool hold`), whatever else holds them."""
    return {
        int(r[0]): Wait(
            str(r[0]),
            Reason.HELD,
            f"held by the {'admin' if r.held_by == 'admin' else 'user'}: it waits until released "
            f"(gpupool release {job_label(r[0], r.array_id, r.array_index)})",
        )
        for r in rows
        if r.held_by is not None
    }


def _launch_retries(rows: Sequence[Any], now: float) -> dict[int, Wait]:
    """The jobs of `rows` in their back-off after the scheduler failed to launch them."""
    holds = {}
    for r in rows:
        error, retry_after, failures = r.launch_error, r.retry_after, r.launch_failures
        if retry_after is not None and retry_after > now:
            holds[int(r[0])] = Wait(
                str(r[0]),
                Reason.LAUNCH_RETRY,
                f"the scheduler could not launch it ({error}; {failures} time(s) in a row): it is tried "
                f"again at {datetime.fromtimestamp(retry_after, UTC):%H:%M:%S} UTC",
            )
    return holds
