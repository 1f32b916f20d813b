"""The control loop: store → snapshot → decide → store → executor, on the wall clock.

`tick(now)` is one iteration and does not sleep, so tests drive it with any clock. `run()`
ticks again at once when a tick did work, and otherwise sleeps until the next notice deadline,
the next `retry_at`, a wake-up from an event (submit, exit, report, cancel) or `interval`.
Decisions are recorded in the store before the executor acts on them; after a crash,
`reconcile()` adopts the attempts whose processes still run and requeues the others.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from gpupool.errors import Conflict, InvalidInput
from gpupool.executors import Executor, Exit, Key, NodeState, Resources
from gpupool.executors.containment import unfit
from gpupool.executors.users import JobUser, job_user
from gpupool.model import Config, Node, Placement, Plan, Reason, SessionKind, Wait
from gpupool.policy import PoolState, decide
from gpupool.service.adoption import Adoption
from gpupool.service.launches import prepare_launch, protocol_env
from gpupool.service.observer import Observer
from gpupool.service.sessions import Sessions
from gpupool.service.snapshots import UNEXPLAINED, KeptSnapshots
from gpupool.service.workspace import Workspace, token_hash
from gpupool.settle import JobState
from gpupool.store import Store
from gpupool.store.attempts import run_time
from gpupool.store.schema import JobRow

log = logging.getLogger("gpupool.service")


@dataclass
class ControlLoop(Adoption):
    store: Store
    config: Config
    executor: Executor
    data_dir: Path
    api_url: str = ""
    interval: float = 1.0
    settle: float = 0.02
    """After a wake-up, how long to let more events arrive so that a burst makes one decision."""
    wakeup: threading.Event = field(default_factory=threading.Event)
    retry_at: float | None = None
    killed: set[Key] = field(default_factory=set)
    unrecorded: list[Exit] = field(default_factory=list)
    """Exits the executor reported that the store has not taken yet."""
    unmarked: dict[Key, str] = field(default_factory=dict)
    """Attempts the executor reported running (and where) that the store has not taken yet."""
    deadlines: list[float] = field(default_factory=list)
    """Notice and cancel deadlines still to come, as of the last tick: when to wake up."""
    nodes_seen: list[tuple[Node, bool]] | None = None
    """The executor's nodes as last written to the store."""
    dirty: dict[str, dict[int, str]] = field(default_factory=dict)
    """Per node, its GPUs that a process of no live attempt holds (the executor's NVML look),
    with that process: kept from new jobs (`KeptSnapshots.read`) until it ends."""
    told: dict[str, tuple[Reason, str]] = field(default_factory=dict)
    """The reason to wait last recorded for each pending job."""
    holding: set[str] = field(default_factory=set)
    """The jobs last recorded as holding GPUs while their victims drain."""
    stopping: dict[Key, float] = field(default_factory=dict)
    """Attempts of cancelled jobs that got SIGTERM, with when they get SIGKILL."""
    requeued: set[Key] = field(default_factory=set)
    """Attempts a person requeued (a notice recorded by the API) that were given it."""
    resizing: set[int] = field(default_factory=set)
    """Resized jobs whose next attempt the store started and the loop has yet to launch."""
    job_user: str | None = None
    """The name of the OS user jobs run as, `{user}` and `{team}` replaced (from `service.run_as`
    and `service.job_user`, see executors/users.py); None: the scheduler's own user."""
    guard: Callable[[], str | None] = lambda: None
    """Why the loop must not decide now (its data directory or its store is not the one it
    started with, or another scheduler leads), or None."""
    halted: str | None = None
    """The guard's last answer: while it is not None, nothing is decided nor carried out."""
    observer: Observer | None = None
    """Told of every decision (the plan `decide` returns, before it is recorded and carried
    out, as the simulator's `on_plan`) and of every tick: the telemetry."""
    snapshots: KeptSnapshots = field(init=False)
    """What the loop decides on: the store read whole once, then what changed (snapshots.py)."""
    workspace: Workspace = field(init=False)
    """Where jobs' folders and logs are, under `data_dir` (workspace.py)."""
    sessions: Sessions = field(init=False)
    """What the loop has seen of each running session (sessions.py): the idle rule's input."""
    _intervals: tuple[float, dict[str, float]] | None = None

    def __post_init__(self) -> None:
        self.snapshots = KeptSnapshots(self.store)
        self.workspace = Workspace(self.data_dir, self.store.identity)
        self.sessions = Sessions(self.store, self.executor, self.config)

    # --- what the API may ask (interface.Service) ------------------------------------------------

    def wake(self) -> None:
        """Decide soon: a job was submitted or cancelled, a team's policy changed."""
        self.wakeup.set()

    def open_log(self, job: JobRow, attempt: int, stream: str, rank: int = 0) -> BinaryIO | None:
        """A member's log, open for reading, or None if there is none yet (`Workspace.open_log`:
        a file a job of another OS user chose is opened with that user's rights)."""
        try:
            user = job_user(self.job_user, job.user, job.team)
        except LookupError as exc:
            raise Conflict(f"job {job.label}'s log cannot be read: {exc}") from None
        return self.workspace.open_log(job, attempt, stream, rank, self.executor.logs, user)

    def check_runnable(self, user: str | None, team: str) -> None:
        """Refuse, at submit, a job no OS user could run: `InvalidInput` saying why."""
        try:
            job_user(self.job_user, user, team)
        except LookupError as exc:
            raise InvalidInput(f"user: {exc}") from None

    def check_resources(
        self, gpus: int, gpus_per_node: int | None, mem: int | None, mem_per_gpu: int | None, cpus: float | None
    ) -> None:
        """Refuse, at submit, memory or CPUs no node has: `InvalidInput` naming the limit."""
        problem = unfit(Resources(mem, mem_per_gpu, cpus), gpus_per_node or gpus, self.executor.nodes())
        if problem is not None:
            raise InvalidInput(problem)

    def job_defaults(self, priority: str | None, session: str | None) -> tuple[str, float | None]:
        """What a submission that names no class gets, and its class's time limit (`Config.defaults`)."""
        return self.config.defaults(priority, session)

    # --- one iteration -----------------------------------------------------------------------

    def tick(self, now: float) -> bool:
        """Reap ended attempts, kill those past their deadline, then decide and act.
        Returns whether anything changed. Nothing at all while the guard says not to."""
        if not self.guarded(now):
            return False
        changed = self.sync_nodes(now)
        changed |= self.reap(now)
        self.enforce_deadlines(now)
        changed |= self.sessions.review(now)
        changed |= self.store.settle_dependencies(now)
        state, holds = self.snapshots.read(now, {node: frozenset(gpus) for node, gpus in self.dirty.items()})
        if not state.line and not state.growable and not holds:
            self.retry_at = None
            return self.ticked(now, changed)
        plan = Plan()
        if state.line or state.growable:
            began = time.perf_counter()
            plan = decide(state, self.config, now)
            if self.observer is not None:
                self.observer.on_decision(now, state, plan, time.perf_counter() - began)
        self.retry_at = plan.retry_at
        # A job's reason to wait is written when it changes, not at every decision.
        shown = (*plan.waits, *holds, *self.past_depth(state, plan))
        waits = tuple(w for w in shown if self.told.get(w.job) != (w.reason, w.message))
        if not (waits or plan.starts or plan.preemptions or plan.grows):
            return self.ticked(now, changed)
        tokens = {start.job: secrets.token_urlsafe(24) for start in plan.starts}
        try:
            self.store.record_plan(replace(plan, waits=waits), now, {j: token_hash(t) for j, t in tokens.items()})
        except Conflict as exc:
            log.warning("the store refused a plan (%s); deciding again from a fresh snapshot", exc)
            self.snapshots.forget()
            return True
        self.told.update((w.job, (w.reason, w.message)) for w in waits)
        for w in waits:
            if w.reason is Reason.AWAITING_DRAIN:
                self.holding.add(w.job)
            else:
                self.holding.discard(w.job)
        for start in plan.starts:
            self.told.pop(start.job, None)
            self.holding.discard(start.job)
        for message in [*(p.message for p in plan.preemptions), *(g.message for g in plan.grows)] + [
            s.message for s in plan.starts
        ]:
            log.info("%s", message)
        self.carry_out(plan, tokens, now)
        return self.ticked(now, changed or bool(plan.starts or plan.preemptions or plan.grows), recorded=True)

    def past_depth(self, state: PoolState, plan: Plan) -> list[Wait]:
        """The jobs the decision did not explain, as they are past `policy.explain_depth` in
        line, whose recorded reason says nothing of their place in it: those that came in line
        (new, requeued, no longer held back) and those that held GPUs for their victims and no
        longer do. Told so once; they keep the reason they were last given after that, until a
        decision explains them."""
        depth = self.config.explain_depth
        if depth is None or not self.config.explain_waits:
            return []
        line = state.line.jobs
        self.holding &= line.keys()
        if not self.snapshots.arrived and not self.holding:
            return []
        decided = {s.job for s in plan.starts} | {w.job for w in plan.waits}
        message = (
            f"waits in line: why is worked out for the first {depth:,} jobs in line that wait, "
            "and it came in further back (policy.explain_depth)"
        )
        maybe = dict.fromkeys([*(str(job_id) for job_id in self.snapshots.arrived), *self.holding])
        unexplained = [job for job in maybe if self.told.get(job, (None, ""))[0] in UNEXPLAINED]
        return [Wait(job, Reason.IN_LINE, message) for job in unexplained if job in line and job not in decided]

    def ticked(self, now: float, changed: bool, recorded: bool = False) -> bool:
        """`changed`, after telling the observer of the tick (`recorded`: a plan was written,
        if only reasons to wait, which change what the store says but not what to do next)."""
        if self.observer is not None:
            self.observer.on_tick(now, changed or recorded)
        return changed

    def guarded(self, now: float) -> bool:
        """Whether the loop may decide: the guard's verdict, said loudly when it changes. On
        coming back, attempts are reconciled again (what ran meanwhile is not known)."""
        try:
            reason = self.guard()
        except Exception as exc:
            reason = f"the guard could not check the data directory and store ({exc})"
        if reason != self.halted:
            if reason is not None:
                log.error("gpupool stops deciding: %s", reason)
            else:
                log.warning("gpupool decides again: %s", self.halted)
        resumed = self.halted is not None and reason is None
        self.halted = reason
        if resumed:
            self.snapshots.forget()
            self.reconcile(now)
        return reason is None

    def sync_nodes(self, now: float | None = None) -> bool:
        """The executor's nodes into the store when they change: one that joined is used at
        this decision, one that left leaves the pool. A GPU that became dirty, or clean again,
        is recorded (an event), and so is a change."""
        states = self.executor.nodes()
        dirty_changed = self.note_dirty(states, time.time() if now is None else now)
        nodes = [(state.node, state.virtual) for state in states]
        if nodes == self.nodes_seen:
            return dirty_changed
        changed = self.store.sync_nodes(nodes)
        if changed and self.nodes_seen is not None:
            log.warning("the pool's nodes changed: %s", ", ".join(f"{n.name} ({n.gpus} GPUs)" for n, _ in nodes))
        self.nodes_seen = list(nodes)
        return changed or dirty_changed

    def note_dirty(self, states: list[NodeState], now: float) -> bool:
        """Keep each node's dirty GPUs, and record each that became dirty or clean."""
        dirty = {state.node.name: dict(state.dirty) for state in states if state.dirty}
        if dirty == self.dirty:
            return False
        notes: list[tuple[int | None, int | None, str]] = []
        for node in sorted(set(dirty) | set(self.dirty)):
            now_dirty, was = dirty.get(node, {}), self.dirty.get(node, {})
            for gpu in sorted(set(now_dirty) - set(was)):
                said = f"GPU {gpu} of {node} is dirty: {now_dirty[gpu]} belongs to no live attempt"
                notes.append((None, None, f"{said}; no job is given it until that process ends"))
            for gpu in sorted(set(was) - set(now_dirty)):
                notes.append((None, None, f"GPU {gpu} of {node} is clean again: {was[gpu]} has ended"))
        for _, _, message in notes:
            log.warning("%s", message)
        self.store.note("gpu_dirty", notes, now)
        self.dirty = dirty
        return True

    def reap(self, now: float) -> bool:
        # Reports stay here until the store has them: the executor gives each one only once.
        progress = self.executor.poll()
        if progress.notes:
            for job_id, attempt, message in progress.notes:
                log.warning("job %s attempt %s: %s", job_id, attempt, message)
            self.store.note("leftover_killed", progress.notes, now)
        for key in progress.worked:
            self.sessions.active(key, now)
        self.unrecorded.extend(progress.ended)
        self.unmarked.update(progress.running)
        if self.unmarked:
            self.store.mark_started([(*key, None, True, where) for key, where in self.unmarked.items()], now)
            self.unmarked = {}
        ended, self.unrecorded = self.unrecorded, []
        try:
            self.sessions.forget([(e.job_id, e.attempt) for e in ended if not e.started])
            for never in [e for e in ended if not e.started]:
                with contextlib.suppress(Conflict):  # recorded already: no longer live
                    self.store.retry_launch(never.job_id, never.attempt, now, never.why or "not started")
            ended = [e for e in ended if e.started]
            keys = [(e.job_id, e.attempt) for e in ended]
            states = self.store.end_attempts(
                [(e.job_id, e.attempt, e.exit_code, e.why, e.node_lost, e.usage) for e in ended],
                now,
                self.config.max_node_losses,
                idle=self.sessions.idle_at_end(keys, now),
            )
            self.sessions.forget(keys)
        except Exception:
            self.unrecorded = ended
            raise
        resized = [exit.job_id for exit, state in zip(ended, states, strict=True) if state is JobState.STARTING]
        self.resume_resized(resized, now)  # and those a tick before could not
        for exit, state in zip(ended, states, strict=True):
            self.killed.discard((exit.job_id, exit.attempt))
            self.stopping.pop((exit.job_id, exit.attempt), None)
            self.requeued.discard((exit.job_id, exit.attempt))
            if state is None:
                log.warning("job %s attempt %s ended but is not live in the store", exit.job_id, exit.attempt)
        return bool(ended or progress.running)

    def resume_resized(self, job_ids: Sequence[int], now: float) -> None:
        """Launch at once the next attempts of resized jobs (the store started them when their
        last attempts ended, on the GPUs the resize kept), each with a token of its own."""
        self.resizing.update(job_ids)
        if not self.resizing:
            return
        waiting = sorted(self.resizing)
        tokens = {str(job_id): secrets.token_urlsafe(24) for job_id in waiting}
        # Should this fail (the store out of reach), they are tried again at the next tick.
        started = self.store.give_tokens({int(job): token_hash(token) for job, token in tokens.items()})
        self.resizing.difference_update(waiting)
        self.launch_all(list(started.values()), tokens, now)

    def enforce_deadlines(self, now: float) -> None:
        """Kill attempts past their notice deadline; stop those of cancelled jobs (SIGTERM,
        then SIGKILL after their class's grace period); give notice to those that reached their
        job's time limit (they end as TIMEOUT at the end of their grace)."""
        self.deadlines = []
        for attempt, job in self.store.watched_attempts():
            key = (attempt.job_id, attempt.attempt)
            if job.time_limit is not None and attempt.timeout_at is None:
                left = job.time_limit - job.run_seconds - run_time(attempt, now)
                if left > 0:
                    if attempt.notice_at is None:
                        self.deadlines.append(now + left)
                else:
                    grace = self.config.priority_class(job.priority).grace_period
                    deadline = min(now + grace, attempt.notice_deadline or now + grace)
                    if self.store.reach_time_limit(*key, deadline, now):
                        self.executor.notify(*key, deadline)
                        attempt.notice_deadline = deadline
            if attempt.notice_at is not None and attempt.notice_for is None and key not in self.requeued:
                # A person's requeue, recorded by the API: the notice is given here, as the
                # loop gives every other, then it drains as a preemption does.
                self.requeued.add(key)
                self.executor.notify(*key, attempt.notice_deadline or now)
            if job.cancel_requested_at is not None:
                self.stop(key, job, now)
            deadline = min(attempt.notice_deadline or float("inf"), self.stopping.get(key, float("inf")))
            if key in self.killed or deadline == float("inf"):
                continue
            if deadline <= now:
                self.killed.add(key)
                self.executor.kill(*key)
            else:
                self.deadlines.append(deadline)

    def stop(self, key: Key, job: JobRow, now: float) -> None:
        """A cancelled job's attempt: notice with its class's grace, once; killed at once
        instead, or as soon as a kill is asked for during the grace (`cancel --now`)."""
        if key in self.stopping:
            if job.kill_requested_at is not None:
                self.stopping[key] = min(self.stopping[key], now)
            return
        grace = 0.0 if job.kill_requested_at is not None else self.config.priority_class(job.priority).grace_period
        self.stopping[key] = now + grace
        self.executor.notify(*key, now + grace)

    def carry_out(self, plan: Plan, tokens: Mapping[str, str], now: float) -> None:
        """Act on a recorded plan. One launch or notice that fails harms no other. A launch
        that fails for the scheduler's reasons (an OSError: a full disk, no process to fork) is
        tried again after a back-off, not charged to the job; one that fails for the job's (no
        such OS user, a log path into the data) ends its attempt as a failure, exit code 127."""
        noticed = [(p.victim, p.deadline) for p in plan.preemptions] + [(g.job, g.deadline) for g in plan.grows]
        jobs = self.store.jobs_by_id([int(job) for job, _ in noticed] + [int(s.job) for s in plan.starts])
        for job_id, deadline in noticed:
            job = jobs[int(job_id)]
            try:
                self.executor.notify(job.id, job.attempts - 1, deadline)
            except Exception:
                log.exception("could not give notice to job %s; it is killed at its deadline", job.id)
        self.launch_all([(jobs[int(start.job)], start.placement) for start in plan.starts], tokens, now)

    def launch_all(self, starts: Sequence[tuple[JobRow, Placement]], tokens: Mapping[str, str], now: float) -> None:
        """Launch the newest attempt of each job of `starts`, on its placement, with its token
        (`tokens`, by job id)."""
        launched = []
        try:
            intervals = self.interruption_intervals(now) if starts else {}
        except Exception:
            log.exception("could not read the interruption intervals; jobs start without them")
            intervals = {}
        for job, placement in starts:
            try:
                launched.append(self.launch(job, placement, tokens[str(job.id)], intervals.get(job.priority)))
                if job.session is not None:
                    self.sessions.started((job.id, job.attempts - 1), SessionKind(job.session), job.priority, now)
            except OSError as exc:
                log.warning("the scheduler could not launch job %s: %s; it is tried again", job.id, exc)
                self.store.retry_launch(job.id, job.attempts - 1, now, str(exc))
            except Exception as exc:
                log.warning("job %s could not start: %s", job.id, exc)
                self.store.end_attempt(job.id, job.attempts - 1, 127, now, why=f"could not start: {exc}"[:500])
        if launched:
            self.store.mark_started(launched, now)

    def interruption_intervals(self, now: float) -> dict[str, float]:
        """Per class, the mean running time between unannounced interruptions over the last
        week (read at most once a minute), passed to jobs for their checkpoint interval."""
        if self._intervals is None or now - self._intervals[0] > 60:
            self._intervals = (now, self.store.interruption_intervals(now - 7 * 86400, now))
        return self._intervals[1]

    def launch(
        self, job: JobRow, placement: Placement, token: str, interruption_interval: float | None = None
    ) -> tuple[int, int, dict[str, object], bool, str]:
        """Start the job's newest attempt; returns what `mark_started` records of it."""
        protocol = protocol_env(self.api_url, token, interruption_interval)
        launch = prepare_launch(self.workspace, job, placement, self.user_of(job), protocol)
        started = self.executor.start(launch)
        return (job.id, launch.attempt, started.handle, started.running, started.where)

    def user_of(self, job: JobRow) -> JobUser | None:
        """The OS user the job runs as (None: the scheduler's); raises `NoSuchUser`."""
        return job_user(self.job_user, job.user, job.team)

    def next_wakeup(self, now: float) -> float:
        times = [now + self.interval, *self.deadlines]
        if self.retry_at is not None:
            times.append(self.retry_at)
        return max(now, min(times))

    def run(self, stop: threading.Event, clock: Callable[[], float] = time.time) -> None:
        self.reconcile(clock())
        recent: deque[float] = deque(maxlen=5)
        while not stop.is_set():
            began = time.perf_counter()
            try:
                changed = self.tick(clock())
            except Exception:
                log.exception("control loop tick failed; going on")
                self.snapshots.forget()
                changed = False
            ended = time.perf_counter()
            if not self.snapshots.read_whole:
                recent.append(ended - began)
            if changed:
                continue
            if self.wakeup.wait(max(0.0, self.next_wakeup(clock()) - clock())):
                # Under a stream of events that change nothing (submissions into a full pool),
                # a pause twice as long as a decision takes between two decisions leaves the
                # API two thirds of the time: as long as the quickest of the last ones (one
                # that read the whole store, or met a collection, holds back no event), less
                # the time the loop has waited already (an event after a quiet spell is
                # decided at once).
                pause = 2 * min(recent, default=0.0) - (time.perf_counter() - ended)
                time.sleep(max(self.settle, pause))
            self.wakeup.clear()
