"""The state a driver keeps between decisions, changed job by job.

A driver that knows what changed since its last decision (the live loop reads the store's
change journal) puts each changed job here as it is now: running (its attempt), in line, or
gone. `snapshot` then gives `decide` the jobs with every index it reads (free GPUs, GPUs per
team, the drains, the pending and running indexes), so a decision costs what changed, not the
size of the pool. The plan is the one `decide` makes from the jobs alone (`running.kept`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from gpupool.model import Job, JobId, Node, RunningJob, Snapshot, Team
from gpupool.policy.pending import PendingIndex
from gpupool.policy.place import FreeIndex
from gpupool.policy.running import RunningIndex


class KeptState:
    """Running jobs (draining or not) and jobs in line, with the indexes of `running.kept`."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = nodes
        self.running: dict[JobId, RunningJob] = {}
        self.draining: dict[JobId, RunningJob] = {}
        self.free = FreeIndex(nodes)
        self.team_gpus: Counter[str] = Counter()
        self.index = RunningIndex(nodes)
        self.line = PendingIndex()

    @classmethod
    def of(cls, nodes: Sequence[Node], running: Iterable[RunningJob], pending: Iterable[Job]) -> KeptState:
        state = cls(nodes)
        for job in running:
            state.start(job)
        for waiting in pending:
            state.queue(waiting)
        return state

    def put(self, job_id: JobId, running: RunningJob | None) -> None:
        """Job `job_id`'s attempt is now `running` (None: it has none), and the job is out of
        line until it is `queue`d again."""
        self.stop(job_id)
        self.unqueue(job_id)
        if running is not None:
            self.start(running)

    def start(self, running: RunningJob) -> None:
        """An attempt runs (or drains, under notice)."""
        job = running.job
        if job.id in self.running:
            raise ValueError(f"job {job.id} runs twice")
        for alloc in running.placement:
            self.free.take(alloc.node, alloc.gpus)
        self.running[job.id] = running
        if running.notice is None:
            self.index.add(running)
            self.team_gpus[job.team] += job.gpus
        else:
            self.draining[job.id] = running

    def stop(self, job_id: JobId) -> None:
        """The job's attempt, if it has one, ended (or changed: `put` it again)."""
        running = self.running.pop(job_id, None)
        if running is None:
            return
        if self.draining.pop(job_id, None) is None:
            self.index.remove(job_id)
            self.team_gpus[running.job.team] -= running.job.gpus
        for alloc in running.placement:
            self.free.give(alloc.node, alloc.gpus)

    def queue(self, job: Job) -> None:
        """The job is in line (again, or changed)."""
        self.line.add(job)

    def unqueue(self, job_id: JobId) -> None:
        """The job left the line, if it was in it."""
        if job_id in self.line.jobs:
            self.line.remove(job_id)

    def snapshot(self, usage: Mapping[tuple[str, str], float], teams: Mapping[str, Team] | None) -> Snapshot:
        """What `decide` reads, with the indexes kept."""
        return Snapshot(
            self.nodes,
            list(self.running.values()),
            list(self.line.jobs.values()),
            usage,
            free=self.free,
            team_gpus=+self.team_gpus,
            draining=list(self.draining.values()),
            teams=teams,
            pending_index=self.line,
            running_index=self.index,
        )


__all__ = ["KeptState"]
