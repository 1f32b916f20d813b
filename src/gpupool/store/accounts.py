"""The store's records of attempts, as the accounting reads them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from gpupool.accounting import AttemptRecord, Commit, JobAccount, account
from gpupool.history import EndedJob
from gpupool.settle import ENDED, JobState, Usage
from gpupool.store.base import StoreBase
from gpupool.store.schema import AttemptRow, CheckpointRow, EventRow, JobRow


class AccountsStore(StoreBase):
    def interruption_intervals(self, since: float, now: float) -> dict[str, float]:
        """Per priority class, the mean running time between interruptions that came without a
        notice the job could act on (failures, lost processes, notices it never acknowledged),
        over the attempts since `since`: the M of the Young/Daly checkpoint interval. Classes
        with no such interruption are left out."""
        with self.reading() as s:
            query = (
                select(
                    JobRow.priority, AttemptRow.started_at, AttemptRow.ended_at, AttemptRow.outcome, AttemptRow.acked_at
                )
                .join(JobRow)
                .where((AttemptRow.ended_at.is_(None)) | (AttemptRow.ended_at >= since))
            )
            running: dict[str, float] = defaultdict(float)
            cuts: dict[str, int] = defaultdict(int)
            for priority, started, ended, outcome, acked in s.execute(query):
                running[priority] += (ended if ended is not None else now) - max(started, since)
                cut = outcome in ("failed", "out_of_memory", "lost", "node_lost")
                if cut or (outcome == "preempted" and acked is None):
                    cuts[priority] += 1
        return {priority: running[priority] / n for priority, n in cuts.items()}

    def accounts(
        self, now: float, *, job_ids: Sequence[int] | None = None, since: float | None = None
    ) -> list[JobAccount]:
        """The account of each job that held GPUs at or after `since` (counting its attempts
        that ended since then, or run), or of `job_ids`."""
        return [
            account(job.id, job.team, job.priority, records, now, job.user or "", JobState(job.state) in ENDED)
            for job, records in self.attempt_records(job_ids=job_ids, since=since)
        ]

    def ended_jobs(
        self, *, since: float | None = None, team: str | None = None
    ) -> list[tuple[EndedJob, list[AttemptRecord]]]:
        """The jobs that ended, submitted at or after `since` (of `team`, or every team's), each
        with its attempts as the accounting reads them, in the order of their ids."""
        query = select(
            JobRow.id,
            JobRow.team,
            JobRow.priority,
            JobRow.gpus,
            JobRow.gpus_per_node,
            JobRow.gpu_type,
            JobRow.user,
            JobRow.state,
            JobRow.submit_time,
            JobRow.preemptions,
            JobRow.node_losses,
        ).where(JobRow.state.in_([state.value for state in ENDED]))
        if since is not None:
            query = query.where(JobRow.submit_time >= since)
        if team is not None:
            query = query.where(JobRow.team == team)
        with self.reading() as s:
            jobs = [EndedJob(*row) for row in s.execute(query.order_by(JobRow.id))]
        # The jobs chosen again by a subquery, not a list of ids: a year of jobs is a few reads.
        chosen = query.with_only_columns(JobRow.id)
        records = {job.id: attempts for job, attempts in self._attempt_records(chosen, None)}
        return [(job, records.get(job.id, [])) for job in jobs]

    def attempt_records(
        self, *, job_ids: Sequence[int] | None = None, since: float | None = None
    ) -> list[tuple[AccountedJob, list[AttemptRecord]]]:
        """Each job with attempts (of `job_ids`, or that held GPUs at or after `since`) and
        what the accounting reads of them, in the order of the jobs' ids. Plain columns, no
        ORM objects, and the jobs chosen by a subquery, not a list of ids: a report over a
        year of jobs is a few reads, whatever their number."""
        which = select(AttemptRow.job_id)
        if job_ids is not None:
            which = which.where(AttemptRow.job_id.in_(list(job_ids)))
        if since is not None:
            which = which.where((AttemptRow.ended_at.is_(None)) | (AttemptRow.ended_at >= since))
        return self._attempt_records(which.distinct(), since)

    def _attempt_records(self, chosen: Any, since: float | None) -> list[tuple[AccountedJob, list[AttemptRecord]]]:
        """`attempt_records` of the jobs whose ids `chosen` (a subquery) selects."""
        attempts = select(*ATTEMPT_COLUMNS).where(AttemptRow.job_id.in_(chosen))
        if since is not None:
            attempts = attempts.where((AttemptRow.ended_at.is_(None)) | (AttemptRow.ended_at >= since))
        with self.reading() as s:
            rows = list(s.execute(attempts))
            jobs = {
                row[0]: AccountedJob(*row)
                for row in s.execute(
                    select(JobRow.id, JobRow.team, JobRow.priority, JobRow.gpus, JobRow.user, JobRow.state).where(
                        JobRow.id.in_(chosen)
                    )
                )
            }
            commits: dict[tuple[int, int], list[Commit]] = defaultdict(list)
            saves = select(
                CheckpointRow.job_id,
                CheckpointRow.attempt,
                CheckpointRow.time,
                CheckpointRow.step,
                CheckpointRow.seconds,
                CheckpointRow.background_seconds,
            ).where(CheckpointRow.job_id.in_(chosen))
            for job_id, attempt, time, step, seconds, background in s.execute(saves.order_by(CheckpointRow.id)):
                commits[(job_id, attempt)].append(Commit(time, step, seconds or 0.0, background or 0.0))
            ends = select(EventRow.job_id, EventRow.attempt, EventRow.message).where(
                EventRow.job_id.in_(chosen), EventRow.kind.in_(["preempting", "pending", "failed"])
            )
            reasons: dict[tuple[int, int], str] = {}
            for of_job, cut, message in s.execute(ends.order_by(EventRow.id)):
                if cut is not None:
                    # The notice's reason wins over the requeue that follows it.
                    reasons.setdefault((of_job or 0, cut), message)
        by_job: dict[int, list[AttemptRecord]] = defaultdict(list)
        for row in rows:
            job_id, number, started, ended, productive, notice, restored, restore, outcome, heartbeat, said = row[:11]
            peak, cpu, oom, gpu_peak, idle, ran_on = row[11:]
            key = (job_id, number)
            restart = said or {}
            counted = (
                None if peak is None and cpu is None and gpu_peak is None else Usage(peak, cpu, oom or 0, gpu_peak)
            )
            by_job[job_id].append(
                AttemptRecord(
                    number,
                    ran_on or jobs[job_id].gpus,
                    started,
                    ended,
                    productive,
                    notice,
                    restored,
                    restore or 0.0,
                    tuple(commits[key]),
                    outcome,
                    reasons.get(key, ""),
                    heartbeat is not None or productive is not None or bool(commits[key]),
                    restart.get("process_started_at"),
                    tuple((restart.get("phases") or {}).items()),
                    counted,
                    idle or 0.0,
                )
            )
        return [(jobs[i], by_job[i]) for i in sorted(by_job)]


ATTEMPT_COLUMNS = (
    AttemptRow.job_id,
    AttemptRow.attempt,
    AttemptRow.started_at,
    AttemptRow.ended_at,
    AttemptRow.productive_at,
    AttemptRow.notice_at,
    AttemptRow.restored_step,
    AttemptRow.restore_seconds,
    AttemptRow.outcome,
    AttemptRow.last_heartbeat_at,
    AttemptRow.restart,
    AttemptRow.peak_memory,
    AttemptRow.cpu_seconds,
    AttemptRow.oom_kills,
    AttemptRow.peak_gpu_memory,
    AttemptRow.idle_seconds,
    AttemptRow.gpus,
)


@dataclass(frozen=True, slots=True)
class AccountedJob:
    """What the accounting needs of a job besides its attempts."""

    id: int
    team: str
    priority: str
    gpus: int
    user: str | None
    state: str
