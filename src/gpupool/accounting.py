"""What each interruption cost, in GPU-seconds, from what attempts recorded. Pure: the live
service and the simulator both hand it attempt records and read the same numbers back.

For an attempt holding G GPUs from allocation to release:

    allocated   G × (release − allocation)
    startup     G × (first productive step − allocation); restore is the part the job reported,
                and `phases` breaks it down where the job reported its start-up's phases
                (launch: allocation to the process's start; then the job's own, such as
                imports, model build, restore, data position; other: what they leave)
    checkpoint  G × the time saves blocked training (of a background save, its staging only)
    drain       G × (release − notice), from the first productive step if the notice came before
    wasted      G × (stop − the point the next attempt resumed from): work done again
    productive  allocated − startup − checkpoint − drain − wasted
    unreported  for a job that never reports (it does not use `gpupool.job` or the job
                protocol): all of the attempt, G × (release − allocation), instead of the
                buckets above. gpupool cannot tell its progress from its startup or lost work,
                so that time is neither productive nor wasted: it is left out of goodput, and
                only its drain (notice to release) is charged when it is interrupted.

"Stop" is the notice (work after it is drain) or, without one, the release. "The point the next
attempt resumed from" is where training went on past the checkpoint the next attempt restored:
its commit, for a save in line; the end of its staging, for a save written in the background
(the job reports how long the write took after it). If that checkpoint is older than this
attempt, all of its productive work was wasted. The time background writes overlapped training
is shown apart (`background`): it is in the buckets above already, productive or wasted.
A job that does not say which checkpoint it restored is taken to resume from its newest one.

An interruption (an attempt ended by a preemption, a failure that was retried, or a process lost
while the scheduler was down) costs G × (wasted + drain) + G × the next attempt's startup. The
wait in line in between costs the job's owner time, not GPU time: it is reported apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpupool.settle import AttemptOutcome, Usage

SUMMED_PHASES = ("launch", "set-up", "imports", "model build", "restore", "data position", "other")
"""Restart phases that totals keep by name (a job's own marks are its own business)."""
INTERRUPTED = (
    AttemptOutcome.PREEMPTED,
    AttemptOutcome.FAILED,
    AttemptOutcome.OUT_OF_MEMORY,
    AttemptOutcome.LOST,
    AttemptOutcome.NODE_LOST,
    AttemptOutcome.RESIZED,
)


@dataclass(frozen=True)
class Commit:
    time: float
    step: int | None = None
    seconds: float = 0.0
    """How long the save blocked training."""
    background: float = 0.0
    """How long it was written, after the blocking part, while training went on."""

    @property
    def resumed_at(self) -> float:
        """When training went on past the state this checkpoint holds."""
        return self.time - self.background


@dataclass(frozen=True)
class AttemptRecord:
    attempt: int
    gpus: int
    allocated_at: float
    released_at: float | None = None
    """None while it runs: accounted up to `now`."""
    productive_at: float | None = None
    notice_at: float | None = None
    restored_step: int | None = None
    """The checkpoint step it resumed from, as the job reported it."""
    restore_seconds: float = 0.0
    commits: tuple[Commit, ...] = ()
    outcome: str | None = None
    """An `AttemptOutcome` value; None while it runs."""
    reason: str = ""
    """Why it ended, for people: the preemption's message, the exit code."""
    reported: bool = True
    """Whether the job said anything of its progress (a heartbeat, a phase, a checkpoint)."""
    process_started_at: float | None = None
    """When its process started, as the job reported it."""
    phases: tuple[tuple[str, float], ...] = ()
    """Seconds of each phase of its start-up after the process's start, as the job reported them."""
    usage: Usage | None = None
    """What its cgroups counted (memory, CPU time), once it ended contained."""
    idle_seconds: float = 0.0
    """A session's: seconds it held its GPUs with no activity (`SessionPolicy.idle_counts_after`)."""


@dataclass(frozen=True)
class AttemptCost:
    """GPU-seconds of one attempt, by what they went to."""

    attempt: int
    allocated: float
    startup: float
    restore: float
    checkpoint: float
    drain: float
    wasted: float
    productive: float
    unreported: float = 0.0
    background: float = 0.0
    """GPU-seconds that background saves were written while training went on (overlap)."""
    phases: dict[str, float] = field(default_factory=dict)
    """GPU-seconds of startup by phase, in order; they add up to `startup`. Empty when the job
    did not report its phases."""


@dataclass(frozen=True)
class Interruption:
    attempt: int
    at: float
    cause: str
    reason: str
    wasted: float
    drain: float
    restart: float | None
    """GPU-seconds from the next attempt's allocation to its first productive step (so far,
    while it starts up); None while the job waits for its next attempt."""
    delay: float | None
    """Seconds in line before the next attempt (None while still waiting)."""
    restart_phases: dict[str, float] = field(default_factory=dict)
    """`restart` by phase, where the next attempt reported them."""

    @property
    def lost(self) -> float:
        return self.wasted + self.drain + (self.restart or 0.0)


@dataclass(frozen=True)
class JobAccount:
    job_id: int
    team: str
    priority: str
    attempts: tuple[AttemptCost, ...]
    interruptions: tuple[Interruption, ...]
    user: str = ""
    """Who submitted it, where the driver knows."""
    ended: bool = False
    """The job has ended: an interruption with no next attempt never will have one."""
    usage: Usage | None = None
    """What its attempts used, together (`Usage.joined`), where their cgroups counted."""
    idle: float = 0.0
    """GPU-seconds a session held with no activity (`AttemptRecord.idle_seconds`)."""

    @property
    def allocated(self) -> float:
        return sum(a.allocated for a in self.attempts)

    @property
    def productive(self) -> float:
        return sum(a.productive for a in self.attempts)

    @property
    def unreported(self) -> float:
        return sum(a.unreported for a in self.attempts)

    @property
    def goodput(self) -> float | None:
        return goodput(self.productive, self.allocated, self.unreported)


def goodput(productive: float, allocated: float, unreported: float) -> float | None:
    """Productive over allocated GPU time, of the time the jobs reported on; None without any."""
    known = allocated - unreported
    return productive / known if known > 1e-9 else None


@dataclass
class Totals:
    """Sums over jobs: GPU-seconds by bucket, interruptions and what they lost."""

    jobs: int = 0
    allocated: float = 0.0
    productive: float = 0.0
    startup: float = 0.0
    checkpoint: float = 0.0
    drain: float = 0.0
    wasted: float = 0.0
    unreported: float = 0.0
    background: float = 0.0
    interruptions: int = 0
    lost: float = 0.0
    causes: dict[str, int] = field(default_factory=dict)
    restart_phases: dict[str, float] = field(default_factory=dict)
    """GPU-seconds of restarts after interruptions, by phase, where the jobs reported them."""
    cpu_seconds: float = 0.0
    """CPU time of the attempts whose cgroups counted it."""
    peak_memory: int | None = None
    """The largest attempt's peak memory, in bytes (Slurm's MaxRSS)."""
    peak_gpu_memory: int | None = None
    """The largest attempt's peak GPU memory, in bytes, where NVML counted it."""
    idle: float = 0.0
    """GPU-seconds sessions held with no activity: capacity an idle shell or notebook kept."""

    @property
    def goodput(self) -> float | None:
        return goodput(self.productive, self.allocated, self.unreported)

    def add(self, account: JobAccount) -> None:
        self.jobs += 1
        self.idle += account.idle
        if account.usage is not None:
            self.cpu_seconds += account.usage.cpu_seconds or 0.0
            if account.usage.peak_memory is not None:
                self.peak_memory = max(self.peak_memory or 0, account.usage.peak_memory)
            if account.usage.peak_gpu_memory is not None:
                self.peak_gpu_memory = max(self.peak_gpu_memory or 0, account.usage.peak_gpu_memory)
        for a in account.attempts:
            self.allocated += a.allocated
            self.productive += a.productive
            self.startup += a.startup
            self.checkpoint += a.checkpoint
            self.drain += a.drain
            self.wasted += a.wasted
            self.unreported += a.unreported
            self.background += a.background
        for i in account.interruptions:
            self.interruptions += 1
            self.lost += i.lost
            self.causes[i.cause] = self.causes.get(i.cause, 0) + 1
            for phase, gpu_seconds in i.restart_phases.items():
                # Over many jobs (and teams), the phases gpupool.job names; a job's own are other.
                known = phase if phase in SUMMED_PHASES else "other"
                self.restart_phases[known] = self.restart_phases.get(known, 0.0) + gpu_seconds


def account(
    job_id: int,
    team: str,
    priority: str,
    attempts: Sequence[AttemptRecord],
    now: float,
    user: str = "",
    ended: bool = False,
) -> JobAccount:
    """The account of one job from its attempts in order."""
    ordered = sorted(attempts, key=lambda a: a.attempt)
    costs = []
    interruptions = []
    for index, record in enumerate(ordered):
        following = ordered[index + 1] if index + 1 < len(ordered) else None
        costs.append(_cost(record, ordered[: index + 1], following, now))
    for index, record in enumerate(ordered):
        if record.outcome not in INTERRUPTED:
            continue
        following = ordered[index + 1] if index + 1 < len(ordered) else None
        restart = None
        delay = None
        phases: dict[str, float] = {}
        if following is not None:
            restart = costs[index + 1].startup
            phases = costs[index + 1].phases
            delay = following.allocated_at - (record.released_at or following.allocated_at)
        interruptions.append(
            Interruption(
                record.attempt,
                record.notice_at if record.notice_at is not None else (record.released_at or now),
                record.outcome or "",
                record.reason,
                costs[index].wasted,
                costs[index].drain if record.reported else _drain(record, now),
                restart,
                delay,
                phases,
            )
        )
    idle = sum(record.gpus * record.idle_seconds for record in ordered)
    return JobAccount(job_id, team, priority, tuple(costs), tuple(interruptions), user, ended, used(ordered), idle)


def used(attempts: Iterable[AttemptRecord]) -> Usage | None:
    """What attempts used together: the largest peak memory, the sum of CPU time."""
    together = None
    for attempt in attempts:
        if attempt.usage is not None:
            together = attempt.usage.joined(together)
    return together


def _cost(
    record: AttemptRecord, so_far: Sequence[AttemptRecord], following: AttemptRecord | None, now: float
) -> AttemptCost:
    end = record.released_at if record.released_at is not None else now
    g = record.gpus
    if not record.reported:
        # All of it, the drain too, is time gpupool knows nothing of; the interruption still
        # charges the drain (`_drain`), which it can measure.
        held = g * (end - record.allocated_at)
        return AttemptCost(record.attempt, held, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, held)
    productive_from = min(record.productive_at, end) if record.productive_at is not None else end
    startup = productive_from - record.allocated_at
    stop = min(record.notice_at, end) if record.notice_at is not None else end
    # The buckets partition the attempt: a notice during startup drains from the first
    # productive step on, and a save made after the notice is drain, not checkpoint.
    drain = end - max(stop, productive_from)
    wasted = 0.0
    if record.outcome in INTERRUPTED and record.productive_at is not None:
        anchor = _resumed_from(record, so_far, following)
        start = productive_from if anchor is None else max(anchor, productive_from)
        wasted = max(0.0, stop - start - _blocked(record.commits, start, stop))
    # Saves block productive time: never more of it than there was (the job reports its own clock).
    checkpoint = min(_blocked(record.commits, productive_from, stop), max(0.0, stop - productive_from - wasted))
    productive = max(0.0, (end - record.allocated_at) - startup - drain - checkpoint - wasted)
    return AttemptCost(
        record.attempt,
        g * (end - record.allocated_at),
        g * startup,
        g * min(record.restore_seconds, startup),
        g * checkpoint,
        g * drain,
        g * wasted,
        g * productive,
        background=g * _overlap(record.commits, productive_from, stop),
        phases={name: g * seconds for name, seconds in _startup_phases(record, startup).items()},
    )


def _overlap(commits: Sequence[Commit], after: float, until: float) -> float:
    """Seconds background writes went on beside training, within (after, until]: the union of
    their spans, as the job reports them (two that say they went on at once count once)."""
    total, reached = 0.0, after
    for began, end in sorted((max(c.resumed_at, after), min(c.time, until)) for c in commits):
        start = max(began, reached)
        if end > start:
            total += end - start
            reached = end
    return total


def _startup_phases(record: AttemptRecord, startup: float) -> dict[str, float]:
    """Seconds of `startup` by phase, in order: launch, the job's own, other. Each is cut to what
    the startup leaves (the job's clock is not the scheduler's), so that they add up to it."""
    if record.process_started_at is None and not record.phases:
        return {}
    said = list(record.phases)
    if record.process_started_at is not None:
        said.insert(0, ("launch", record.process_started_at - record.allocated_at))
    out: dict[str, float] = {}
    left = startup
    for name, seconds in said:
        part = min(max(0.0, seconds), left)
        left -= part
        out[name] = out.get(name, 0.0) + part
    if left >= 0.001:
        out["other"] = out.get("other", 0.0) + left
    return out


def _drain(record: AttemptRecord, now: float) -> float:
    """GPU-seconds from notice to release."""
    end = record.released_at if record.released_at is not None else now
    return record.gpus * max(0.0, end - min(record.notice_at, end)) if record.notice_at is not None else 0.0


def _blocked(commits: Sequence[Commit], after: float, until: float) -> float:
    """Seconds that saves whose blocking ended in (after, until] blocked training, within that span."""
    total = sum(min(c.seconds, c.resumed_at - after) for c in commits if after < c.resumed_at <= until)
    return min(total, max(0.0, until - after))


def _resumed_from(
    record: AttemptRecord, so_far: Sequence[AttemptRecord], following: AttemptRecord | None
) -> float | None:
    """When, in `record`, training stood at the checkpoint the next attempt resumed from; None
    if that checkpoint is not one of this attempt's (all its work was wasted)."""
    if following is not None and following.restored_step is not None:
        matches = [c.resumed_at for c in record.commits if c.step == following.restored_step]
        return max(matches) if matches else None
    # Not told (or not restarted yet): the newest checkpoint, if this attempt made it.
    newest = max((c for a in so_far for c in a.commits), key=lambda c: c.time, default=None)
    if newest is not None and newest in record.commits:
        return newest.resumed_at
    return None


def totals(accounts: Iterable[JobAccount], key: Callable[[JobAccount], str]) -> dict[str, Totals]:
    """Totals grouped by `key` (a job's team, its class, or one name for the whole pool)."""
    grouped: dict[str, Totals] = defaultdict(Totals)
    for a in accounts:
        grouped[key(a)].add(a)
    return dict(sorted(grouped.items()))
