"""The store's records of attempts, as the accounting reads them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import select

from gpupool.accounting import AttemptRecord, Commit, JobAccount, account
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
                if outcome in ("failed", "lost", "node_lost") or (outcome == "preempted" and acked is None):
                    cuts[priority] += 1
        return {priority: running[priority] / n for priority, n in cuts.items()}

    def accounts(
        self, now: float, *, job_ids: Sequence[int] | None = None, since: float | None = None
    ) -> list[JobAccount]:
        """The account of each job that held GPUs at or after `since` (counting its attempts
        that ended since then, or run), or of `job_ids`."""
        return [
            account(job.id, job.team, job.priority, records, now, job.user or "")
            for job, records in self.attempt_records(job_ids=job_ids, since=since)
        ]

    def attempt_records(
        self, *, job_ids: Sequence[int] | None = None, since: float | None = None
    ) -> list[tuple[JobRow, list[AttemptRecord]]]:
        """Each job with attempts (of `job_ids`, or that held GPUs at or after `since`) and
        what the accounting reads of them, in the order of the jobs' ids."""
        with self.reading() as s:
            attempts = select(AttemptRow)
            if job_ids is not None:
                attempts = attempts.where(AttemptRow.job_id.in_(list(job_ids)))
            if since is not None:
                attempts = attempts.where((AttemptRow.ended_at.is_(None)) | (AttemptRow.ended_at >= since))
            rows = list(s.scalars(attempts))
            ids = sorted({r.job_id for r in rows})
            jobs = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(ids)))}
            commits: dict[tuple[int, int], list[Commit]] = defaultdict(list)
            for c in s.scalars(select(CheckpointRow).where(CheckpointRow.job_id.in_(ids)).order_by(CheckpointRow.id)):
                commits[(c.job_id, c.attempt)].append(Commit(c.time, c.step, c.seconds or 0.0))
            ends = select(EventRow).where(
                EventRow.job_id.in_(ids), EventRow.kind.in_(["preempting", "pending", "failed"])
            )
            reasons: dict[tuple[int, int], str] = {}
            for e in s.scalars(ends.order_by(EventRow.id)):
                if e.attempt is not None:
                    # The notice's reason wins over the requeue that follows it.
                    reasons.setdefault((e.job_id or 0, e.attempt), e.message)
        by_job: dict[int, list[AttemptRecord]] = defaultdict(list)
        for a in rows:
            key = (a.job_id, a.attempt)
            by_job[a.job_id].append(
                AttemptRecord(
                    a.attempt,
                    jobs[a.job_id].gpus,
                    a.started_at,
                    a.ended_at,
                    a.productive_at,
                    a.notice_at,
                    a.restored_step,
                    a.restore_seconds or 0.0,
                    tuple(commits[key]),
                    a.outcome,
                    reasons.get(key, ""),
                    a.last_heartbeat_at is not None or a.productive_at is not None or bool(commits[key]),
                )
            )
        return [(jobs[i], by_job[i]) for i in ids]
