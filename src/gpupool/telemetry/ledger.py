"""Counters and histograms from the store's event log and checkpoint commits, read once each.

The ledger is rebuilt from the whole log when the service starts, so its totals are the
store's, whatever restarted; after that it reads only what is new. Lost GPU time comes from
`gpupool.accounting` itself, per job, once the numbers it gives are final:

- an attempt that ended without an interruption counts when it ends;
- an interrupted attempt, and its interruption, count once the next attempt has reached its
  first productive step or ended (its restart is then known, and which checkpoint it resumed
  from, which decides the rework), or once the job has ended.

So every counter only grows, and once the store is quiet each one equals what `gpupool report`
says of the same jobs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram

from gpupool.accounting import INTERRUPTED, AttemptRecord, account
from gpupool.settle import ENDED, AttemptOutcome, JobState, Usage
from gpupool.store.attempts import LAUNCH_RETRY, RESIZED
from gpupool.store.scheduling import GROW
from gpupool.store.tail import Tail
from gpupool.store.telemetry import Committed, Happened

Labels = tuple[str, ...]

INTERRUPTION_KINDS = {
    "preempted": "preemption",
    "node_lost": "node_lost",
    "failed": "failure",
    "out_of_memory": "out_of_memory",
    "lost": "lost",
    "resized": "resize",
}
"""An attempt's outcome → the `kind` label of an interruption (`lost`: its process was lost
while the scheduler was down)."""

BUCKETS = ("wasted", "drain", "restart")
USES = ("productive", "startup", "checkpoint", "drain", "wasted", "unreported")
ENDED_STATES = frozenset(s.value for s in ENDED)

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 259200, 604800)
MEMORY_BUCKETS = tuple(float(2**power) for power in range(26, 42, 2))
"""64 MiB to 2 TiB, by fours."""
BLOCKING_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


RecordsOf = Callable[[Sequence[int]], list[tuple[int, str, str, str, list[AttemptRecord]]]]
"""Job ids → (job id, team, class, state, attempt records) of each, from the store."""


@dataclass
class Ledger:
    registry: CollectorRegistry
    counts: defaultdict[str, defaultdict[Labels, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    """Metric name (without `_total`) → labels → value."""
    counted: dict[int, int] = field(default_factory=dict)
    """Per job not done with, how many of its attempts (from the first) are counted."""
    queued_since: dict[int, tuple[float, str]] = field(default_factory=dict)
    """Per pending job, when it joined the line and whether first or requeued."""
    starting: dict[int, tuple[float, float, str]] = field(default_factory=dict)
    """Per job whose attempt is starting: when, and since when it waited (and its kind). The
    start and the wait are counted at the attempt's next event, unless that is a launch the
    scheduler retries: the attempt never ran, and the job waits on from where it stood."""
    ran: dict[int, int] = field(default_factory=dict)
    """Per job not done, how many of its attempts really started (a later one resumes)."""
    unsettled: set[int] = field(default_factory=set)
    """Jobs whose accounts may have moved since the last `settle`."""
    warming: set[int] = field(default_factory=set)
    """Jobs whose oldest uncounted attempt waits on the next attempt's first productive step."""
    events: Tail = field(default_factory=Tail)
    commits: Tail = field(default_factory=Tail)

    def __post_init__(self) -> None:
        self.queue_wait = Histogram(
            "gpupool_queue_wait_seconds",
            "Time from joining the line (submitted, or requeued) to the start of an attempt, by class and whether "
            "the job was submitted (first) or requeued after an interruption.",
            ["class", "kind"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.peak_memory = Histogram(
            "gpupool_attempt_peak_memory_bytes",
            "Each ended attempt's peak memory (its largest member's), as its cgroups counted it (Slurm's MaxRSS).",
            ["class"],
            buckets=MEMORY_BUCKETS,
            registry=self.registry,
        )
        self.peak_gpu_memory = Histogram(
            "gpupool_attempt_peak_gpu_memory_bytes",
            "Each ended attempt's peak GPU memory (its processes' together), where NVML counted it.",
            ["class"],
            buckets=MEMORY_BUCKETS,
            registry=self.registry,
        )
        self.blocking = Histogram(
            "gpupool_checkpoint_blocking_seconds",
            "How long each committed checkpoint blocked training, as the job reported it.",
            ["class"],
            buckets=BLOCKING_BUCKETS,
            registry=self.registry,
        )

    def read_events(self, happened: Sequence[Happened], now: float) -> None:
        """Count what the new events say; the jobs whose accounts may have moved are kept in
        `unsettled` until `settle` has read them (a refresh that fails midway loses none)."""
        fresh = self.events.fresh((h.id for h in happened), now)
        for h in happened:
            if h.id in fresh and h.job_id is not None and h.team is not None and h.priority is not None:
                self._read(h, h.job_id, (h.priority, h.team))

    def _read(self, h: Happened, job: int, labels: tuple[str, str]) -> None:
        launch_failed = h.kind == JobState.PENDING.value and h.reason == LAUNCH_RETRY
        if h.kind != JobState.STARTING.value and job in self.starting:
            began, since, kind = self.starting.pop(job)
            if kind == RESIZED:  # it did not wait in line: no wait to count
                if launch_failed:
                    self.queued_since[job] = (h.time, "requeued")  # its launch failed: in line from now
                else:
                    self.counts["gpupool_attempts_started"][(*labels, "resize")] += 1
                    self.ran[job] = self.ran.get(job, 0) + 1
            elif launch_failed:
                self.queued_since[job] = (since, kind)  # it never ran: it waits on from where it stood
            else:
                # The attempt started (its next event is not a launch the scheduler retries).
                self.queue_wait.labels(labels[0], kind).observe(max(0.0, began - since))
                started = "resume" if self.ran.get(job, 0) else "first"
                self.counts["gpupool_attempts_started"][(*labels, started)] += 1
                self.ran[job] = self.ran.get(job, 0) + 1
        if h.kind == "submitted":
            self.counts["gpupool_jobs_submitted"][labels] += 1
            self.queued_since[job] = (h.time, "first")
        elif h.kind == "dependency_met" and job in self.queued_since:
            since, kind = self.queued_since[job]
            self.queued_since[job] = (max(h.time, since), kind)
        elif h.kind == JobState.STARTING.value and h.reason == RESIZED:
            self.starting[job] = (h.time, h.time, RESIZED)  # a resize: it starts at once, not from the line
        elif h.kind == JobState.STARTING.value:
            since, kind = self.queued_since.pop(job, (h.time, "first"))
            self.starting[job] = (h.time, since, kind)
        elif h.kind == JobState.PREEMPTING.value and h.reason != GROW:
            self.counts["gpupool_preemptions"][(*labels, h.reason or "unknown")] += 1
        elif h.kind == JobState.PENDING.value and h.attempt is not None:
            if not launch_failed:
                self.queued_since[job] = (h.time, "requeued")
            self.unsettled.add(job)
        elif h.kind in ENDED_STATES:
            self.counts["gpupool_jobs_finished"][(*labels, h.kind)] += 1
            self.queued_since.pop(job, None)
            self.ran.pop(job, None)
            self.unsettled.add(job)
        elif h.kind in (JobState.RUNNING.value, "restored"):
            self.unsettled.add(job)

    def _count_resize(self, labels: Labels, ordered: list[AttemptRecord], index: int, productive: float) -> None:
        """The resize attempt `index` ended with (shrink or grow), and, for an attempt that
        followed a shrink, its productive GPU-seconds: the work on the GPUs it kept that an
        eviction would have left to wait in line."""
        record = ordered[index]
        before = ordered[index - 1] if index else None
        if before is not None and before.outcome == AttemptOutcome.RESIZED and before.gpus > record.gpus:
            self.counts["gpupool_shrink_kept_gpu_seconds"][labels] += productive
        if record.outcome == AttemptOutcome.RESIZED and index + 1 < len(ordered):
            grown = ordered[index + 1].gpus > record.gpus
            self.counts["gpupool_resizes"][(*labels, "grow" if grown else "shrink")] += 1

    def _count_usage(self, labels: tuple[str, str], usage: Usage) -> None:
        if usage.cpu_seconds is not None:
            self.counts["gpupool_cpu_seconds"][labels] += usage.cpu_seconds
        self.counts["gpupool_oom_kills"][labels] += usage.oom_kills
        if usage.peak_memory is not None:
            self.peak_memory.labels(labels[0]).observe(usage.peak_memory)
        if usage.peak_gpu_memory is not None:
            self.peak_gpu_memory.labels(labels[0]).observe(usage.peak_gpu_memory)

    def read_commits(self, commits: Sequence[Committed], now: float) -> None:
        fresh = self.commits.fresh((c.id for c in commits), now)
        for c in commits:
            if c.id in fresh:
                self.counts["gpupool_checkpoint_commits"][(c.priority, c.team)] += 1
                if c.seconds is not None:
                    self.blocking.labels(c.priority).observe(c.seconds)

    def settle(self, records_of: RecordsOf, now: float, batch: int = 500) -> None:
        """Count the attempts of the unsettled jobs (and of those warming up) whose cost is
        now final; a job leaves `unsettled` once read."""
        ids = sorted(self.unsettled | self.warming)
        for start in range(0, len(ids), batch):
            chunk = ids[start : start + batch]
            for job_id, team, priority, state, records in records_of(chunk):
                self._settle(job_id, team, priority, state, records, now)
            self.unsettled.difference_update(chunk)

    def _settle(
        self, job_id: int, team: str, priority: str, state: str, records: list[AttemptRecord], now: float
    ) -> None:
        ordered = sorted(records, key=lambda r: r.attempt)
        done = state in ENDED_STATES
        first = self.counted.get(job_id, 0)
        final = first
        for index in range(first, len(ordered)):
            record = ordered[index]
            if record.released_at is None:
                break
            following = ordered[index + 1] if index + 1 < len(ordered) else None
            restarted = following is not None and (following.released_at or following.productive_at) is not None
            if record.outcome in INTERRUPTED and not done and not restarted:
                break
            final = index + 1
        self.warming.discard(job_id)
        if not done and final + 1 < len(ordered) and ordered[final + 1].released_at is None:
            self.warming.add(job_id)  # the next attempt runs, still starting up
        if final > first:
            self._count(team, priority, ordered, first, final, now)
        if done and final == len(ordered):
            self.counted.pop(job_id, None)
        else:
            self.counted[job_id] = final

    def _count(
        self, team: str, priority: str, ordered: list[AttemptRecord], first: int, final: int, now: float
    ) -> None:
        # Only the attempts in [first, final) are counted: they have ended, and the restart
        # after each interrupted one is over (the next attempt was productive by `now`).
        whole = account(0, team, priority, ordered, now)
        labels = (priority, team)
        allocated = self.counts["gpupool_allocated_gpu_seconds"]
        for cost in whole.attempts[first:final]:
            uses = {
                "productive": cost.productive,
                "startup": cost.startup,
                "checkpoint": cost.checkpoint,
                "drain": cost.drain,
                "wasted": cost.wasted,
                "unreported": cost.unreported,
            }
            for use, value in uses.items():
                allocated[(*labels, use)] += value
        for index in range(first, final):
            record = ordered[index]
            self._count_resize(labels, ordered, index, whole.attempts[index].productive)
            if record.usage is not None:
                self._count_usage(labels, record.usage)
            if record.idle_seconds:
                self.counts["gpupool_idle_session_gpu_seconds"][labels] += record.gpus * record.idle_seconds
        numbers = {r.attempt for r in ordered[first:final]}
        for interruption in whole.interruptions:
            if interruption.attempt not in numbers:
                continue
            kind = INTERRUPTION_KINDS.get(interruption.cause, interruption.cause)
            self.counts["gpupool_interruptions"][(*labels, kind)] += 1
            lost = self.counts["gpupool_lost_gpu_seconds"]
            lost[(*labels, kind, "wasted")] += interruption.wasted
            lost[(*labels, kind, "drain")] += interruption.drain
            lost[(*labels, kind, "restart")] += interruption.restart or 0.0
