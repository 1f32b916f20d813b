"""What the metrics and the dashboard read: the event log and the checkpoint commits after a watermark, and the
pool's current state as counts. Each read is one query that returns at most a few rows per
team and class (or per new event), never a row per job: a scrape never reads the store, and the
telemetry thread reads these at most once a second (gpupool/telemetry)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import case, func, select

from gpupool.accounting import INTERRUPTED
from gpupool.settle import ENDED, AttemptOutcome, JobState
from gpupool.store.base import StoreBase
from gpupool.store.schema import (
    ATTEMPT_GPUS,
    AttemptRow,
    CheckpointRow,
    EventRow,
    JobRow,
    NodeRow,
    PlacementRow,
    TeamRow,
)

LIVE = tuple(s.value for s in JobState if s not in ENDED)


@dataclass(frozen=True, slots=True)
class Happened:
    """One event of the log, with the team and class of its job (None for the pool's own)."""

    id: int
    time: float
    kind: str
    job_id: int | None
    attempt: int | None
    reason: str | None
    """The rule that chose a preemption's victim (`preempting` events)."""
    team: str | None
    priority: str | None


@dataclass(frozen=True, slots=True)
class Committed:
    """One checkpoint commit a job reported, with its job's team and class."""

    id: int
    job_id: int
    seconds: float | None
    team: str
    priority: str


@dataclass(frozen=True, slots=True)
class Waiting:
    """Pending jobs of one team, class and reason to wait."""

    team: str
    priority: str
    reason: str | None
    jobs: int
    gpus: int
    oldest: float | None
    """When the longest-waiting of them joined the line (submitted, requeued, or its
    dependencies met); None if all of them wait for other jobs."""


@dataclass(frozen=True, slots=True)
class Listed:
    """A job as the queue page lists it."""

    id: int
    name: str
    team: str
    priority: str
    state: str
    gpus: int
    user: str | None
    wait_reason: str | None
    wait_message: str | None
    submit_time: float
    array_id: int | None
    array_index: int | None
    session: str | None = None


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """A node the pool has known, and how many of its GPUs are in each state but idle."""

    name: str
    gpus: int
    gpu_type: str
    up: bool
    states: dict[str, int]


class TelemetryStore(StoreBase):
    def happened(self, after: int, limit: int, also: Sequence[int] = ()) -> list[Happened]:
        """Events with an id above `after` (at most `limit`, oldest first), and those of `also`
        (ids skipped earlier, perhaps of a transaction that had not committed yet)."""
        columns = (
            EventRow.id,
            EventRow.time,
            EventRow.kind,
            EventRow.job_id,
            EventRow.attempt,
            EventRow.data["reason"].as_string(),
            JobRow.team,
            JobRow.priority,
        )
        base = select(*columns).outerjoin(JobRow, JobRow.id == EventRow.job_id)
        return [Happened(*row) for row in self._after(base, EventRow.id, after, limit, also)]

    def committed(self, after: int, limit: int, also: Sequence[int] = ()) -> list[Committed]:
        """Checkpoint commits with an id above `after` (and those of `also`), oldest first."""
        columns = (CheckpointRow.id, CheckpointRow.job_id, CheckpointRow.seconds, JobRow.team, JobRow.priority)
        base = select(*columns).join(JobRow, JobRow.id == CheckpointRow.job_id)
        return [Committed(*row) for row in self._after(base, CheckpointRow.id, after, limit, also)]

    def _after(self, base: Any, key: Any, after: int, limit: int, also: Sequence[int]) -> list[Any]:
        """The rows of `base` whose `key` is above `after` (at most `limit`) or among `also`, by key."""
        with self.reading() as s:
            rows = list(s.execute(base.where(key > after).order_by(key).limit(limit)))
            if also:
                rows += s.execute(base.where(key.in_(list(also))))
        return sorted(rows, key=lambda row: row[0])

    def live_counts(self) -> list[tuple[str, str, str, int]]:
        """(state, team, class, jobs) for every state a job is not done in."""
        query = (
            select(JobRow.state, JobRow.team, JobRow.priority, func.count())
            .where(JobRow.state.in_(LIVE))
            .group_by(JobRow.state, JobRow.team, JobRow.priority)
        )
        with self.reading() as s:
            return [(state, team, priority, n) for state, team, priority, n in s.execute(query)]

    def waiting(self) -> list[Waiting]:
        """Pending jobs per team, class and the reason last recorded for them."""
        # As the scheduler counts a wait (`_last_ran`, `_latest`): from the end of the last
        # attempt that ran (one the scheduler could not launch never did), or from the meeting
        # of its dependencies, or from its submission; a job whose dependencies are not met
        # yet waits for another job, not in line.
        last_ran = (
            select(func.max(AttemptRow.ended_at))
            .where(
                AttemptRow.job_id == JobRow.id, AttemptRow.outcome.is_distinct_from(AttemptOutcome.NOT_LAUNCHED.value)
            )
            .correlate(JobRow)
            .scalar_subquery()
        )
        ran_or_submitted = func.coalesce(last_ran, JobRow.submit_time)
        met = JobRow.dependency_met_at
        queued = case((met.is_not(None) & (met > ran_or_submitted), met), else_=ran_or_submitted)
        in_line = JobRow.dependencies.is_(None) | met.is_not(None)
        oldest = func.min(case((in_line, queued), else_=None))
        query = (
            select(JobRow.team, JobRow.priority, JobRow.wait_reason, func.count(), func.sum(JobRow.gpus), oldest)
            .where(JobRow.state == JobState.PENDING.value)
            .group_by(JobRow.team, JobRow.priority, JobRow.wait_reason)
        )
        with self.reading() as s:
            return [Waiting(*row) for row in s.execute(query)]

    def allocated(self) -> list[tuple[str, str, int]]:
        """(team, class, GPUs) held by live attempts, at the class each attempt runs at."""
        priority = func.coalesce(AttemptRow.priority, JobRow.priority)
        query = (
            select(JobRow.team, priority, func.count())
            .select_from(PlacementRow)
            .join(JobRow, JobRow.id == PlacementRow.job_id)
            .join(AttemptRow, (AttemptRow.job_id == PlacementRow.job_id) & (AttemptRow.attempt == PlacementRow.attempt))
            .where(PlacementRow.held_until.is_(None))
            .group_by(JobRow.team, priority)
        )
        with self.reading() as s:
            return [(team, cls, n) for team, cls, n in s.execute(query)]

    def node_gpus(self) -> list[NodeGpus]:
        """Every node with its GPUs counted by state, as `pool_view` names them: allocated,
        draining (its attempt has notice or reached its time limit), held (free, kept for a
        preemptor); the rest of an up node's GPUs are idle."""
        leaving = (AttemptRow.notice_at.is_not(None)) | (AttemptRow.timeout_at.is_not(None))
        # Only the GPUs a node has now: one that came back smaller still has placements on
        # GPUs it no longer has (pool_view shows only those it has).
        placed = (
            select(PlacementRow.node, leaving, func.count())
            .join(AttemptRow, (AttemptRow.job_id == PlacementRow.job_id) & (AttemptRow.attempt == PlacementRow.attempt))
            .join(NodeRow, NodeRow.name == PlacementRow.node)
            .where(PlacementRow.held_until.is_(None), PlacementRow.gpu < NodeRow.gpus)
            .group_by(PlacementRow.node, leaving)
        )
        with self.reading() as s:
            nodes = list(
                s.execute(select(NodeRow.name, NodeRow.gpus, NodeRow.gpu_type, NodeRow.up).order_by(NodeRow.name))
            )
            states: dict[str, dict[str, int]] = {name: {} for name, *_ in nodes}
            for node, draining, count in s.execute(placed):
                state = "draining" if draining else "allocated"
                states.setdefault(node, {})[state] = states.get(node, {}).get(state, 0) + count
            kept = [
                held
                for (held,) in s.execute(
                    select(JobRow.held_gpus).where(
                        JobRow.state == JobState.PENDING.value, JobRow.held_gpus.is_not(None)
                    )
                )
            ]
            if kept:
                # Few nodes have GPUs kept for a preemptor: only there is a GPU looked at one by one.
                where = sorted({node for held in kept for node in held or {}})
                live = select(PlacementRow.node, PlacementRow.gpu).where(
                    PlacementRow.held_until.is_(None), PlacementRow.node.in_(where)
                )
                taken = {(node, gpu) for node, gpu in s.execute(live)}
                size = {name: gpus for name, gpus, *_ in nodes}
                kept_gpus = {(node, int(gpu)) for held in kept for node, gpus in (held or {}).items() for gpu in gpus}
                for node, gpu in kept_gpus - taken:
                    if gpu < size.get(node, 0):
                        states.setdefault(node, {})["held"] = states.get(node, {}).get("held", 0) + 1
        return [NodeGpus(name, gpus, gpu_type, bool(up), states.get(name, {})) for name, gpus, gpu_type, up in nodes]

    def team_gpus_over_time(self, since: float, until: float, points: int) -> dict[str, list[tuple[float, float]]]:
        """Per team, the GPUs its attempts held at `points` evenly spaced times in [since, until]."""
        query = (
            select(JobRow.team, AttemptRow.started_at, AttemptRow.ended_at, ATTEMPT_GPUS)
            .join(JobRow, JobRow.id == AttemptRow.job_id)
            .where(AttemptRow.started_at <= until, (AttemptRow.ended_at.is_(None)) | (AttemptRow.ended_at >= since))
        )
        with self.reading() as s:
            rows = list(s.execute(query))
            live = select(TeamRow.name).where(TeamRow.removed_at.is_(None))
            teams = [name for (name,) in s.execute(live.order_by(TeamRow.name))]
        times = np.linspace(since, until, points)
        held: dict[str, list[tuple[float, float]]] = {}
        for team in teams:
            mine = [
                (start, end if end is not None else np.inf, gpus) for name, start, end, gpus in rows if name == team
            ]
            values = np.zeros(points)
            if mine:
                start, end, gpus = (np.array(column, dtype=float) for column in zip(*mine, strict=True))
                inside = (start[None, :] <= times[:, None]) & (times[:, None] < end[None, :])
                values = inside.astype(float) @ gpus
            held[team] = list(zip(times.tolist(), values.tolist(), strict=True))
        return held

    def checkpoints(self, job_id: int) -> list[CheckpointRow]:
        """The checkpoints a job committed, oldest first."""
        with self.reading() as s:
            return list(
                s.scalars(select(CheckpointRow).where(CheckpointRow.job_id == job_id).order_by(CheckpointRow.id))
            )

    def listing(self, states: Sequence[str], team: str | None, priority: str | None) -> list[Listed]:
        """The jobs in `states` (of `team`, of class `priority`), oldest first, as the queue page
        lists them: plain columns, none of a job's command, environment or script."""
        query = select(*(getattr(JobRow, f) for f in Listed.__slots__)).where(JobRow.state.in_(list(states)))
        if team is not None:
            query = query.where(JobRow.team == team)
        if priority is not None:
            query = query.where(JobRow.priority == priority)
        with self.reading() as s:
            return [Listed(*row) for row in s.execute(query.order_by(JobRow.id))]

    def holding(self, job_ids: Sequence[int]) -> dict[int, tuple[float, dict[str, list[int]]]]:
        """For each of `job_ids` with a live attempt: when it started, and its GPUs by node."""
        query = (
            select(AttemptRow.job_id, AttemptRow.started_at, PlacementRow.node, PlacementRow.gpu)
            .join(
                PlacementRow, (AttemptRow.job_id == PlacementRow.job_id) & (AttemptRow.attempt == PlacementRow.attempt)
            )
            .where(
                AttemptRow.job_id.in_(list(job_ids)), AttemptRow.ended_at.is_(None), PlacementRow.held_until.is_(None)
            )
            .order_by(PlacementRow.node, PlacementRow.gpu)
        )
        held: dict[int, tuple[float, dict[str, list[int]]]] = {}
        with self.reading() as s:
            for job_id, started, node, gpu in s.execute(query):
                held.setdefault(job_id, (started, {}))[1].setdefault(node, []).append(gpu)
        return held

    def interrupted(self, since: float, team: str | None, limit: int) -> tuple[list[int], int]:
        """The jobs (of `team`) with an attempt interrupted since `since`, most recent first, at
        most `limit` of them, and how many attempts were interrupted in all."""
        at = func.coalesce(AttemptRow.notice_at, AttemptRow.ended_at)  # as Interruption.at
        cut = AttemptRow.outcome.in_([o.value for o in INTERRUPTED]) & (at >= since)
        query = select(AttemptRow.job_id, func.max(at)).join(JobRow).where(cut)
        count = select(func.count()).select_from(AttemptRow).join(JobRow).where(cut)
        if team is not None:
            query, count = query.where(JobRow.team == team), count.where(JobRow.team == team)
        query = query.group_by(AttemptRow.job_id).order_by(func.max(at).desc()).limit(limit)
        with self.reading() as s:
            return [job_id for job_id, _ in s.execute(query)], int(s.execute(count).scalar_one())
