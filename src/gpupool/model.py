"""The vocabulary of gpupool: plain frozen dataclasses and enums, no I/O.

Times are seconds as floats on whatever clock the driver uses (virtual in the
simulator, wall in the service); the core only ever compares and subtracts them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Literal

JobId = str


def job_label(job_id: int | str, array_id: int | None, array_index: int | None) -> str:
    """How people name a job: `ARRAYID_INDEX` (Slurm's form) for a task of an array, else its id."""
    return f"{array_id}_{array_index}" if array_id is not None else str(job_id)


OnIdle = Literal["end", "requeue"]
"""What reclaims an idle session: it ends, or it is requeued."""


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority level. Higher `value` is more important."""

    name: str
    value: int
    may_preempt: bool
    preemptible: bool
    min_runtime: float = 0.0
    """Seconds an attempt runs before it can be preempted (anti-thrash)."""
    grace_period: float = 30.0
    """Seconds between notice and the hard kill."""
    time_limit: float | None = None
    """A job's time limit when it gives none (`--time`); None: no limit."""
    idle_after: float | None = None
    """A session (a shell, a notebook) with no activity for this long is warned, then
    reclaimed `SessionPolicy.idle_notice` later (`on_idle`); None: never."""
    on_idle: OnIdle = "end"
    """What reclaims an idle session: `end` (it ends, cancelled) or `requeue` (it is preempted:
    notice, then back in line, as any preempted job)."""


class SessionKind(StrEnum):
    """What makes a job a session: a person at a terminal or a browser waits on it."""

    RUN = "run"
    """`gpupool run`: a command whose output streams to the person who ran it."""
    SHELL = "shell"
    """`gpupool shell`: a terminal (PTY) over the API."""
    NOTEBOOK = "notebook"
    """`gpupool notebook`: a Jupyter server behind the API's proxy."""


@dataclass(frozen=True, slots=True)
class SessionPolicy:
    """What the scheduler does with sessions (docs/sessions.md)."""

    priority: str = "interactive"
    """The class of a session that names none."""
    detach_grace: float = 600.0
    """Seconds a shell runs on with no terminal attached before it ends."""
    idle_notice: float = 300.0
    """Seconds between an idle session's warning and its reclaim."""
    idle_counts_after: float = 300.0
    """A stretch with no activity counts as idle GPU-time, whole, once it is this long."""


@dataclass(frozen=True, slots=True)
class ElasticPolicy:
    """How elastic jobs are resized (docs/elastic.md)."""

    min_time_at_size: float = 600.0
    """Seconds an elastic job runs at one size before it may grow: each resize restarts it, so
    idle GPUs that come and go do not make it thrash. A shrink for a waiting job is not held
    back by it (a class's `min_runtime` protects a job from preemptors, shrinks included)."""


@dataclass(frozen=True, slots=True)
class PriorityBudget:
    """At most `gpu_hours` at class `priority` per rolling `window` seconds."""

    priority: str
    gpu_hours: float
    window: float


def budget_use(attempts: Iterable[tuple[float, float | None, int]], now: float, window: float) -> float:
    """GPU-seconds the attempts, given as (start, end or None while running, GPUs), spent inside
    the budget window of `window` seconds that ends at `now`: how the store and the simulator
    both meter a team's use of a class (each at the class its attempts ran at)."""
    since = now - window
    use = 0.0
    for start, end, gpus in attempts:  # added one by one, in order: the same sum on every Python
        use += gpus * max(0.0, min(end if end is not None else now, now) - max(start, since))
    return use


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    weight: float = 1.0
    guaranteed_gpus: int = 0
    budgets: tuple[PriorityBudget, ...] = ()


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpus: int
    gpu_type: str = "gpu"
    team: str | None = None
    """A node dedicated to one team (a partition); `None` is the shared pool."""


@dataclass(frozen=True, slots=True)
class Job:
    """A request for GPUs, as the core sees it."""

    id: JobId
    team: str
    priority: str
    gpus: int
    submit_time: float
    """Original submit time: a requeued job keeps it, and so its place in line."""
    gpus_per_node: int | None = None
    gpu_type: str | None = None
    preemptions: int = 0
    max_preemptions: int | None = None
    """Per-job cap on preemptions; `None` falls back to `Config.max_preemptions`."""
    expected_restart: float = 0.0
    """Seconds the next attempt needs before its first productive step."""
    order: int = 0
    """Arrival order: breaks ties between equal submit times (file order in a trace, the id
    in the service), so that `j10` never goes before `j9`."""
    nominated: bool = False
    """Jobs were given notice for it (`Plan.nominated`): the GPUs they free are its own, before
    any other pending job's of its class, until it starts (else a victim, requeued, could take
    them back)."""
    queued_at: float | None = None
    """When its present wait in line began, if not at `submit_time`: the end of its last attempt
    that ran (a requeued job) or when its dependency was met, whichever is later."""
    task: str | None = None
    """`ARRAYID_INDEX` for a task of a job array: the id people read (`label`)."""
    sizes: tuple[int, ...] = ()
    """An elastic job's sizes in GPUs, smallest first, its largest last (`elastic_sizes`);
    () for a rigid job. `gpus` is the size it asks for in line, and the one it runs at."""

    @property
    def elastic(self) -> bool:
        return len(self.sizes) > 1

    @property
    def smallest(self) -> int:
        """The fewest GPUs it runs on: its minimum if elastic, else its size."""
        return self.sizes[0] if self.sizes else self.gpus

    @property
    def largest(self) -> int:
        """The most GPUs it runs on: its maximum if elastic, else its size."""
        return self.sizes[-1] if self.sizes else self.gpus

    def at_size(self, gpus: int) -> Job:
        """The same job at `gpus`, one of its sizes (what it runs at, or asks for)."""
        return self if gpus == self.gpus else replace(self, gpus=gpus)

    @property
    def label(self) -> str:
        """The job as people name it, in every message: its task, else its id."""
        return self.task or self.id

    @property
    def waiting_since(self) -> float:
        """When its present wait began."""
        return self.submit_time if self.queued_at is None else self.queued_at


@dataclass(frozen=True, slots=True)
class Allocation:
    node: str
    gpus: tuple[int, ...]


Placement = tuple[Allocation, ...]


def placed_gpus(placement: Placement) -> int:
    """GPUs a placement holds."""
    return sum(len(allocation.gpus) for allocation in placement)


def placement_without(placement: Placement, kept: Placement) -> Placement:
    """`placement` but the GPUs of `kept` (what a resize keeps), allocations left empty dropped."""
    if not kept:
        return placement
    held = {(a.node, g) for a in kept for g in a.gpus}
    left = (Allocation(a.node, tuple(g for g in a.gpus if (a.node, g) not in held)) for a in placement)
    return tuple(a for a in left if a.gpus)


@dataclass(frozen=True, slots=True)
class Notice:
    """An in-flight preemption: the victim is draining for `for_job` until `deadline`. A shrink
    keeps some of its GPUs (`keep`): once drained, it starts again on them at once, at their size
    (an elastic job's resize); an eviction keeps none, and goes back in line. A growth is a
    notice for the job itself whose `keep` holds its GPUs and free ones it grows into."""

    for_job: JobId
    deadline: float
    keep: Placement = ()

    def frees(self, placement: Placement) -> Placement:
        """What of `placement` (the draining attempt's) this notice frees: all of it but `keep`."""
        return placement_without(placement, self.keep)

    def adds(self, placement: Placement) -> Placement:
        """What a growth adds to `placement` (the draining attempt's): GPUs it holds already,
        for its next attempt; () for any other notice."""
        return placement_without(self.keep, placement)


@dataclass(frozen=True, slots=True)
class RunningJob:
    job: Job
    placement: Placement
    started_at: float
    """Start of the current attempt."""
    last_checkpoint_at: float | None = None
    """Time of the last committed checkpoint; `None` if the attempt has committed none."""
    notice: Notice | None = None
    priority: str | None = None
    """The class the attempt runs at, fixed at its start (lower than the job's when its team
    was over budget); None is the job's own class."""

    def checkpointed(self, at: float | None) -> RunningJob:
        """The same attempt with its last checkpoint committed `at` (`dataclasses.replace`,
        at half its cost: the simulator makes one for every commit it follows)."""
        return RunningJob(self.job, self.placement, self.started_at, at, self.notice, self.priority)

    @property
    def holds(self) -> Placement:
        """The GPUs it holds: its placement, and while it grows the free ones its notice added."""
        return self.placement + self.notice.adds(self.placement) if self.notice is not None else self.placement


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The pool at one instant, as lists: what a driver that does not keep a state between
    decisions knows (a test, a one-off read of the store). `policy.PoolState.of` makes the
    state `decide` reads from it."""

    nodes: Sequence[Node]
    running: Sequence[RunningJob]
    pending: Sequence[Job]
    usage: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """GPU-seconds spent by (team, priority class) inside each budget's window."""
    teams: Mapping[str, Team] | None = None
    """Each team's policy (weight, guarantee, budgets) as the driver holds it: the store, in
    the service. None takes `Config.teams` (the simulator's fixed teams)."""


class QueueOrder(StrEnum):
    PRIORITY = "priority"
    """Class value, then the team's weighted share, then submit time."""
    FIFO = "fifo"
    """Submit time only."""


class QueueMode(StrEnum):
    BACKFILL = "backfill"
    """Any job may take GPUs that are free now, whatever waits before it."""
    STRICT = "strict"
    """A job that does not fit blocks every later job that could use the same nodes."""


class PlacementRule(StrEnum):
    """Which node a job (or each member of a gang) takes among those it fits on."""

    BEST_FIT = "best-fit"
    """The one with the fewest free GPUs: whole nodes stay whole for the gangs."""
    FIRST_FIT = "first-fit"
    """The first in node order (Tiresias' default): to reproduce published results."""


class PriorityScope(StrEnum):
    """Whose lower-class jobs a job of a preempting class may give notice to."""

    POOL = "pool"
    """Any team's."""
    TEAM = "team"
    """Its own team's only."""
    ABOVE_GUARANTEE = "above_guarantee"
    """Its own team's, and another team's while that team stays at or above its guarantee."""


class FairShare(StrEnum):
    """Whether a team with a lower weighted share may take GPUs from one with a higher share."""

    OFF = "off"
    PREEMPT = "preempt"
    """A waiting job takes jobs of its own class or lower from the team with the highest
    weighted share, while that team's share stays at or above the claimant team's after the move."""


@dataclass(frozen=True, slots=True)
class Config:
    """The policy the core applies. Built by `gpupool.config` from YAML or by the simulator."""

    classes: tuple[PriorityClass, ...]
    teams: Mapping[str, Team] = field(default_factory=dict)
    order: QueueOrder = QueueOrder.PRIORITY
    queue: QueueMode = QueueMode.BACKFILL
    preemption: bool = True
    reclaim: bool = True
    max_preemptions: int | None = 10
    max_node_losses: int = 3
    """How often a job is requeued after losing a node (one of its attempt's nodes died or
    hung) before it fails: a job that kills its nodes does not loop forever."""
    priority_preemption: PriorityScope = PriorityScope.POOL
    fair_share: FairShare = FairShare.OFF
    seniority_after: float | None = None
    """Seconds after which a waiting job may preempt smaller jobs of its class or lower that
    were submitted after it (they were backfilled past it), never taking another team below its
    guarantee: a gang is not passed for ever by the small jobs that take every GPU that frees
    (as long as other teams run smaller jobs above their guarantees). None: off."""
    placement: PlacementRule = PlacementRule.BEST_FIT
    explain_waits: bool = True
    """Emit a `Wait` for every pending job not started (drivers that never show them may skip it)."""
    explain_depth: int | None = None
    """With `explain_waits`, only the first this many jobs in line that wait get a `Wait` (the
    later ones keep the reason they were last given, as Slurm's `default_queue_depth`): what a
    decision costs then does not grow with the queue. None: every one."""
    sessions: SessionPolicy = SessionPolicy()
    elastic: ElasticPolicy = ElasticPolicy()
    _by_name: Mapping[str, PriorityClass] = field(init=False, repr=False, compare=False, default_factory=dict)

    def priority_class(self, name: str) -> PriorityClass:
        found = self._by_name.get(name)
        if found is None:
            known = ", ".join(c.name for c in self.classes)
            raise ValueError(f"unknown priority class {name!r} (known: {known})")
        return found

    def __post_init__(self) -> None:
        # The first class of each name, as a search of `classes` would find it.
        by_name: dict[str, PriorityClass] = {}
        for cls in self.classes:
            by_name.setdefault(cls.name, cls)
        object.__setattr__(self, "_by_name", by_name)

    def team(self, name: str) -> Team:
        return self.teams.get(name) or Team(name)

    def defaults(self, priority: str | None, session: str | None) -> tuple[str, float | None]:
        """The class of a submission that names none (`normal`, or the sessions' class for a
        session), and the time limit of the class it runs at, for when it gives none (an
        unknown class has none: the store refuses it)."""
        chosen = priority or (self.sessions.priority if session is not None else "normal")
        found = self._by_name.get(chosen)
        return chosen, found.time_limit if found is not None else None


DEFAULT_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("urgent", 1000, may_preempt=True, preemptible=False, min_runtime=0.0, grace_period=60.0),
    PriorityClass(
        "interactive",
        500,
        may_preempt=True,
        preemptible=False,
        min_runtime=0.0,
        grace_period=30.0,
        time_limit=8 * 3600.0,
        idle_after=3600.0,
    ),
    PriorityClass("high", 100, may_preempt=True, preemptible=True, min_runtime=600.0, grace_period=120.0),
    PriorityClass("normal", 10, may_preempt=True, preemptible=True, min_runtime=300.0, grace_period=120.0),
    PriorityClass("low", 0, may_preempt=False, preemptible=True, min_runtime=120.0, grace_period=60.0),
)


