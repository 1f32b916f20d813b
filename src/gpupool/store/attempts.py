"""Attempts: GPUs held, notices given, heartbeats, checkpoint commits and how each ended."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.errors import Conflict
from gpupool.model import Allocation, Placement, placed_gpus
from gpupool.settle import ENDED, AttemptEnd, AttemptOutcome, JobCounts, JobState, Usage, settle
from gpupool.store.base import StoreBase, chunks, indexed
from gpupool.store.schema import (
    NOTICED_LIVE,
    WATCHED_LIVE,
    AttemptRow,
    EventRow,
    JobRow,
    NodeRow,
    PlacementRow,
    placement_of,
    stored,
)
from gpupool.units import human_seconds

LAUNCH_RETRY = "launch_retry"
"""The `reason` of the event of an attempt the scheduler could not launch (it never ran)."""
RESIZED = "resized"
"""The `reason` of the start of a resized job's next attempt (it did not wait in line)."""


def run_time(attempt: AttemptRow, now: float) -> float:
    """Seconds an attempt ran, as a time limit counts it: from its start to its end, or to the
    preemption notice that made it leave (a job is not charged for being interrupted)."""
    end = attempt.ended_at if attempt.ended_at is not None else now
    if attempt.notice_at is not None:
        end = min(end, attempt.notice_at)
    return max(0.0, end - attempt.started_at)


