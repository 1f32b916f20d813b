"""The state a driver keeps between decisions: what `decide` reads, changed event by event.

Every driver feeds one `PoolState`: the simulator as its events happen, the live loop as the
store's change journal says jobs changed, the tests' drivers and the benchmarks as they script
them. It holds the running attempts (those under notice apart), the free GPUs, the GPUs each
team holds, the line, the jobs the driver holds back from it, and the running index the victim
searches read. A decision reads it and changes nothing; `apply` carries a plan out on it, so the
rules of what a plan does to the jobs (a start, a notice, a nomination) are written here once.
A decision then costs what changed, not the size of the pool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from gpupool.model import (
    Job,
    JobId,
    Node,
    Notice,
    Placement,
    Plan,
    RunningJob,
    Snapshot,
    Team,
    placed_gpus,
    placement_without,
)
from gpupool.policy.free import FreeIndex
from gpupool.policy.line import Line
from gpupool.policy.running import RunningIndex


class PoolState:
    """Running attempts, free GPUs, GPUs per team, the line and the running index, kept up to
    date by the events a driver gives it (the module's docstring). `line` and `index` are what
    the line and the running index are made of: the tests' reference gives its own, which read
    the jobs alone (tests/support/oracle.py)."""

    def __init__(
        self, nodes: Sequence[Node], *, line: Line | None = None, index: type[RunningIndex] = RunningIndex
    ) -> None:
        self.nodes = nodes
        self.running: dict[JobId, RunningJob] = {}
        """Every attempt that holds GPUs, under notice or not."""
        self.draining: dict[JobId, RunningJob] = {}
        """The attempts under notice."""
        self.growable: dict[JobId, RunningJob] = {}
        """The attempts not under notice of elastic jobs below their largest size."""
        self.free = FreeIndex(nodes)
        self.team_gpus: Counter[str] = Counter()
        """GPUs per team held by the attempts not under notice (a team at none is not listed)."""
        self.line = line if line is not None else Line()
        """The jobs in line the core sees."""
        self.held: dict[JobId, Job] = {}
        """Jobs in line that the driver holds back from the core (a dependency, an array's
        limit, a launch's back-off): they are not in `line`."""
        self.usage: Mapping[tuple[str, str], float] = {}
        """GPU-seconds spent by (team, priority class) inside each budget's window, set by the
        driver before a decision (`model.budget_use`)."""
        self.teams: Mapping[str, Team] | None = None
        """Each team's policy as the driver holds it (the store, in the service); None takes
        `Config.teams` (the simulator's fixed teams)."""
        self.follow_commits: Callable[[], None] | None = None
        """Set by a driver that reports checkpoint commits only when they are read: called once
        before a decision first reads the running attempts' checkpoints, it `checkpoint`s them."""
        self._index_type = index
        self._index: RunningIndex | None = None

    @classmethod
    def of(cls, snapshot: Snapshot) -> PoolState:
        """The state of `snapshot`'s pool: its attempts started, its pending jobs in line."""
        state = cls(snapshot.nodes)
        state.fill(snapshot)
        return state

    def fill(self, snapshot: Snapshot) -> None:
        """Start `snapshot`'s attempts and put its pending jobs in line, on an empty state."""
        for running in snapshot.running:
            self.start(running)
        for job in snapshot.pending:
            self.queue(job)
        self.usage = snapshot.usage
        self.teams = snapshot.teams

    def on_nodes(self, nodes: Sequence[Node]) -> PoolState:
        """The same jobs on other nodes (some went out, or came back): every attempt on them
        started again, the line and the held jobs as they are."""
        state = PoolState(nodes, line=self.line, index=self._index_type)
        for running in self.running.values():
            state.start(running)
        state.held, state.usage, state.teams = self.held, self.usage, self.teams
        state.follow_commits = self.follow_commits
        return state

    # --- what a decision reads ---------------------------------------------------------------

    @property
    def index(self) -> RunningIndex:
        """The attempts not under notice, indexed for victim searches; built when first read (a
        pool that never preempts never pays for it), then kept up to date. Checkpoint commits a
        driver follows lazily are brought up to date first (`follow_commits`)."""
        if self.follow_commits is not None:
            follow, self.follow_commits = self.follow_commits, None
            follow()
        if self._index is None:
            self._index = self._index_type(self.nodes)
            for running in self.running.values():
                if running.notice is None:
                    self._index.add(running)
        return self._index

    # --- events ------------------------------------------------------------------------------

    def queue(self, job: Job) -> None:
        """The job is in line for the core (new, requeued, changed, or no longer held back): at
        its largest size, if elastic, whatever size it last ran at."""
        self.held.pop(job.id, None)
        self.line.add(job.at_size(job.largest))

    def hold(self, job: Job) -> None:
        """The job is in line, held back from the core by the driver."""
        self.unqueue(job.id)
        self.held[job.id] = job.at_size(job.largest)

    def unqueue(self, job_id: JobId) -> None:
        """The job is no longer in line (it started, ended or was cancelled), if it was."""
        self.held.pop(job_id, None)
        if job_id in self.line.jobs:
            self.line.remove(job_id)

    def start(self, running: RunningJob) -> None:
        """An attempt holds its GPUs (running, or draining under notice). A ValueError names a
        GPU it cannot hold (held already, or not in the pool); nothing changes then."""
        job = running.job
        if job.id in self.running:
            raise ValueError(f"job {job.id} runs twice")
        self.free.take(running.holds)
        self.running[job.id] = running
        if running.notice is None:
            self.team_gpus[job.team] += job.gpus
            if self._index is not None:
                self._index.add(running)
            if job.gpus < job.largest:
                self.growable[job.id] = running
        else:
            self.draining[job.id] = running
            self._count(job.team, _kept(running))

    def end(self, job_id: JobId) -> RunningJob | None:
        """The job's attempt, if it has one, ended: its GPUs are free. Returns it."""
        running = self.running.pop(job_id, None)
        if running is None:
            return None
        if self.draining.pop(job_id, None) is None:
            self._count(running.job.team, -running.job.gpus)
            if self._index is not None:
                self._index.remove(job_id)
            self.growable.pop(job_id, None)
        else:
            self._count(running.job.team, -_kept(running))
        self.free.give(running.holds)
        return running

    def resized(self, job_id: JobId, now: float) -> RunningJob:
        """The job's attempt under a shrink's or a growth's notice ended: its next attempt runs
        from `now` on the GPUs the notice kept, at their size, without going back in line.
        Returns it."""
        ended = self.running.get(job_id)
        if ended is None or ended.notice is None or not ended.notice.keep:
            raise ValueError(f"job {job_id} is not being resized")
        self.end(job_id)
        keep = ended.notice.keep
        resumed = RunningJob(ended.job.at_size(placed_gpus(keep)), keep, now, priority=ended.priority)
        self.start(resumed)
        return resumed

    def put(self, job_id: JobId, running: RunningJob | None) -> None:
        """Job `job_id`'s attempt is now `running` (None: it has none), and the job is out of
        line until it is `queue`d or `hold`en again: how a driver that reads jobs as they are
        now (the live loop) gives any change. A ValueError (the new attempt cannot hold its
        GPUs) leaves the job as it was."""
        ran, waited, held = self.running.get(job_id), self.line.jobs.get(job_id), self.held.get(job_id)
        self.end(job_id)
        self.unqueue(job_id)
        if running is None:
            return
        try:
            self.start(running)
        except ValueError:  # as it was: the new attempt cannot hold its GPUs
            if ran is not None:
                self.start(ran)
            if waited is not None:
                self.queue(waited)
            if held is not None:
                self.hold(held)
            raise

    def notice(self, job_id: JobId, notice: Notice) -> RunningJob:
        """The job's attempt was given notice: it drains, and the GPUs it frees are no longer
        its team's (a shrink's kept ones still are); the free GPUs a growth adds are held for it
        (a ValueError names one that is not free, and nothing changes then)."""
        running = self.running[job_id]
        noticed = replace(running, notice=notice)
        before, after = _added(running), _added(noticed)
        if before != after:
            self.free.give(before)
            try:
                self.free.take(after)
            except ValueError:
                self.free.take(before)
                raise
        self.running[job_id] = self.draining[job_id] = noticed
        if running.notice is None:
            self._count(running.job.team, _kept(noticed) - running.job.gpus)
            if self._index is not None:
                self._index.remove(job_id)
            self.growable.pop(job_id, None)
        else:
            self._count(running.job.team, _kept(noticed) - _kept(running))
        return noticed

    def checkpoint(self, job_id: JobId, at: float | None) -> RunningJob:
        """The job's attempt committed a checkpoint `at`."""
        running = self.running[job_id] = self.running[job_id].checkpointed(at)
        if running.notice is not None:
            self.draining[job_id] = running
            return running
        if job_id in self.growable:
            self.growable[job_id] = running
        if self._index is not None:
            self._index.checkpointed(running)
        return running

    def apply(self, plan: Plan, now: float) -> None:
        """Carry `plan` out at `now`: each started job leaves the line and runs (no longer
        nominated: what was freed for it is taken); each victim drains, and the job it drains
        for is nominated from its first notice, so that the GPUs freed for it are its own
        however its victims leave (a drain, or finishing first). A ValueError (a start's GPUs
        are not free) changes nothing."""
        unknown = [s.job for s in plan.starts if s.job not in self.line.jobs]
        unknown += [p.victim for p in plan.preemptions if p.victim not in self.running]
        unknown += [g.job for g in plan.grows if g.job not in self.running]
        if unknown:
            raise ValueError(f"the plan names job(s) {', '.join(unknown)}, not in line or not running")
        adds = [placement_without(g.placement, self.running[g.job].placement) for g in plan.grows]
        self.free.check([*(start.placement for start in plan.starts), *adds])
        for start in plan.starts:
            job = self.line.remove(start.job)
            if job.nominated:
                job = replace(job, nominated=False)
            # An elastic job runs at the size of its placement, which the decision chose.
            job = job.at_size(placed_gpus(start.placement))
            self.start(RunningJob(job, start.placement, now, priority=start.priority))
        for grow in plan.grows:
            self.notice(grow.job, Notice(grow.job, grow.deadline, grow.placement))
        if not plan.preemptions:
            return
        for preempt in plan.preemptions:
            self.notice(preempt.victim, Notice(preempt.for_job, preempt.deadline, preempt.keep))
        for job_id in plan.nominated:
            waiting = self.line.jobs.get(job_id)
            if waiting is not None and not waiting.nominated:
                self.line.add(replace(waiting, nominated=True))

    def _count(self, team: str, gpus: int) -> None:
        if not gpus:
            return
        held = self.team_gpus[team] + gpus
        if held:
            self.team_gpus[team] = held
        else:
            del self.team_gpus[team]

    def __repr__(self) -> str:
        return (
            f"PoolState({len(self.nodes)} nodes, {len(self.running)} running, {len(self.draining)} draining, "
            f"{len(self.line)} in line, {len(self.held)} held)"
        )


def _added(running: RunningJob) -> Placement:
    """The free GPUs a growing attempt holds for its next one (none for any other)."""
    return running.notice.adds(running.placement) if running.notice is not None else ()


def _kept(running: RunningJob) -> int:
    """GPUs a draining attempt keeps (a shrink's; none for an eviction)."""
    return placed_gpus(running.notice.keep) if running.notice is not None else 0


__all__ = ["PoolState"]