class Reason(StrEnum):
    FREE_GPUS = "free_gpus"
    PRIORITY = "priority"
    RECLAIM = "reclaim"
    FAIR_SHARE = "fair_share"
    SENIORITY = "seniority"
    BUDGET_EXCEEDED = "budget_exceeded"
    AWAITING_DRAIN = "awaiting_drain"
    NO_FIT = "no_fit"
    NO_VICTIMS = "no_victims"
    NEVER_FITS = "never_fits"
    QUEUE_BLOCKED = "queue_blocked"
    DEPENDENCY = "dependency"
    """Held by the driver, never given to the core: it waits on another job's outcome."""
    ARRAY_LIMIT = "array_limit"
    """Held by the driver: its array runs as many tasks at once as it may."""
    LAUNCH_RETRY = "launch_retry"
    """Held by the driver: its last launch failed for the scheduler's reasons; it waits a back-off."""
    HELD = "held"
    """Held by a person (`gpupool hold`): it waits until released."""
    IN_LINE = "in_line"
    """Given by the driver to a job that came in line past `Config.explain_depth`: why it waits
    is worked out once it is within the depth."""


HELD_BACK = frozenset({Reason.DEPENDENCY, Reason.ARRAY_LIMIT, Reason.LAUNCH_RETRY, Reason.HELD})
"""The reasons a driver holds a job back from the core: it is in line, not in the core's."""


