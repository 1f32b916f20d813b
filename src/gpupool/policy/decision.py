"""One decision: the working state a `decide` call builds from the kept state, what it has
decided so far, and the lookups its stages share. The stages are `drain` and `queue` (and,
within the queue pass, `preempt.notice`), then `grow`; the kept state itself is never changed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum

from gpupool.model import Config, Grow, Job, JobId, Placement, Plan, Preempt, PriorityClass, Reason, Start, Wait
from gpupool.policy import messages
from gpupool.policy.budget import BudgetedClass, budgeted_class
from gpupool.policy.free import FreeGpus, Group
from gpupool.policy.memo import Memo
from gpupool.policy.preempt.candidates import ALL_SHORTCUTS, Candidates, Shortcuts
from gpupool.policy.running import Key
from gpupool.policy.share import TeamShares
from gpupool.policy.state import PoolState


class Fit(Enum):
    """What became of one pending job in the queue pass."""

    STARTED = "started"
    HELD = "held"
    """It holds GPUs that draining victims free (given notice now or before)."""
    NO_FIT = "no_fit"
    NO_VICTIMS = "no_victims"
    NEVER_FITS = "never_fits"
    QUEUE_BLOCKED = "queue_blocked"

    @property
    def waits(self) -> bool:
        """Whether the job waits (it neither started nor holds GPUs)."""
        return self not in (Fit.STARTED, Fit.HELD)

    @property
    def reason(self) -> Reason:
        """The reason of its `Start` or `Wait`."""
        return _REASONS[self]


_REASONS = {fit: Reason(fit.value) for fit in Fit if fit.waits} | {
    Fit.STARTED: Reason.FREE_GPUS,
    Fit.HELD: Reason.AWAITING_DRAIN,
}


@dataclass(slots=True)
class Decision:
    """The working state of one `decide` call and what it has decided so far: free GPUs and
    GPUs per team as the decision changes them, the preemption candidates (built when a job
    first needs them), and the starts, notices and waits of the plan."""

    state: PoolState
    config: Config
    now: float
    shortcuts: Shortcuts = ALL_SHORTCUTS
    free: FreeGpus = field(init=False)
    shares: TeamShares = field(init=False)
    memo: Memo = field(init=False)
    _candidates: Candidates | None = None
    expiring: dict[int, float] = field(default_factory=dict)
    """Per class value, the earliest end of a minimum-runtime protection."""
    budgeted: dict[tuple[str, str], BudgetedClass] = field(default_factory=dict)
    """Per (team, asked class), the class its jobs are treated as."""
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    settled: set[JobId] = field(default_factory=set)
    """Jobs this decision has started, held for or told why they wait."""
    retry_at: float | None = None
    blocked: set[Group] = field(default_factory=set)
    """Node groups a strict queue has closed behind a job that does not fit."""
    depth: int | None = field(init=False)
    """How many waits to explain (`Config.explain_depth`; 0 without `explain_waits`, None: all)."""
    explained: int = 0
    waiting_at: int | None = None
    """The highest class value of the jobs left waiting for GPUs they could use (not those
    holding GPUs that drain for them, nor those no placement could ever hold)."""
    waiting_under: set[str] = field(default_factory=set)
    """The teams under their guarantee with a job left waiting so."""
    grows: list[Grow] = field(default_factory=list)

    def __post_init__(self) -> None:
        state = self.state
        self.free = FreeGpus(state.free)
        teams = state.teams if state.teams is not None else self.config.teams
        gpus: Counter[str] = Counter()
        dict.update(gpus, state.team_gpus)  # a copy without Counter's checks of what it is given
        self.shares = TeamShares(teams, gpus)
        self.memo = Memo(self.free)
        self.depth = self.config.explain_depth if self.config.explain_waits else 0

    @property
    def candidates(self) -> Candidates:
        """The preemption candidates, built when a job first needs preemption: most decisions
        never look at victims. (Built here rather than by a callback the candidates hold: that
        would make a reference cycle, and every decision garbage the cyclic collector must find.)"""
        if self._candidates is None:
            self._candidates, self.expiring = self.state.index.candidates(
                self.free, self.shares, self.key_class, self.now, self.config, self.shortcuts
            )
        return self._candidates

    # --- lookups -------------------------------------------------------------------------

    def budgeted_of(self, job: Job) -> BudgetedClass:
        """The class `job` is treated as, its team's budget use considered."""
        found = self.budgeted.get((job.team, job.priority))
        return found if found is not None else self.budgeted_as(job.team, job.priority)

    def budgeted_as(self, team: str, priority: str) -> BudgetedClass:
        """The class a job of `team` asking for class `priority` is treated as."""
        key = (team, priority)
        found = self.budgeted.get(key)
        if found is None:
            found = self.budgeted[key] = budgeted_class(self.config, self.state.usage, self.shares.team(team), priority)
        return found

    def class_value(self, team: str, priority: str) -> int:
        """The class value a pending job of `team` asking for `priority` is queued at."""
        return self.budgeted_as(team, priority).cls.value

    def key_class(self, key: Key) -> PriorityClass:
        """The class the running jobs of an index `key` run at: fixed when each attempt started
        (budgets may have lowered it), else the job's own as its team's budget use has it."""
        team, attempt, asked, *_ = key
        return self.config.priority_class(attempt) if attempt is not None else self.budgeted_as(team, asked).cls

    def is_senior(self, job: Job) -> bool:
        """Whether `job` has waited `Config.seniority_after` (see `Preemptor.senior`); a 1-GPU
        job never is, as no job is smaller."""
        after = self.config.seniority_after
        return after is not None and job.gpus > 1 and job.waiting_since + after <= self.now

    # --- what it decides ------------------------------------------------------------------

    def start(self, job: Job, placement: Placement) -> None:
        """Record the start of `job` on `placement` (taken already, and counted for its team)."""
        budgeted = self.budgeted_of(job)
        self.settled.add(job.id)
        reason = Reason.BUDGET_EXCEEDED if budgeted.demoted_from else Reason.FREE_GPUS
        self.starts.append(
            Start(job.id, placement, budgeted.cls.name, reason, messages.started(job, placement, budgeted))
        )

    def hold(self, job: Job, placement: Placement, victims: list[str], deadline: float) -> None:
        """`job` holds `placement` while `victims` (their labels) drain (its team counts those GPUs
        already)."""
        self.settled.add(job.id)
        message = messages.awaiting_drain(victims, deadline, self.now)
        self.waits.append(Wait(job.id, Reason.AWAITING_DRAIN, message, placement))

    def note_waiting(self, job: Job) -> None:
        """`job` is left waiting for GPUs it could use: no elastic job of a lower class grows,
        nor one of another team while `job`'s is under its guarantee (`grow.py`)."""
        value = self.class_value(job.team, job.priority)
        if self.waiting_at is None or value > self.waiting_at:
            self.waiting_at = value
        if self.shares.gpus[job.team] < self.shares.guarantee(job.team):
            self.waiting_under.add(job.team)

    def note_retry_at(self, at: float) -> None:
        """Decide again at `at`, if no earlier time is noted."""
        if self.retry_at is None or at < self.retry_at:
            self.retry_at = at

    def plan(self) -> Plan:
        """The decision made."""
        return Plan(tuple(self.starts), tuple(self.preemptions), tuple(self.waits), self.retry_at, tuple(self.grows))