class AttemptsStore(StoreBase):
    def start_attempt(self, job_id: int, placement: Sequence[Allocation], now: float, message: str) -> AttemptRow:
        """Move a pending job to STARTING on `placement`, as a new attempt holding those GPUs.

        Raises `Conflict`, changing nothing, if a GPU of the placement is held by a live attempt.
        """
        try:
            with self.transaction() as s:
                return self.start_in(s, job_id, placement, now, message)
        except IntegrityError as exc:
            raise Conflict(f"job {job_id}: a GPU of its placement is held by another attempt") from exc

    def start_in(
        self,
        s: Session,
        job_id: int,
        placement: Sequence[Allocation],
        now: float,
        message: str,
        token_hash: str | None = None,
        priority: str | None = None,
    ) -> AttemptRow:
        """`priority`: the class the attempt runs at (the job's own when None). A job a person
        held, or whose dependencies changed, since the decision read it is not started (a
        `Conflict`: the loop decides again from what is now)."""
        job = self.locked_job(s, job_id)
        if job.held_by is not None or (job.dependencies is not None and job.dependency_met_at is None):
            raise Conflict(f"job {job.label} was held, or its dependencies changed, since the decision")
        return self._begin(s, job, placement, now, message, token_hash, priority or job.priority)

    def _begin(
        self,
        s: Session,
        job: JobRow,
        placement: Sequence[Allocation],
        now: float,
        message: str,
        token_hash: str | None,
        priority: str,
        **data: Any,
    ) -> AttemptRow:
        """The job's next attempt, STARTING, holding the GPUs of `placement` (`data`: more for
        its event)."""
        attempt = AttemptRow(
            job_id=job.id,
            attempt=job.attempts,
            started_at=now,
            gpus=placed_gpus(tuple(placement)),
            token_hash=token_hash,
            priority=priority,
        )
        s.add(attempt)
        job.attempts += 1
        job.nominated_at = None
        job.held_gpus = None
        self.move(s, job, JobState.STARTING, now, message, attempt=attempt.attempt, **data)
        s.flush()
        s.add_all(
            PlacementRow(job_id=job.id, attempt=attempt.attempt, node=a.node, gpu=gpu, held_from=now)
            for a in placement
            for gpu in a.gpus
        )
        s.flush()
        return attempt

    def give_tokens(self, token_hashes: Mapping[int, str]) -> dict[int, tuple[JobRow, Placement]]:
        """Give the live attempts of these jobs that have no token yet (a resized job's next
        attempt, started as the last one ended) the hash of theirs; returns each job and where
        it runs. A job whose attempt has a token, or has none live, is left out."""
        placements: dict[int, tuple[JobRow, Placement]] = {}
        with self.transaction() as s:
            for job_id, hashed in token_hashes.items():
                job = self.locked_job(s, job_id)
                row = s.get(AttemptRow, (job_id, job.attempts - 1))
                if row is None or row.ended_at is not None or row.token_hash is not None:
                    continue
                row.token_hash = hashed
                held: dict[str, list[int]] = defaultdict(list)
                for p in s.scalars(_live_rows(job_id, row.attempt)):
                    held[p.node].append(p.gpu)
                placements[job_id] = (job, placement_of(held))
        return placements

    def release(self, job_id: int, attempt: int, now: float) -> int:
        """End the attempt's hold on its GPUs; returns how many GPUs were released."""
        with self.transaction() as s:
            return self._release(s, job_id, attempt, now)

    @staticmethod
    def _release(s: Session, job_id: int, attempt: int, now: float) -> int:
        result = s.execute(update(PlacementRow).where(*_live(job_id, attempt)).values(held_until=now))
        return int(getattr(result, "rowcount", 0))

    def held(self) -> list[PlacementRow]:
        """The GPUs held right now by live attempts."""
        with self.reading() as s:
            return list(s.scalars(select(PlacementRow).where(PlacementRow.held_until.is_(None))))

    def live_attempt(self, s: Session, job_id: int, attempt: int) -> AttemptRow:
        """The attempt, if it is the job's newest and has not ended; reports of older attempts
        are refused, so a stale process can never speak for the job."""
        job = self.locked_job(s, job_id)
        row = s.get(AttemptRow, (job_id, attempt))
        if row is None or attempt != job.attempts - 1 or row.ended_at is not None:
            raise Conflict(f"attempt {attempt} of job {job_id} is not its live attempt")
        return row

    def mark_running(self, job_id: int, attempt: int, handle: dict[str, Any], now: float, where: str = "") -> None:
        """The attempt's processes run: STARTING → RUNNING."""
        self.mark_started([(job_id, attempt, handle, True, where)], now)

    def add_idle_seconds(self, idle: Mapping[tuple[int, int], float]) -> None:
        """Add to attempts' idle time (a session's stretches with no activity), in one commit."""
        with self.transaction() as s:
            _add_idle(s, idle)

    def mark_started(self, started: Sequence[tuple[int, int, dict[str, Any] | None, bool, str]], now: float) -> None:
        """For (job, attempt, handle, running, where) of many attempts, in one transaction:
        record the executor's handle (None keeps the one recorded), and STARTING → RUNNING for
        those whose every member runs; an attempt that has ended meanwhile is left alone."""
        with self.transaction() as s:
            for job_id, attempt, handle, running, where in started:
                try:
                    row = self.live_attempt(s, job_id, attempt)
                except Conflict:
                    continue
                if handle is not None:
                    row.handle = handle
                if not running:
                    continue
                job = self.locked_job(s, job_id)
                job.launch_failures, job.retry_after, job.launch_error = 0, None, None
                if job.state == JobState.STARTING.value:
                    self.move(s, job, JobState.RUNNING, now, f"running {where}".strip(), attempt=attempt)

    def notice_in(
        self,
        s: Session,
        job_id: int,
        attempt: int,
        for_job: int | None,
        deadline: float,
        now: float,
        reason: str,
        message: str,
        keep: Placement = (),
    ) -> None:
        """Give the live attempt notice until `deadline`, for `for_job` (None: for no job, a
        requeue by a person). `keep`: a resize's, the GPUs its next attempt starts on at once
        (`model.Notice.keep`); the free ones among them (a growth's) are held from now on."""
        row = self.live_attempt(s, job_id, attempt)
        # A job already in the grace of its time limit keeps the earlier deadline.
        deadline = min(deadline, row.notice_deadline) if row.notice_deadline is not None else deadline
        row.notice_at, row.notice_deadline, row.notice_for = now, deadline, for_job
        if keep:
            row.notice_keep = stored(keep)
            held = {(p.node, p.gpu) for p in s.scalars(_live_rows(job_id, attempt))}
            s.add_all(
                PlacementRow(job_id=job_id, attempt=attempt, node=a.node, gpu=gpu, held_from=now, added=True)
                for a in keep
                for gpu in a.gpus
                if (a.node, gpu) not in held
            )
            s.flush()
        job = self.locked_job(s, job_id)
        self.move(s, job, JobState.PREEMPTING, now, message, attempt=attempt, reason=reason, deadline=deadline)

    def end_attempt(
        self,
        job_id: int,
        attempt: int,
        exit_code: int | None,
        now: float,
        *,
        ran_until: float | None = None,
        why: str | None = None,
        node_lost: str | None = None,
        max_node_losses: int = 3,
        usage: Usage | None = None,
    ) -> JobState:
        """The attempt's process is gone: release its GPUs and decide what becomes of the job.

        Cancelled if a cancel was asked for, unless the job reported completion. Success if the
        job reported completion, or exited 0 with no notice. After a notice the
        job goes back in line whatever its exit code (a preemption, not a success or failure).
        An attempt whose process vanished with no status (`exit_code` None: the scheduler was
        down when it ended) goes back in line too, without using the failure budget.
        One that lost a node (`node_lost` says what happened) goes back in line, charged to
        neither its failures nor its preemptions, while it has lost at most `max_node_losses`
        nodes; then it fails. Otherwise it failed: retried while its failure budget lasts, else FAILED. A job that
        would go back in line with no run time left under its time limit ends as TIMEOUT.

        `ran_until`: when the process really ended, if that was before `now` (it ended while the
        scheduler was down): the time limit is charged up to then. `why`: what went wrong, for
        people (a launch that failed says so). `usage`: what its cgroups counted; one that did not
        succeed after the kernel killed a process of it at its memory limit failed out of memory.
        """
        with self.transaction() as s:
            return self.end_in(
                s,
                job_id,
                attempt,
                exit_code,
                now,
                ran_until=ran_until,
                why=why,
                node_lost=node_lost,
                max_node_losses=max_node_losses,
                usage=usage,
            )

    def end_attempts(
        self,
        ended: Sequence[tuple[int, int, int | None, str | None, str | None, Usage | None]],
        now: float,
        max_node_losses: int = 3,
        idle: Mapping[tuple[int, int], float] | None = None,
    ) -> list[JobState | None]:
        """`end_attempt` for (job, attempt, exit code, why, node lost, usage) of many attempts
        in one transaction; None for an attempt that is not live (its end was recorded already).
        `idle`: sessions' idle seconds not yet recorded, written with their ends."""
        states: list[JobState | None] = []
        with self.transaction() as s:
            _add_idle(s, idle or {})
            for job_id, attempt, exit_code, why, lost, usage in ended:
                try:
                    with s.begin_nested():  # a refused end leaves nothing half-written
                        states.append(
                            self.end_in(
                                s,
                                job_id,
                                attempt,
                                exit_code,
                                now,
                                why=why,
                                node_lost=lost,
                                max_node_losses=max_node_losses,
                                usage=usage,
                            )
                        )
                except Conflict:
                    states.append(None)
        return states

    def end_in(
        self,
        s: Session,
        job_id: int,
        attempt: int,
        exit_code: int | None,
        now: float,
        *,
        ran_until: float | None = None,
        why: str | None = None,
        node_lost: str | None = None,
        max_node_losses: int = 3,
        usage: Usage | None = None,
    ) -> JobState:
        row = self.live_attempt(s, job_id, attempt)
        job = self.locked_job(s, job_id)
        # Its process ended when it did, not when the scheduler saw it: time limits, budgets
        # and the accounting are charged up to then.
        end = max(row.started_at, min(now, ran_until)) if ran_until is not None else now
        job.run_seconds = (job.run_seconds or 0.0) + run_time(row, end)
        row.ended_at, row.exit_code = end, exit_code
        if usage is not None:
            row.peak_memory, row.cpu_seconds = usage.peak_memory, usage.cpu_seconds
            row.oom_kills, row.peak_gpu_memory = usage.oom_kills, usage.peak_gpu_memory
        self._release(s, job_id, attempt, end)
        ending = AttemptEnd(
            exit_code,
            completed=row.completed_at is not None,
            noticed=row.notice_at is not None,
            requeued=row.notice_at is not None and row.notice_for is None,
            resized_to=placed_gpus(placement_of(row.notice_keep)) if row.notice_keep else None,
            cancel_requested=job.cancel_requested_at is not None,
            timed_out=row.timeout_at is not None,
            node_lost=node_lost,
            why=why,
            out_of_memory=usage is not None and usage.oom_kills > 0,
        )
        counts = JobCounts(
            job.failures,
            job.max_failures,
            job.preemptions,
            job.node_losses or 0,
            max_node_losses,
            job.run_seconds,
            job.time_limit,
        )
        settled = settle(ending, counts)
        row.outcome = settled.outcome.value
        job.failures, job.preemptions = settled.failures, settled.preemptions
        if settled.node_losses != (job.node_losses or 0):
            job.node_losses = settled.node_losses
        if settled.state is JobState.STARTING:
            # A resize: its next attempt starts at once on the GPUs its notice kept, at the class
            # this one ran at; the loop gives it its token and launches it (`ControlLoop.reap`).
            # Should a node of them have left meanwhile, it goes back in line instead.
            kept = placement_of(row.notice_keep)
            if kept == placement_of(row.notice_keep, self._nodes_up(s)):
                priority = row.priority or job.priority
                self._begin(s, job, kept, now, settled.message, None, priority, reason=RESIZED)
                return JobState.STARTING
            message = f"requeued: {settled.message}, but a GPU it kept is gone with its node"
            self.move(s, job, JobState.PENDING, now, message, attempt=attempt)
            return JobState.PENDING
        self.move(s, job, settled.state, now, settled.message, attempt=attempt)
        if JobState(job.state) in ENDED:
            job.ended_at, job.exit_code = now, exit_code
        return JobState(job.state)

    @staticmethod
    def _nodes_up(s: Session) -> dict[str, int]:
        """Each node that is up, with its GPUs."""
        return dict(s.execute(select(NodeRow.name, NodeRow.gpus).where(NodeRow.up)).all())

    def retry_launch(self, job_id: int, attempt: int, now: float, why: str) -> float:
        """The attempt could not be launched for the scheduler's reasons (a full disk, no
        process left to fork): not the job's failure. Its GPUs are released and it goes back in
        line, held for a back-off that doubles with each such failure in a row (5 s to 5
        minutes). Returns when it is tried again."""
        with self.transaction() as s:
            row = self.live_attempt(s, job_id, attempt)
            job = self.locked_job(s, job_id)
            row.ended_at, row.outcome = now, AttemptOutcome.NOT_LAUNCHED.value
            self._release(s, job_id, attempt, now)
            job.launch_failures = (job.launch_failures or 0) + 1
            job.retry_after = now + min(300.0, 5.0 * 2 ** (job.launch_failures - 1))
            job.launch_error = why[:500]
            wait = human_seconds(job.retry_after - now)
            message = f"the scheduler could not launch it ({why}); it is tried again in {wait}"
            self.move(s, job, JobState.PENDING, now, message[:2000], attempt=attempt, reason=LAUNCH_RETRY)
            return job.retry_after

    def reach_time_limit(self, job_id: int, attempt: int, deadline: float, now: float) -> bool:
        """Record that the attempt reached its job's time limit: it gets notice until `deadline`,
        then ends as TIMEOUT. False (nothing written) if it is no longer live or was told already."""
        with self.transaction() as s:
            try:
                row = self.live_attempt(s, job_id, attempt)
            except Conflict:
                return False
            if row.timeout_at is not None:
                return False
            job = self.locked_job(s, job_id)
            row.timeout_at = now
            row.notice_deadline = min(deadline, row.notice_deadline or deadline)
            limit = human_seconds(job.time_limit or 0.0)
            message = (
                f"reached its time limit of {limit}: notice given, it ends by {human_seconds(deadline - now)} from now"
            )
            s.add(EventRow(time=now, kind="time_limit", job_id=job_id, attempt=attempt, message=message))
            return True

    def live_attempts(self) -> list[AttemptRow]:
        """Attempts that have not ended, oldest first."""
        with self.reading() as s:
            query = select(AttemptRow).where(AttemptRow.ended_at.is_(None))
            return list(s.scalars(query.order_by(AttemptRow.started_at, AttemptRow.job_id)))

    def live_attempts_and_jobs(self) -> list[tuple[AttemptRow, JobRow]]:
        """Live attempts with their jobs, in one read."""
        with self.reading() as s:
            query = select(AttemptRow, JobRow).join(JobRow).where(AttemptRow.ended_at.is_(None))
            return [(attempt, job) for attempt, job in s.execute(query.order_by(AttemptRow.started_at))]

    def watched_attempts(self) -> list[tuple[AttemptRow, JobRow]]:
        """The live attempts the loop watches for deadlines, with their jobs, in one read: those
        under notice, and those of jobs with a time limit or a cancel asked for (found through
        partial indexes, not by reading every live attempt)."""
        with self.reading() as s:
            noticed = indexed(s, "job_id, attempt", "attempts", "ix_attempts_notice_live", NOTICED_LIVE)
            watched = [r[0] for r in indexed(s, "id", "jobs", "ix_jobs_watched_live", WATCHED_LIVE)]
            query = select(AttemptRow, JobRow).join(JobRow)
            found = {}
            for keys in chunks(tuple(k) for k in noticed):
                rows = s.execute(query.where(tuple_(AttemptRow.job_id, AttemptRow.attempt).in_(keys)))
                found.update({(a.job_id, a.attempt): (a, j) for a, j in rows})
            for ids in chunks(watched):
                rows = s.execute(query.where(AttemptRow.job_id.in_(ids), AttemptRow.ended_at.is_(None)))
                found.update({(a.job_id, a.attempt): (a, j) for a, j in rows})
            return sorted(found.values(), key=lambda pair: (pair[0].started_at, pair[0].job_id))

    def attempts(self, job_id: int) -> list[AttemptRow]:
        with self.reading() as s:
            query = select(AttemptRow).where(AttemptRow.job_id == job_id).order_by(AttemptRow.attempt)
            return list(s.scalars(query))

    def jobs_by_id(self, ids: Sequence[int]) -> dict[int, JobRow]:
        with self.reading() as s:
            return {job.id: job for job in s.scalars(select(JobRow).where(JobRow.id.in_(list(ids))))}


def _add_idle(s: Session, idle: Mapping[tuple[int, int], float]) -> None:
    """Add to attempts' idle time (a session's stretches with no activity), in `s`."""
    for (job_id, attempt), seconds in idle.items():
        row = s.get(AttemptRow, (job_id, attempt))
        if row is not None and seconds:
            row.idle_seconds = (row.idle_seconds or 0.0) + seconds


def _live(job_id: int, attempt: int) -> tuple[Any, ...]:
    """The conditions of the GPUs an attempt holds now (a growth's added ones too)."""
    return (PlacementRow.job_id == job_id, PlacementRow.attempt == attempt, PlacementRow.held_until.is_(None))


def _live_rows(job_id: int, attempt: int) -> Any:
    return select(PlacementRow).where(*_live(job_id, attempt))