@dataclass(frozen=True, slots=True)
class Start:
    job: JobId
    placement: Placement
    priority: str
    """The class the attempt runs at (one lower than asked when the team is over budget)."""
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class Preempt:
    victim: JobId
    for_job: JobId
    deadline: float
    reason: Reason
    message: str
    keep: Placement = ()
    """A shrink of an elastic victim: the GPUs it keeps and starts again on once drained (see
    `Notice.keep`); () for an eviction."""


@dataclass(frozen=True, slots=True)
class Grow:
    """An elastic job given notice to grow: once drained, it starts again at once on
    `placement`, its GPUs and free ones (`Notice.keep`), at their size."""

    job: JobId
    deadline: float
    placement: Placement
    message: str


@dataclass(frozen=True, slots=True)
class Wait:
    job: JobId
    reason: Reason
    message: str
    placement: Placement = ()
    """For `AWAITING_DRAIN`: the GPUs held for the job while its victims drain."""


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    waits: tuple[Wait, ...] = ()
    retry_at: float | None = None
    """Earliest time a protection that blocked a preemption expires, a waiting job becomes
    senior (`Config.seniority_after`), or an elastic job may grow (`ElasticPolicy`): decide
    again then."""
    grows: tuple[Grow, ...] = ()

    @property
    def nominated(self) -> tuple[JobId, ...]:
        """The jobs its notices are for. Each is nominated from its first notice: the GPUs its
        victims free are its own, before any other pending job's, however they leave (a drain,
        or finishing first), until it starts (else a victim, requeued, could take them back)."""
        return tuple(dict.fromkeys(p.for_job for p in self.preemptions))
