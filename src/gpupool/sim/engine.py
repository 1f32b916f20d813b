"""The simulator: a virtual clock and an event heap driving the very `decide` of the service.

Events at one instant are handled in rank order (releases and completions, then arrivals,
then the scheduling pass), and same-rank events in the order they were scheduled, so a run
is a pure function of its inputs.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from functools import partial
from typing import overload

from gpupool.accounting import INTERRUPTED, AttemptRecord, Commit, account
from gpupool.model import Config, Job, JobState, Node, Notice, Plan, RunningJob, Snapshot
from gpupool.policy import decide, pending
from gpupool.policy.pending import PendingIndex
from gpupool.policy.place import FreeIndex
from gpupool.policy.running import RunningIndex
from gpupool.settle import AttemptEnd, AttemptOutcome, JobCounts, Settlement, settle
from gpupool.sim.budgets import BudgetMeter
from gpupool.sim.failures import NodeClock, NodeFailures
from gpupool.sim.jobmodel import Attempt, Interruption, JobModel, interrupt
from gpupool.sim.records import JobRecord, Outcome, SimJob, Usage

FREEZE_EVERY = 4096
"""Arrivals between two `gc.freeze()` calls, which move the jobs that arrived since out of
the cyclic collector's sight (each call is cheap; freezing at every arrival is not needed)."""


class Rank(IntEnum):
    RELEASE = 0
    NODE = 1
    """A node fails or is back (`attempt_no` 0 or 1)."""
    ARRIVAL = 2
    DECIDE = 3


@dataclass(slots=True)
class _Live:
    """A simulated job's changing state."""

    record: JobRecord
    core: Job
    committed: float = 0.0
    attempt_no: int = -1
    attempt: Attempt | None = None
    running: RunningJob | None = None
    notice_at: float | None = None
    cut: Interruption | None = None
    """Set with the notice: when the attempt will release its GPUs and what it keeps."""
    attempts: list[AttemptRecord] = field(default_factory=list)
    """What each ended attempt did, for the accounting shared with the live service."""


