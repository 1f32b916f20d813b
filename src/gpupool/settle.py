"""The job state machine, and how an attempt's end decides what becomes of its job: one pure
rule for the store and the simulator, so that the service and its replay cannot drift apart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpupool.model import JobId
from gpupool.units import human_seconds


class JobState(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    PREEMPTING = "preempting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    """It reached its time limit (run time over all its attempts): ended, not requeued."""


ENDED: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})

TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTING, JobState.CANCELLED}),
    # A short job may end before the scheduler has noted that its process runs.
    JobState.STARTING: frozenset(
        {
            JobState.RUNNING,
            JobState.PREEMPTING,
            JobState.PENDING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMEOUT,
        }
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.PREEMPTING,
            JobState.PENDING,
            JobState.TIMEOUT,
        }
    ),
    # A job given notice goes back in line whatever its exit code, unless it reported that it
    # finished (success), is cancelled, or reached its time limit meanwhile.
    # A resized job (an elastic one shrunk or grown) starts its next attempt at once.
    JobState.PREEMPTING: frozenset(
        {JobState.PENDING, JobState.STARTING, JobState.SUCCEEDED, JobState.CANCELLED, JobState.TIMEOUT}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.TIMEOUT: frozenset(),
}


class InvalidTransition(ValueError):
    def __init__(self, job_id: JobId, from_state: JobState, to_state: JobState) -> None:
        super().__init__(f"job {job_id}: cannot go from {from_state} to {to_state}")
        self.job_id = job_id
        self.from_state = from_state
        self.to_state = to_state


def transition(job_id: JobId, from_state: JobState, to_state: JobState) -> JobState:
    """Return `to_state` if the state machine allows the move, else raise `InvalidTransition`."""
    if to_state not in TRANSITIONS[from_state]:
        raise InvalidTransition(job_id, from_state, to_state)
    return to_state


class AttemptOutcome(StrEnum):
    """What one attempt came to (the store's `attempts.outcome`)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    NODE_LOST = "node_lost"
    LOST = "lost"
    """Its process ended while the scheduler was down, with no status."""
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NOT_LAUNCHED = "not_launched"
    """The scheduler could not launch it (its own fault, not the job's)."""
    OUT_OF_MEMORY = "out_of_memory"
    """It failed after the kernel killed a process of it at its memory limit (Slurm's
    OUT_OF_MEMORY): a failure, with a cause of its own."""
    RESIZED = "resized"
    """It left after a resize's notice (an elastic job shrunk or grown): its next attempt runs
    at once at the new size, on GPUs held for it."""


@dataclass(frozen=True, slots=True)
class Usage:
    """What an attempt used, as its cgroups counted it (`sacct`'s MaxRSS and TotalCPU); None
    where nothing counted it (no containment, or a host that does not count it)."""

    peak_memory: int | None = None
    """Bytes: the largest of its members' peaks (per node, as Slurm's MaxRSS)."""
    cpu_seconds: float | None = None
    """Over all its members."""
    oom_kills: int = 0
    """Processes the kernel killed because a member reached its memory limit."""
    peak_gpu_memory: int | None = None
    """Bytes, where NVML counts it."""

    @classmethod
    def from_json(cls, data: object) -> Usage | None:
        """From a launcher's exit record (`cgroups.Cgroup.usage`)."""
        if not isinstance(data, dict):
            return None
        peak, cpu, oom = data.get("peak_memory"), data.get("cpu_seconds"), data.get("oom_kills")
        return cls(
            peak if isinstance(peak, int) else None,
            float(cpu) if isinstance(cpu, int | float) else None,
            oom if isinstance(oom, int) else 0,
        )

    def joined(self, other: Usage | None) -> Usage:
        """With another member of the same attempt."""
        if other is None:
            return self

        def most(a: int | None, b: int | None) -> int | None:
            return max(a, b) if a is not None and b is not None else (a if b is None else b)

        cpus = [c for c in (self.cpu_seconds, other.cpu_seconds) if c is not None]
        return Usage(
            most(self.peak_memory, other.peak_memory),
            sum(cpus) if cpus else None,
            self.oom_kills + other.oom_kills,
            most(self.peak_gpu_memory, other.peak_gpu_memory),
        )


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """What is known when an attempt's process is gone."""

    exit_code: int | None
    """None: no status (it ended while the scheduler was down)."""
    completed: bool = False
    """The job reported that it finished."""
    noticed: bool = False
    """It had been given notice."""
    requeued: bool = False
    """The notice was a person's requeue (`gpupool requeue`), for no job: not a preemption."""
    cancel_requested: bool = False
    timed_out: bool = False
    """It was stopped at its time limit."""
    node_lost: str | None = None
    """What happened to the node it lost, if it lost one."""
    why: str | None = None
    """What went wrong, for people."""
    out_of_memory: bool = False
    """The kernel killed a process of it because it reached its memory limit."""
    resized_to: int | None = None
    """The notice was a resize to this many GPUs (`model.Notice.keep`): the job runs on."""


@dataclass(frozen=True, slots=True)
class JobCounts:
    """The job's counters and limits before this attempt's end."""

    failures: int = 0
    max_failures: int = 0
    preemptions: int = 0
    node_losses: int = 0
    max_node_losses: int = 3
    run_seconds: float = 0.0
    """Run time over all its attempts, this one included."""
    time_limit: float | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    outcome: AttemptOutcome
    state: JobState
    """PENDING (back in line), STARTING (resized: its next attempt starts at once) or the
    state it ended in."""
    message: str
    failures: int
    preemptions: int
    node_losses: int


def settle(end: AttemptEnd, counts: JobCounts) -> Settlement:
    """The attempt's outcome and the job's next state.

    Cancelled if a cancel was asked for, unless the job reported completion. Timeout if it was
    stopped at its time limit. Success if the job reported completion, or exited 0 with no
    notice. One that lost a node goes back in line, charged to neither its failures nor its
    preemptions, while it has lost at most `max_node_losses` nodes; then it fails. After a
    notice the job goes back in line whatever its exit code (a preemption, not a success or a
    failure), unless the notice was a resize: it starts again at once at its new size (STARTING), not
    counted as a preemption. One whose process vanished with no status goes back in line
    without using its failure budget. Otherwise it failed (out of memory, when the kernel killed a process of it
    at its memory limit and it did not succeed): retried while its failure budget lasts. A job
    that would go back in line with no run time left under its time limit ends as TIMEOUT.
    """
    code = f"exit code {end.exit_code}" if end.exit_code is not None else "no exit code (lost)"
    if end.why:
        code = f"{code}: {end.why}"
    failures, preemptions, node_losses = counts.failures, counts.preemptions, counts.node_losses

    def done(outcome: AttemptOutcome, state: JobState, message: str) -> Settlement:
        return Settlement(outcome, state, message, failures, preemptions, node_losses)

    def requeue(outcome: AttemptOutcome, message: str, then: JobState = JobState.PENDING) -> Settlement:
        """It runs again (`then`: back in line, or at once), if run time is left."""
        if counts.time_limit is not None and counts.run_seconds >= counts.time_limit:
            left = f"{message}, but no run time is left of its {human_seconds(counts.time_limit)} limit"
            return done(outcome, JobState.TIMEOUT, left)
        return done(outcome, then, message)

    if end.cancel_requested and not end.completed:
        # Stopped because it was cancelled: a clean exit on SIGTERM is no success.
        return done(AttemptOutcome.CANCELLED, JobState.CANCELLED, f"cancelled ({code})")
    if end.timed_out and not end.completed:
        time_limit = human_seconds(counts.time_limit or 0.0)
        return done(AttemptOutcome.TIMEOUT, JobState.TIMEOUT, f"ended at its time limit of {time_limit} ({code})")
    if end.completed or (end.exit_code == 0 and not end.noticed):
        return done(AttemptOutcome.SUCCEEDED, JobState.SUCCEEDED, f"succeeded ({code})")
    if end.node_lost is not None:
        node_losses += 1
        limit = counts.max_node_losses
        if node_losses <= limit:
            return requeue(AttemptOutcome.NODE_LOST, f"requeued: {end.node_lost} (node loss {node_losses} of {limit})")
        lost = f"failed: {end.node_lost}, its node loss {node_losses} (at most {limit} are requeued)"
        return done(AttemptOutcome.NODE_LOST, JobState.FAILED, lost[:2000])
    if end.noticed and end.resized_to is not None:
        return requeue(AttemptOutcome.RESIZED, f"resized to {end.resized_to} GPUs ({code})", JobState.STARTING)
    if end.noticed and end.requeued:
        # Not counted as a preemption: a job its owner requeues must not grow toward the cap
        # that protects it from being preempted.
        return requeue(AttemptOutcome.PREEMPTED, f"requeued by a person, after notice ({code})")
    if end.noticed:
        preemptions += 1
        return requeue(AttemptOutcome.PREEMPTED, f"requeued after notice ({code})")
    if end.exit_code is None:
        return requeue(AttemptOutcome.LOST, "requeued: its process ended while the scheduler was down")
    failures += 1
    outcome, failed = AttemptOutcome.FAILED, f"failed ({code})"
    if end.out_of_memory:
        outcome, failed = AttemptOutcome.OUT_OF_MEMORY, f"failed (out of memory: killed at its memory limit, {code})"
    if failures <= counts.max_failures:
        return requeue(outcome, f"{failed}; retry {failures} of {counts.max_failures}")
    return done(outcome, JobState.FAILED, failed)
