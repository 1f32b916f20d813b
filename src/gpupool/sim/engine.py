"""The simulator: a virtual clock and an event heap driving the very `decide` of the service.

Events at one instant are handled in rank order (releases and completions, then arrivals,
then the scheduling pass), and same-rank events in the order they were scheduled, so a run
is a pure function of its inputs. The simulator keeps the core's state as every driver does,
in one `policy.PoolState` it feeds event by event; beside it, only what the core does not see:
each job's simulated progress (`sim.lives`).
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from functools import partial

from gpupool.model import Config, Job, Node, Plan, RunningJob
from gpupool.policy import PoolState, decide
from gpupool.settle import AttemptEnd, JobCounts, JobState, Settlement, settle
from gpupool.sim.budgets import BudgetMeter
from gpupool.sim.elastic import DEFAULT_PARALLEL, pace
from gpupool.sim.failures import NodeFailures
from gpupool.sim.jobmodel import Attempt, JobModel, interrupt
from gpupool.sim.lives import Live, charge
from gpupool.sim.outages import Outages
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
class Simulation:
    jobs: Sequence[SimJob]
    nodes: Sequence[Node]
    config: Config
    model: JobModel
    on_progress: Callable[[int], None] | None = None
    """Called now and then with the number of jobs finished so far."""
    on_plan: Callable[[float, Plan], None] | None = None
    """Called with every plan `decide` returns, before it is carried out."""
    decide: Callable[[PoolState, Config, float], Plan] = decide
    """The scheduling core; the simulator carries out exactly what it decides. The state it is
    given is the simulator's own, read only and valid during the call."""
    failures: NodeFailures | None = None
    parallel: float = DEFAULT_PARALLEL
    """The parallel fraction of elastic jobs' work: how fast one runs at another size
    (`sim.elastic.pace`)."""
    state: PoolState = field(init=False)
    heap: list[tuple[float, int, int, str, int]] = field(default_factory=list)
    commits: list[tuple[float, str, int]] = field(default_factory=list)
    """(time, job, attempt) of the next checkpoint commit of each running attempt."""
    seq: itertools.count[int] = field(default_factory=itertools.count)
    live: dict[str, Live] = field(default_factory=dict)
    usage: list[Usage] = field(default_factory=list)
    outages: Outages | None = None
    finished: int = 0
    """Jobs that ended (succeeded, or failed after losing too many nodes)."""
    ended_at: float = 0.0
    """When the last of them ended."""
    all_arrived: bool = False
    decisions: int = 0
    budgets: BudgetMeter = field(init=False)

    def run(self) -> Outcome:
        """Replay every job to its end and return what happened."""
        self.state = PoolState(tuple(self.nodes))
        self.budgets = BudgetMeter.of(self.config.teams)
        arrivals = sorted(enumerate(self.jobs), key=lambda item: (item[1].submit, item[0]))
        if self.failures is not None and arrivals:
            self.outages = Outages(self.nodes, self.failures)
            for node in self.nodes:
                self.push(arrivals[0][1].submit + self.outages.clocks[node.name].up_for(), Rank.NODE, node.name, 0)
        # The jobs and their records live to the end: the cyclic collector need not walk them
        # at every full collection (which made a replay's cost per job grow with its length).
        # Frozen as they arrive; thawed at the end unless the caller had frozen objects itself.
        thaw = gc.get_freeze_count() == 0
        gc.freeze()
        try:
            self.replay(arrivals)
        finally:
            if thaw:
                gc.unfreeze()
        outages = self.outages
        if outages is not None:
            outages.close(self.ended_at)
        return Outcome(
            [live.record for live in self.live.values()],
            self.usage,
            self.decisions,
            sum(n.gpus for n in self.nodes),
            outages.count if outages is not None else 0,
            outages.down_gpu_seconds if outages is not None else 0.0,
            outages.outages if outages is not None else [],
        )

    def replay(self, arrivals: Sequence[tuple[int, SimJob]]) -> None:
        """Every instant something happens: its releases and node events, its arrivals (from
        their sorted list, not the heap: they rank after the releases and before the decision of
        their instant, in their order), then its other events and one decision."""
        heap = self.heap
        count = len(arrivals)
        next_arrival = 0
        while heap or next_arrival < count:
            self.all_arrived = next_arrival == count
            if self.all_arrived and self.stalled():
                break
            now = heap[0][0] if heap else math.inf
            if next_arrival < count:
                now = min(now, arrivals[next_arrival][1].submit)
            dirty = False
            while heap and heap[0][0] == now and heap[0][1] < Rank.ARRIVAL:
                _, rank, _, job_id, attempt_no = heapq.heappop(heap)
                dirty |= self.handle(now, rank, job_id, attempt_no)
            while next_arrival < count and arrivals[next_arrival][1].submit == now:
                self.arrive(now, *arrivals[next_arrival])
                next_arrival += 1
                dirty = True
                if next_arrival % FREEZE_EVERY == 0:
                    gc.freeze()
            while heap and heap[0][0] == now:
                _, rank, _, job_id, attempt_no = heapq.heappop(heap)
                dirty |= self.handle(now, rank, job_id, attempt_no)
            if dirty and (self.state.line or self.state.growable):
                self.decide_at(now)

    def push(self, time: float, rank: int, job_id: str = "", attempt_no: int = -1) -> None:
        heapq.heappush(self.heap, (time, rank, next(self.seq), job_id, attempt_no))

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
            sizes=job.sizes,
        )
        self.live[job.id] = Live(JobRecord(job), waiting_since=now)
        self.state.queue(core)

    def restart_cost(self, job: SimJob) -> float:
        return self.model.restart_cost if job.restart_cost is None else job.restart_cost

    def handle(self, now: float, rank: int, job_id: str, attempt_no: int) -> bool:
        """Apply one event (of `Rank` `rank`); True when the scheduler should look again."""
        if rank == Rank.DECIDE:
            return True
        if rank == Rank.NODE:
            return self.node_event(now, job_id, back=attempt_no == 1)
        live = self.live[job_id]
        if live.attempt is None or live.attempt_no != attempt_no:
            return False  # the attempt this event was for has already ended
        if live.cut is not None and live.cut.release_at < live.attempt.finish_time():
            self.release(job_id, live, now)
        else:
            self.complete(job_id, live, now)
        return True

    def stalled(self) -> bool:
        """Whether only node failures are left to come: nothing runs, no node is out, and the
        jobs still waiting were decided on with every node up, so none can ever start (without
        failures, the heap would be empty)."""
        if self.state.running or self.outages is None or self.outages.down:
            return False
        return all(event[1] == Rank.NODE for event in self.heap)

    def node_event(self, now: float, name: str, *, back: bool) -> bool:
        """Node `name` fails (every attempt with a GPU there is lost) or is back from repair.
        Failures stop once every job has finished."""
        outages = self.outages
        assert outages is not None
        if self.finished == len(self.jobs):
            return False
        if back:
            self.push(outages.back(name, now), Rank.NODE, name, 0)
        elif self.all_arrived and not self.state.running:
            # Nothing to lose, and nothing will arrive: a failure now could only keep the jobs
            # left waiting from ever having every node up at once (the replay would not end).
            self.push(now + outages.clocks[name].up_for(), Rank.NODE, name, 0)
            return False
        else:
            # A growing job's next attempt holds GPUs there too: it is lost with the node.
            lost = [j for j, r in self.state.running.items() if any(a.node == name for a in r.holds)]
            for job_id in lost:
                self.lose(job_id, name, now)
            self.push(outages.fail(name, now), Rank.NODE, name, 1)
        self.state = self.state.on_nodes(outages.up())
        return True

    def lose(self, job_id: str, node: str, now: float) -> None:
        """The attempt is lost with its node: it resumes from its last commit (before its
        notice, if it had one: a draining job makes no periodic save)."""
        live = self.live[job_id]
        assert live.attempt is not None
        live.committed = live.attempt.at(live.notice_at if live.notice_at is not None else now).committed
        ending = AttemptEnd(None, noticed=live.notice_at is not None, node_lost=f"node {node} failed")
        job, settled = self.end_attempt(job_id, live, now, ending)
        live.record.node_losses = settled.node_losses
        if settled.state is JobState.PENDING:
            self.requeue(live, job, now)
            return
        assert settled.state is JobState.FAILED  # it lost more nodes than `max_node_losses`
        live.record.failed = True
        self.finish(live, now)

    def complete(self, job_id: str, live: Live, now: float) -> None:
        """The job has done its work: it succeeds, or fails as the trace says it did (even
        during a drain: it failed before it could leave)."""
        if live.record.job.fails:
            ending = AttemptEnd(1, why="it failed in the trace")
        else:
            ending = AttemptEnd(0, completed=True, noticed=live.notice_at is not None)
        _, settled = self.end_attempt(job_id, live, now, ending)
        assert settled.state is (JobState.FAILED if live.record.job.fails else JobState.SUCCEEDED)
        live.record.finish = now
        self.finish(live, now)

    def finish(self, live: Live, now: float) -> None:
        """The job has ended: charge its interruptions, as the service's accounting does."""
        charge(live, now)
        self.finished += 1
        self.ended_at = now
        if self.on_progress is not None and self.finished % 1000 == 0:
            self.on_progress(self.finished)

    def release(self, job_id: str, live: Live, now: float) -> None:
        assert live.notice_at is not None and live.cut is not None
        live.committed = live.cut.committed
        notice = self.state.running[job_id].notice
        if notice is not None and notice.keep:
            self.resize(job_id, live, now)
            return
        job, settled = self.end_attempt(job_id, live, now, AttemptEnd(0, noticed=True))
        assert settled.state is JobState.PENDING
        live.record.preemptions += settled.preemptions - job.preemptions
        self.requeue(live, replace(job, preemptions=settled.preemptions), now)

    def resize(self, job_id: str, live: Live, now: float) -> None:
        """The elastic job saved and left after its resize's notice: it starts again at once on
        the GPUs the notice kept (`PoolState.resized`), at their size."""
        running = self.state.running[job_id]
        assert running.notice is not None
        size = sum(len(a.gpus) for a in running.notice.keep)
        _, settled = self.end_attempt(job_id, live, now, AttemptEnd(0, noticed=True, resized_to=size))
        assert settled.state is JobState.STARTING
        live.record.resizes += 1
        self.begin(self.state.resized(job_id, now), now, resumed=True)

    def requeue(self, live: Live, job: Job, now: float) -> None:
        self.state.queue(replace(job, queued_at=now))
        live.waiting_since = now

    def end_attempt(self, job_id: str, live: Live, now: float, ending: AttemptEnd) -> tuple[Job, Settlement]:
        """The attempt's process is gone: settle it as the store does and free its GPUs. A
        simulated job exits 0, reporting completion when its work is done (even during a
        drain), else after the save its notice asked for; or its node is lost; or, when the
        trace says it failed, it exits 1 when its work is done. Returns the job as it ran."""
        attempt = live.attempt
        assert attempt is not None
        running = self.state.running[job_id] if ending.resized_to is not None else self.state.end(job_id)
        assert running is not None
        job = running.job
        counts = JobCounts(
            preemptions=job.preemptions,
            node_losses=live.record.node_losses,
            max_node_losses=self.config.max_node_losses,
        )
        settled = settle(ending, counts)
        live.record.allocated += job.gpus * (now - attempt.start)
        # What it keeps of this attempt's work, at the GPU-seconds the attempt took for it.
        kept = attempt.work if ending.completed or ending.exit_code == 1 else live.committed
        live.record.useful += job.gpus * max(0.0, kept - attempt.committed) / attempt.pace
        live.end(now, settled.outcome)
        self.budgets.end(job_id, now)
        self.usage.append(Usage(now, job.priority, -job.gpus))
        return job, settled

    def decide_at(self, now: float) -> None:
        """Decide on the kept state and carry the plan out. Checkpoint commits are brought up
        to date only if the decision reads them (to weigh victims), not at every decision."""
        state = self.state
        state.usage = self.budgets.usage(now)
        if self.config.preemption:
            state.follow_commits = partial(self.follow_commits, now)
        plan = self.decide(state, self.config, now)
        self.apply(plan, now)

    def follow_commits(self, now: float) -> None:
        """Bring every running attempt's last checkpoint up to `now`."""
        while self.commits and self.commits[0][0] <= now:
            _, job_id, attempt_no = heapq.heappop(self.commits)
            live = self.live[job_id]
            if live.attempt is None or job_id not in self.state.running or live.attempt_no != attempt_no:
                continue
            last, following = live.attempt.commits_around(now)
            self.state.checkpoint(job_id, last)
            if following is not None:
                heapq.heappush(self.commits, (following, job_id, attempt_no))

    def watch_commits(self, job_id: str, live: Live, now: float) -> None:
        """Keep the attempt's last checkpoint up to date. Only a victim's lost work reads it:
        without preemption the core has no victims, and the commits are not followed."""
        if not self.config.preemption:
            return
        assert live.attempt is not None
        commit = live.attempt.next_commit_after(now)
        if commit is not None:
            heapq.heappush(self.commits, (commit, job_id, live.attempt_no))

    def apply(self, plan: Plan, now: float) -> None:
        self.decisions += 1
        if self.on_plan is not None:
            self.on_plan(now, plan)
        self.state.apply(plan, now)
        for start in plan.starts:
            self.begin(self.state.running[start.job], now)
        for preempt in plan.preemptions:
            self.give_notice(preempt.victim, preempt.deadline, now)
        for grow in plan.grows:
            self.give_notice(grow.job, grow.deadline, now)
        if plan.retry_at is not None and plan.retry_at > now:
            self.push(plan.retry_at, Rank.DECIDE)

    def begin(self, running: RunningJob, now: float, *, resumed: bool = False) -> None:
        """An attempt of `running.job` begins at its size: from its last commit, after a restore
        if it ran before; a resized job's at once (`resumed`), without a wait in line."""
        live = self.live[running.job.id]
        job = live.record.job
        if not resumed:
            live.record.wait += now - live.waiting_since
        if live.record.first_start is None:
            live.record.first_start = now
        live.attempt_no += 1
        restore = self.restart_cost(job) if live.attempt_no > 0 else 0.0
        save_cost = self.model.save_cost if job.save_cost is None else job.save_cost
        gpus = running.job.gpus
        live.gpus = gpus
        interval, speed = self.model.interval_of(job.priority), pace(gpus, job.gpus, self.parallel)
        live.attempt = Attempt(now, restore, live.committed, job.work, interval, save_cost, speed)
        self.budgets.start(job.id, job.team, running.priority or job.priority, gpus, now)
        self.usage.append(Usage(now, job.priority, gpus))
        self.push(live.attempt.finish_time(), Rank.RELEASE, job.id, live.attempt_no)
        self.watch_commits(job.id, live, now)

    def give_notice(self, job_id: str, deadline: float, now: float) -> None:
        """The job drains (a victim, or an elastic job to be resized): it saves if the save
        fits its grace, and leaves."""
        live = self.live[job_id]
        assert live.attempt is not None
        live.notice_at = now
        live.cut = interrupt(live.attempt, now, deadline)
        if live.cut.release_at < live.attempt.finish_time():
            self.push(live.cut.release_at, Rank.RELEASE, job_id, live.attempt_no)