@dataclass(slots=True)
class Simulation:
    jobs: Sequence[SimJob]
    nodes: Sequence[Node]
    config: Config
    model: JobModel
    on_progress: Callable[[int], None] | None = None
    """Called now and then with the number of jobs finished so far."""
    on_plan: Callable[[float, Plan], None] | None = None
    """Called with every plan `decide` returns, before it is carried out."""
    decide: Callable[[Snapshot, Config, float], Plan] = decide
    """The scheduling core; the simulator carries out exactly what it decides. The snapshot it
    is given holds the simulator's own state (free GPUs, team GPUs, running jobs), read only and
    valid during the call: a `decide` that keeps it sees it change once the plan is carried out."""
    failures: NodeFailures | None = None
    running_index_from: int = 1000
    """Keep a running index (`running_index`) on pools of this many nodes or more: on a smaller
    one, building the candidates at a victim search costs less than keeping them between
    decisions (the plan is the same)."""
    heap: list[tuple[float, int, int, str, int]] = field(default_factory=list)
    commits: list[tuple[float, str, int]] = field(default_factory=list)
    """(time, job, attempt) of the next checkpoint commit of each running attempt."""
    seq: itertools.count[int] = field(default_factory=itertools.count)
    live: dict[str, _Live] = field(default_factory=dict)
    pending: dict[str, _Live] = field(default_factory=dict)
    running: dict[str, _Live] = field(default_factory=dict)
    queued: dict[str, Job] = field(default_factory=dict)
    placed: dict[str, RunningJob] = field(default_factory=dict)
    noticed: dict[str, RunningJob] = field(default_factory=dict)
    """The core's view of `pending`, `running` and the running jobs under notice, kept beside
    them (in the same order) so that a snapshot is three list copies."""
    pending_since: dict[str, float] = field(default_factory=dict)
    usage: list[Usage] = field(default_factory=list)
    free: FreeIndex = field(init=False)
    """Free GPUs per node, and GPUs per team held by jobs not draining, kept up to date so that
    neither the snapshot nor the decision makes a pass over the nodes or the running jobs."""
    team_gpus: Counter[str] = field(default_factory=Counter)
    running_index: RunningIndex | None = None
    """The running jobs not draining, for the victim searches (see `running_index_from`)."""
    line: PendingIndex | None = None
    """The jobs of `queued` in line, for the queue pass, kept while the line is long: from
    `pending.INDEXED_FROM` jobs on (the queue pass reads it then), until it is half as long."""
    up: tuple[Node, ...] = field(init=False)
    """The nodes not out for repair, in the order of `nodes`: what the core is shown."""
    down: dict[str, float] = field(default_factory=dict)
    """Nodes out for repair, and since when."""
    clocks: dict[str, NodeClock] = field(default_factory=dict)
    node_gpus: dict[str, int] = field(default_factory=dict)
    """GPUs of each node, for the down time of the nodes that fail."""
    node_failures: int = 0
    node_down: float = 0.0
    outages: list[tuple[str, float, float]] = field(default_factory=list)
    finished: int = 0
    """Jobs that ended (succeeded, or failed after losing too many nodes)."""
    ended_at: float = 0.0
    """When the last of them ended."""
    all_arrived: bool = False
    decisions: int = 0
    budgets: BudgetMeter = field(init=False)

    def run(self) -> Outcome:
        """Replay every job to its end and return what happened."""
        self.up = tuple(self.nodes)
        self.free = FreeIndex(self.up)
        kept = self.config.preemption and len(self.up) >= self.running_index_from
        self.running_index = RunningIndex(self.up) if kept else None
        self.budgets = BudgetMeter.of(self.config.teams)
        arrivals = sorted(enumerate(self.jobs), key=lambda item: (item[1].submit, item[0]))
        if self.failures is not None and arrivals:
            self.node_gpus = {node.name: node.gpus for node in self.nodes}
            for node in self.up:
                clock = self.clocks[node.name] = self.failures.stream(node.name)
                self.push(arrivals[0][1].submit + clock.up_for(), Rank.NODE, node.name, 0)
        # Arrivals come from their sorted list, not the heap: they rank after the releases and
        # before the decision of their instant, and in their order (as if all pushed first).
        next_arrival = 0
        # The jobs and their records live to the end: the cyclic collector need not walk them
        # at every full collection (which made a replay's cost per job grow with its length).
        # Frozen as they arrive; thawed at the end unless the caller had frozen objects itself.
        thaw = gc.get_freeze_count() == 0
        gc.freeze()
        try:
            while self.heap or next_arrival < len(arrivals):
                self.all_arrived = next_arrival == len(arrivals)
                if self.all_arrived and self.stalled():
                    break
                now = self.heap[0][0] if self.heap else math.inf
                if next_arrival < len(arrivals):
                    now = min(now, arrivals[next_arrival][1].submit)
                dirty = False
                while self.heap and self.heap[0][0] == now and self.heap[0][1] < Rank.ARRIVAL:
                    _, rank, _, job_id, attempt_no = heapq.heappop(self.heap)
                    dirty |= self.handle(now, Rank(rank), job_id, attempt_no)
                while next_arrival < len(arrivals) and arrivals[next_arrival][1].submit == now:
                    self.arrive(now, *arrivals[next_arrival])
                    next_arrival += 1
                    dirty = True
                    if next_arrival % FREEZE_EVERY == 0:
                        gc.freeze()
                while self.heap and self.heap[0][0] == now:
                    _, rank, _, job_id, attempt_no = heapq.heappop(self.heap)
                    dirty |= self.handle(now, Rank(rank), job_id, attempt_no)
                if dirty and self.pending:
                    self.apply(self.decide(self.snapshot(now), self.config, now), now)
        finally:
            if thaw:
                gc.unfreeze()
        self.close_outages()
        return Outcome(
            [live.record for live in self.live.values()],
            self.usage,
            self.decisions,
            sum(n.gpus for n in self.nodes),
            self.node_failures,
            self.node_down,
            self.outages,
        )

    def push(self, time: float, rank: Rank, job_id: str = "", attempt_no: int = -1) -> None:
        heapq.heappush(self.heap, (time, int(rank), next(self.seq), job_id, attempt_no))

    def arrive(self, now: float, order: int, job: SimJob) -> None:
        # Preempting even a first attempt costs the restart of the next one.
        core = Job(
            job.id,
            job.team,
            job.priority,
            job.gpus,
            job.submit,
            gpus_per_node=job.gpus_per_node,
            gpu_type=job.gpu_type,
            expected_restart=self.restart_cost(job),
            order=order,
        )
        live = self.live[job.id] = _Live(JobRecord(job), core)
        self.pending[job.id] = live
        self.queued[job.id] = core
        self.in_line(core)
        self.pending_since[job.id] = now

    def restart_cost(self, job: SimJob) -> float:
        return self.model.restart_cost if job.restart_cost is None else job.restart_cost

    def handle(self, now: float, rank: Rank, job_id: str, attempt_no: int) -> bool:
        """Apply one event; True when the scheduler should look again."""
        if rank is Rank.DECIDE:
            return True
        if rank is Rank.NODE:
            return self.node_event(now, job_id, back=attempt_no == 1)
        live = self.live[job_id]
        if live.attempt is None or live.attempt_no != attempt_no:
            return False  # the attempt this event was for has already ended
        if live.cut is not None and live.cut.release_at < live.attempt.finish_time():
            self.release(live, live.cut, now)
        else:
            self.complete(live, now)
        return True

    def stalled(self) -> bool:
        """Whether only node failures are left to come: nothing runs, no node is out, and the
        jobs still waiting were decided on with every node up, so none can ever start (without
        failures, the heap would be empty)."""
        if self.running or self.down or self.failures is None:
            return False
        return all(event[1] == Rank.NODE for event in self.heap)

    def close_outages(self) -> None:
        """Nodes still out when the last job ended: their outage is counted up to then."""
        end = self.ended_at
        for name, since in sorted(self.down.items(), key=lambda item: item[1]):
            self.outages.append((name, since, max(since, end)))
            self.node_down += max(0.0, end - since) * self.node_gpus[name]
        self.down.clear()

    def node_event(self, now: float, name: str, *, back: bool) -> bool:
        """Node `name` fails (every attempt with a GPU there is lost) or is back from repair.
        Failures stop once every job has finished."""
        if self.finished == len(self.jobs):
            return False
        clock = self.clocks[name]
        if back:
            since = self.down.pop(name)
            self.outages.append((name, since, now))
            self.node_down += (now - since) * self.node_gpus[name]
            self.push(now + clock.up_for(), Rank.NODE, name, 0)
        elif self.all_arrived and not self.running:
            # Nothing to lose, and nothing will arrive: a failure now could only keep the jobs
            # left waiting from ever having every node up at once (the replay would not end).
            self.push(now + clock.up_for(), Rank.NODE, name, 0)
            return False
        else:
            lost = [self.running[j] for j, r in self.placed.items() if any(a.node == name for a in r.placement)]
            for live in lost:
                self.lose(live, name, now)
            self.down[name] = now
            self.node_failures += 1
            self.push(now + clock.down_for(), Rank.NODE, name, 1)
        self.up = tuple(n for n in self.nodes if n.name not in self.down)
        self.free = FreeIndex(self.up)
        for running in self.placed.values():
            for alloc in running.placement:
                self.free.take(alloc.node, alloc.gpus)
        if self.running_index is not None:
            self.running_index = RunningIndex.of(self.up, self.placed.values())
        return True

    def lose(self, live: _Live, node: str, now: float) -> None:
        """The attempt is lost with its node: it resumes from its last commit (before its
        notice, if it had one: a draining job makes no periodic save)."""
        assert live.attempt is not None
        live.committed = live.attempt.at(live.notice_at if live.notice_at is not None else now).committed
        ending = AttemptEnd(None, noticed=live.notice_at is not None, node_lost=f"node {node} failed")
        settled = self.end_attempt(live, now, ending)
        live.record.node_losses = settled.node_losses
        if settled.state is JobState.PENDING:
            self.requeue(live, now)
            return
        assert settled.state is JobState.FAILED  # it lost more nodes than `max_node_losses`
        live.record.failed = True
        self.charge(live, now)

    def complete(self, live: _Live, now: float) -> None:
        """The job has done its work: it succeeds, or fails as the trace says it did (even
        during a drain: it failed before it could leave)."""
        if live.record.job.fails:
            ending = AttemptEnd(1, why="it failed in the trace")
        else:
            ending = AttemptEnd(0, completed=True, noticed=live.notice_at is not None)
        settled = self.end_attempt(live, now, ending)
        assert settled.state is (JobState.FAILED if live.record.job.fails else JobState.SUCCEEDED)
        live.record.finish = now
        self.charge(live, now)

    def charge(self, live: _Live, now: float) -> None:
        """The job has ended: charge its interruptions, as the service's accounting does."""
        job = live.record.job
        if any(a.outcome in INTERRUPTED for a in live.attempts):  # else it lost nothing
            for cut in account(0, job.team, job.priority, live.attempts, now).interruptions:
                lost = cut.wasted + cut.drain + (cut.restart or 0.0)
                live.record.wasted += cut.wasted
                live.record.drain += cut.drain
                live.record.restart += cut.restart or 0.0
                if cut.cause == AttemptOutcome.NODE_LOST:
                    live.record.lost_to_nodes += lost
                elif cut.cause == AttemptOutcome.FAILED:
                    live.record.lost_to_failure += lost
        live.attempts = []
        self.finished += 1
        self.ended_at = now
        if self.on_progress is not None and self.finished % 1000 == 0:
            self.on_progress(self.finished)

    def release(self, live: _Live, cut: Interruption, now: float) -> None:
        assert live.notice_at is not None and live.running is not None and live.running.notice is not None
        live.committed = cut.committed
        settled = self.end_attempt(live, now, AttemptEnd(0, noticed=True))
        assert settled.state is JobState.PENDING
        live.record.preemptions += settled.preemptions - live.core.preemptions
        live.core = replace(live.core, preemptions=settled.preemptions)
        self.requeue(live, now)

    def requeue(self, live: _Live, now: float) -> None:
        live.core = replace(live.core, queued_at=now)
        self.pending[live.record.job.id] = live
        self.queued[live.record.job.id] = live.core
        self.in_line(live.core)
        self.pending_since[live.record.job.id] = now

    def in_line(self, job: Job) -> None:
        """`job` is in `queued` (again, or changed): in the pending index too, if it is kept."""
        if self.line is not None:
            self.line.add(job)
        elif len(self.queued) >= pending.INDEXED_FROM:
            self.line = PendingIndex(self.queued.values())

    def out_of_line(self, job_id: str) -> None:
        """`job_id` left `queued`."""
        if self.line is not None:
            self.line.remove(job_id)
            if len(self.queued) < pending.INDEXED_FROM // 2:
                self.line = None

    def end_attempt(self, live: _Live, now: float, ending: AttemptEnd) -> Settlement:
        """The attempt's process is gone: settle it as the store does and free its GPUs. A
        simulated job exits 0, reporting completion when its work is done (even during a
        drain), else after the save its notice asked for; or its node is lost; or, when the
        trace says it failed, it exits 1 when its work is done."""
        attempt = live.attempt
        assert attempt is not None
        job = live.record.job
        counts = JobCounts(
            preemptions=live.core.preemptions,
            node_losses=live.record.node_losses,
            max_node_losses=self.config.max_node_losses,
        )
        settled = settle(ending, counts)
        live.record.allocated += job.gpus * (now - attempt.start)
        live.attempts.append(self.attempt_record(live, attempt, now, settled.outcome))
        assert live.running is not None
        for alloc in live.running.placement:
            self.free.give(alloc.node, alloc.gpus)
        if live.running.notice is None:
            self.count_gpus(job.team, -job.gpus)
            if self.running_index is not None:
                self.running_index.remove(job.id)
        live.attempt = None
        live.running = None
        live.notice_at = None
        live.cut = None
        del self.running[job.id]
        del self.placed[job.id]
        self.noticed.pop(job.id, None)
        self.budgets.end(job.id, now)
        self.usage.append(Usage(now, job.priority, -job.gpus))
        return settled

    def attempt_record(self, live: _Live, attempt: Attempt, now: float, outcome: AttemptOutcome) -> AttemptRecord:
        """The attempt as the live service would have recorded it: its checkpoint commits are
        the one a notice found last and the one a notice's save made (steps count milliseconds
        of the job's work, so that the next attempt's restored step names one of them)."""
        commits = []
        if outcome in (AttemptOutcome.NODE_LOST, AttemptOutcome.FAILED):
            at_loss = attempt.at(live.notice_at if live.notice_at is not None else now)
            if at_loss.last_commit_at is not None:
                commits.append(Commit(at_loss.last_commit_at, _step(at_loss.committed)))
        elif live.notice_at is not None and live.cut is not None:
            at_notice = attempt.at(live.notice_at)
            if at_notice.last_commit_at is not None:
                commits.append(Commit(at_notice.last_commit_at, _step(at_notice.committed)))
            if live.cut.committed > at_notice.committed:
                commits.append(Commit(live.cut.release_at, _step(live.cut.committed)))
        return AttemptRecord(
            live.attempt_no,
            live.record.job.gpus,
            attempt.start,
            now,
            attempt.productive_start,
            live.notice_at,
            _step(attempt.committed) if live.attempt_no > 0 else None,
            attempt.restore,
            tuple(commits),
            outcome.value,
        )

    def snapshot(self, now: float) -> Snapshot:
        if self.running_index is not None:
            self.running_index.refresh = partial(self.follow_commits, now)
        return Snapshot(
            self.up,
            _Values(self.placed, partial(self.follow_commits, now)),
            list(self.queued.values()),
            self.budgets.usage(now),
            free=self.free,
            team_gpus=self.team_gpus,
            draining=list(self.noticed.values()),
            pending_index=self.line,
            running_index=self.running_index,
        )

    def follow_commits(self, now: float) -> None:
        """Bring every running attempt's `last_checkpoint_at` up to `now`: when the core first
        reads the running jobs (to weigh victims), not at every decision."""
        while self.commits and self.commits[0][0] <= now:
            _, job_id, attempt_no = heapq.heappop(self.commits)
            live = self.live[job_id]
            running = live.running
            if live.attempt is None or running is None or live.attempt_no != attempt_no:
                continue
            last, following = live.attempt.commits_around(now)
            live.running = self.placed[job_id] = running.checkpointed(last)
            if job_id in self.noticed:
                self.noticed[job_id] = live.running
            elif self.running_index is not None:
                self.running_index.checkpointed(live.running)
            if following is not None:
                heapq.heappush(self.commits, (following, job_id, attempt_no))

    def count_gpus(self, team: str, gpus: int) -> None:
        """`gpus` more (or fewer) for `team` among jobs that are not draining; a team at none
        is not listed, as a count from the running jobs would not list it."""
        held = self.team_gpus[team] + gpus
        if held:
            self.team_gpus[team] = held
        else:
            del self.team_gpus[team]

    def watch_commits(self, live: _Live, now: float) -> None:
        """Keep the attempt's `last_checkpoint_at` up to date. Only a victim's lost work reads
        it: without preemption the core has no victims, and the commits are not followed."""
        if not self.config.preemption:
            return
        assert live.attempt is not None
        commit = live.attempt.next_commit_after(now)
        if commit is not None:
            heapq.heappush(self.commits, (commit, live.record.job.id, live.attempt_no))

    def apply(self, plan: Plan, now: float) -> None:
        self.decisions += 1
        if self.on_plan is not None:
            self.on_plan(now, plan)
        for start in plan.starts:
            live = self.pending.pop(start.job)
            del self.queued[start.job]
            self.out_of_line(start.job)
            job = live.record.job
            live.record.wait += now - self.pending_since.pop(start.job)
            if live.record.first_start is None:
                live.record.first_start = now
            live.attempt_no += 1
            restore = self.restart_cost(job) if live.attempt_no > 0 else 0.0
            live.attempt = Attempt(
                now,
                restore,
                live.committed,
                job.work,
                self.model.interval_of(job.priority),
                self.model.save_cost if job.save_cost is None else job.save_cost,
            )
            if live.core.nominated:
                live.core = replace(live.core, nominated=False)
            live.running = self.placed[job.id] = RunningJob(live.core, start.placement, now, priority=start.priority)
            for alloc in start.placement:
                self.free.take(alloc.node, alloc.gpus)
            self.count_gpus(job.team, job.gpus)
            if self.running_index is not None:
                self.running_index.add(live.running)
            self.running[job.id] = live
            self.budgets.start(job.id, job.team, start.priority, job.gpus, now)
            self.usage.append(Usage(now, job.priority, job.gpus))
            self.push(live.attempt.finish_time(), Rank.RELEASE, job.id, live.attempt_no)
            self.watch_commits(live, now)
        for preempt in plan.preemptions:
            # As the store does: the preemptor is nominated at its first notice, so the GPUs
            # freed for it are its own however its victims leave (a drain, or finishing first).
            preemptor = self.pending[preempt.for_job]
            if not preemptor.core.nominated:
                preemptor.core = self.queued[preempt.for_job] = replace(preemptor.core, nominated=True)
                self.in_line(preemptor.core)
            live = self.running[preempt.victim]
            assert live.attempt is not None and live.running is not None
            live.notice_at = now
            live.running = self.placed[preempt.victim] = self.noticed[preempt.victim] = replace(
                live.running, notice=Notice(preempt.for_job, preempt.deadline)
            )
            self.count_gpus(live.record.job.team, -live.record.job.gpus)
            if self.running_index is not None:
                self.running_index.remove(preempt.victim)
            live.cut = interrupt(live.attempt, now, preempt.deadline)
            if live.cut.release_at < live.attempt.finish_time():
                self.push(live.cut.release_at, Rank.RELEASE, preempt.victim, live.attempt_no)
        if plan.retry_at is not None and plan.retry_at > now:
            self.push(plan.retry_at, Rank.DECIDE)


class _Values(Sequence[RunningJob]):
    """The running jobs of a snapshot without copying them, brought up to date (`refresh`) when
    first read: with the driver's free GPUs, team GPUs and drains given, the core reads them
    only to build preemption candidates, which few decisions do. Valid until the simulator
    carries the plan out, which is all a decision needs."""

    def __init__(self, jobs: dict[str, RunningJob], refresh: Callable[[], None]) -> None:
        self._jobs = jobs
        self._refresh: Callable[[], None] | None = refresh
        self._list: list[RunningJob] | None = None

    def _read(self) -> dict[str, RunningJob]:
        if self._refresh is not None:
            self._refresh()
            self._refresh = None
        return self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[RunningJob]:
        return iter(self._read().values())

    @overload
    def __getitem__(self, index: int) -> RunningJob: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[RunningJob]: ...
    def __getitem__(self, index: int | slice) -> RunningJob | Sequence[RunningJob]:
        if self._list is None:
            self._list = list(self._read().values())
        return self._list[index]


def _step(work: float) -> int:
    return round(work * 1000)
