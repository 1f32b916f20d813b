"""One decision: the working state a `decide` call builds, and the stages that change it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import partial

from gpupool.model import (
    Allocation,
    Config,
    FairShare,
    Job,
    JobId,
    Placement,
    Plan,
    Preempt,
    PriorityClass,
    QueueMode,
    Reason,
    RunningJob,
    Snapshot,
    Start,
    Wait,
)
from gpupool.policy import messages
from gpupool.policy import pending as pending_index
from gpupool.policy import victims as search
from gpupool.policy.budget import BudgetedClass, budgeted_class
from gpupool.policy.drain import Drains, draining_in, last_deadline, place_on_lent
from gpupool.policy.explain import kept_from, reading
from gpupool.policy.hopeless import Hopeless, alike_of
from gpupool.policy.memo import Memo
from gpupool.policy.order import queue_order, submit_key
from gpupool.policy.pending import Kind
from gpupool.policy.place import FreeGpus, Group, Shape, Slot, choose_slots
from gpupool.policy.preempt import Candidate, Candidates, lost_work, protection
from gpupool.policy.running import Key
from gpupool.policy.share import TeamShares
from gpupool.policy.victims import Preemptor, Victim, open_to_seniority


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
    """The working state of one `decide` call and the stages that change it: holding GPUs for
    drains, then the queue pass. Built from the snapshot; the snapshot itself is never changed."""

    snapshot: Snapshot
    config: Config
    now: float
    free: FreeGpus = field(init=False)
    pending: Mapping[JobId, Job] = field(init=False)
    """The snapshot's pending jobs by id (read only: it may be the driver's)."""
    shares: TeamShares = field(init=False)
    memo: Memo = field(init=False)
    drains: Drains = field(init=False)
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

    def __post_init__(self) -> None:
        snapshot = self.snapshot
        self.free = FreeGpus(snapshot.nodes, snapshot.running, snapshot.free)
        teams = snapshot.teams if snapshot.teams is not None else self.config.teams
        self.shares = TeamShares.of(teams, snapshot.running, snapshot.team_gpus)
        self.memo = Memo(self.free)
        kept = snapshot.pending_index
        self.pending = kept.jobs if kept is not None else {job.id: job for job in snapshot.pending}
        draining = snapshot.draining if snapshot.draining is not None else snapshot.running
        self.drains = Drains.of(draining, self.pending)
        self.depth = self.config.explain_depth if self.config.explain_waits else 0

    @property
    def candidates(self) -> Candidates:
        """The preemption candidates, built when a job first needs preemption: most decisions
        never look at victims. (Built here rather than by a callback the candidates hold: that
        would make a reference cycle, and every decision garbage the cyclic collector must find.)"""
        if self._candidates is None:
            index = self.snapshot.running_index
            if index is not None:
                self._candidates, self.expiring = index.candidates(
                    self.free, self.shares, self.key_class, self.now, self.config
                )
            else:
                self._candidates = Candidates.of(self.free, self.shares, self.build_candidates())
        return self._candidates

    def build_candidates(self) -> list[Candidate]:
        """Running jobs that are not draining."""
        index = self.free.index
        now, config = self.now, self.config
        classes: dict[str | None, PriorityClass] = {}
        shares: dict[str, float] = {}
        built = []
        for running in self.snapshot.running:
            if running.notice is not None:
                continue
            cls = classes.get(running.priority) if running.priority is not None else None
            if cls is None:
                cls = self.running_class(running)
                if running.priority is not None:
                    classes[running.priority] = cls
            placement = running.placement
            if len(placement) == 1:
                slots: tuple[tuple[int, tuple[int, ...]], ...] = ((index[placement[0].node], placement[0].gpus),)
            else:
                slots = tuple([(index[a.node], a.gpus) for a in placement])
            candidate = Candidate(running, cls, slots)
            candidate.protection = guard = protection(running, cls, now, config)
            candidate.cost = lost_work(running, now)
            team = candidate.team
            share = shares.get(team)
            candidate.share = share if share is not None else shares.setdefault(team, self.shares.share(team))
            if guard is not None and guard.until is not None:
                until = guard.until
                self.expiring[cls.value] = min(self.expiring.get(cls.value, until), until)
            built.append(candidate)
        return built

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
            found = self.budgeted[key] = budgeted_class(
                self.config, self.snapshot.usage, self.shares.team(team), priority
            )
        return found

    def class_value(self, team: str, priority: str) -> int:
        """The class value a pending job of `team` asking for `priority` is queued at."""
        return self.budgeted_as(team, priority).cls.value

    def key_class(self, key: Key) -> PriorityClass:
        """The class the running jobs of an index `key` run at (see `running_class`)."""
        team, attempt, asked, *_ = key
        return self.config.priority_class(attempt) if attempt is not None else self.budgeted_as(team, asked).cls

    def running_class(self, running: RunningJob) -> PriorityClass:
        """The class an attempt runs at was fixed when it started (budgets may have lowered it)."""
        if running.priority is not None:
            return self.config.priority_class(running.priority)
        return self.budgeted_of(running.job).cls

    # --- GPUs held for jobs whose victims drain ------------------------------------------

    def hold_for_drains(self) -> None:
        """Every job whose victims drain holds their GPUs, plus free ones, before anything
        else is placed; only then does a job whose held placement is all free GPUs start. A
        drain whose preemptor is gone (started elsewhere, cancelled) frees GPUs for anyone."""
        pending = self.pending
        draining_for = self.drains.draining_for
        waiting = [(self.budgeted_of(pending[j]).cls.value, pending[j]) for j in draining_for]
        held: list[tuple[Job, Placement, list[RunningJob]]] = []
        for job in queue_order(waiting, self.config.order, self.shares.share):
            victims = draining_for[job.id]
            placement = self.place_on_lent(job, victims)
            if placement:
                self.shares.add(job.team, job.gpus)
                self.settled.add(job.id)
                held.append((job, placement, victims))
        for job, placement, victims in held:
            if draining_in(placement, victims):
                self.hold(job, placement, [r.job.id for r in victims], last_deadline(victims))
            else:
                self.start(job, placement)
                self.drains.orphans.extend(victims)

    def place_on_lent(self, job: Job, draining: Sequence[RunningJob]) -> Placement:
        """Place `job` on free GPUs plus those `draining` jobs will free (see drain.place_on_lent)."""
        return place_on_lent(draining, self.free, self.snapshot.nodes, partial(self.fit_slots, job, lent=True))

    def hold_orphans(self, job: Job) -> bool:
        """Hold GPUs that drains for a job that no longer waits will free, if they make `job` fit."""
        placement = self.place_on_lent(job, self.drains.orphans)
        if not placement:
            return False
        claimed = draining_in(placement, self.drains.orphans)
        self.drains.orphans = [r for r in self.drains.orphans if r not in claimed]
        self.shares.add(job.team, job.gpus)
        self.settled.add(job.id)
        self.hold(job, placement, [r.job.id for r in claimed], last_deadline(claimed))
        return True

    def hold(self, job: Job, placement: Placement, victims: Sequence[JobId], deadline: float) -> None:
        """`job` holds `placement` while `victims` drain; its team counts those GPUs already."""
        message = messages.awaiting_drain(victims, deadline, self.now)
        self.waits.append(Wait(job.id, Reason.AWAITING_DRAIN, message, placement))

    # --- the queue -----------------------------------------------------------------------

    def place_queue(self) -> None:
        """Take the pending jobs in queue order and start, hold for or explain each."""
        # Free GPUs and candidates only shrink during the pass (see Memo): jobs alike (team,
        # type, size, layout, class) to one that could neither start nor preempt cannot
        # later in it, so they wait at once, for the same reason.
        index = self.snapshot.pending_index
        senior_after = self.config.seniority_after
        if index is None or len(index) < pending_index.INDEXED_FROM:
            hopeless: Hopeless[Fit] = Hopeless(senior_after, self.now)
            pending = [(self.budgeted_of(j).cls.value, j) for j in self.snapshot.pending if j.id not in self.settled]
            jobs = queue_order(pending, self.config.order, self.shares.share)
        elif self.depth is None:
            hopeless = Hopeless(senior_after, self.now)
            jobs = index.queue(self.class_value, self.config.order, self.shares.share, set(self.settled))
        else:
            # A job alike to a hopeless one only waits, and waits past the depth are not in
            # the plan: past it, the index passes such jobs in line.
            before = set(self.settled)
            hopeless = Hopeless(senior_after, self.now, index, before)
            jobs = index.queue(self.class_value, self.config.order, self.shares.share, before, self.passable(hopeless))
        for job in jobs:
            if job.id in self.settled:
                continue
            # Alike jobs come in their place in line (nominated ones first), so a senior one
            # that found no victims leaves later senior ones none either (they may take fewer).
            alike = alike_of(job, self.is_senior(job))
            fit = hopeless.get(alike)
            if fit is None:
                fit = self.place(job)
                if not fit.waits:
                    continue
                if fit in (Fit.NO_FIT, Fit.NO_VICTIMS, Fit.NEVER_FITS):
                    becomes_senior = fit is not Fit.NEVER_FITS and self.config.preemption
                    senior_at = hopeless.learn(job, alike, fit, becomes_senior=becomes_senior)
                    if senior_at is not None:
                        self.note_retry_at(senior_at)
            if fit in (Fit.NO_FIT, Fit.NO_VICTIMS):
                self.note_senior_at(job)
            self.wait(job, fit)

    def passable(self, hopeless: Hopeless[Fit]) -> Callable[[Kind], bool]:
        """Whether the queue pass may go by the jobs of a kind without trying them: alike to
        hopeless ones, once no wait is explained any more."""
        depth = self.depth

        def passable(kind: Kind) -> bool:
            return (depth is None or self.explained >= depth) and hopeless.passable(kind)

        return passable

    def place(self, job: Job) -> Fit:
        """Start `job` on free GPUs, else hold GPUs orphaned drains free, else preempt for it."""
        shapes = self.memo.shapes_of(job)
        if self.blocked and any(g in self.blocked for s in shapes for g in s.groups):
            return Fit.QUEUE_BLOCKED
        if self.start_on_free(job):
            return Fit.STARTED
        if self.drains.orphans and self.hold_orphans(job):
            return Fit.HELD
        if not self.memo.fits_ever(shapes):
            return Fit.NEVER_FITS
        fit = self.preempt_for(job, shapes)
        if fit.waits and self.config.queue is QueueMode.STRICT:
            self.blocked.update(g for s in shapes for g in s.groups)
        return fit

    def explain(self, job: Job, reason: Reason) -> str:
        """The words of a wait, with the numbers a person needs."""
        if reason is Reason.QUEUE_BLOCKED:
            return messages.queue_blocked()
        if reason is Reason.NEVER_FITS:
            return messages.never_fits(job, self.snapshot.nodes)
        budgeted = self.budgeted_of(job)
        if reason is Reason.NO_VICTIMS:
            groups = {g for shape in self.memo.shapes_of(job) for g in shape.groups}
            searches = self.searches(job, explaining=True)
            key = (*reading(job, budgeted.cls, searches, groups), self.shares.changes)
            kept = self.memo.explained.get(key)
            if kept is None:
                crowds = self.candidates.crowds()
                kept = self.memo.explained[key] = kept_from(
                    job, budgeted.cls, searches, crowds, groups, self.shares, self.now
                )
            after = self.config.seniority_after
            senior = (self.now - job.waiting_since, after) if after is not None and self.is_senior(job) else None
            text = messages.no_victims(job, budgeted.cls, kept, senior)
        else:
            first = self.memo.shapes_of(job)[0].groups
            free = self.memo.free_in.get((first, self.shares.changes))
            if free is None:
                # GPUs are taken and freed only as teams' GPUs change.
                free = self.memo.free_in[first, self.shares.changes] = self.free.total(first)
            text = messages.no_fit(job, free)
        return f"{text}; {budgeted.note}" if budgeted.note else text

    def fit_slots(self, job: Job, *, lent: bool = False) -> list[Slot] | None:
        """Slots on the first shape that fits; a shape that did not fit on free GPUs is
        remembered (see Memo), unless GPUs were lent for the try."""
        for shape in self.memo.shapes_of(job):
            if not lent and shape in self.memo.no_fit:
                continue
            slots = choose_slots(shape, self.free, self.config.placement)
            if slots is not None:
                return slots
            if not lent:
                self.memo.no_fit.add(shape)
        return None

    def start_on_free(self, job: Job) -> bool:
        """Start `job` on free GPUs, by the placement rule; False if no shape fits."""
        slots = self.fit_slots(job)
        if slots is None:
            return False
        self.shares.add(job.team, job.gpus)
        self.start(job, self.free.allocate(slots))
        return True

    def start(self, job: Job, placement: Placement) -> None:
        """Record the start of `job` on `placement` (taken already, and counted for its team)."""
        budgeted = self.budgeted_of(job)
        self.settled.add(job.id)
        reason = Reason.BUDGET_EXCEEDED if budgeted.demoted_from else Reason.FREE_GPUS
        self.starts.append(
            Start(job.id, placement, budgeted.cls.name, reason, messages.started(job, placement, budgeted))
        )

    # --- preemption ----------------------------------------------------------------------

    def preempt_for(self, job: Job, shapes: tuple[Shape, ...]) -> Fit:
        """Give notice to the cheapest sufficient victims; if there are none, say why not.

        The searches, in order, stop at the first that finds a set: reclaim (with priority and
        fair share), which takes a whole job across a victim team's guarantee only where no
        node can be freed without it (a guarantee is a promise: a job larger than a team's
        surplus must not keep a team below its own out forever); then priority and fair-share
        preemption alone, when reclaim found a set that would take the claimant's team over its
        own guarantee.
        """
        searches = self.searches(job)
        if not searches:
            return Fit.NO_FIT
        nothing_for_reclaim = False
        for who in searches:
            if nothing_for_reclaim and not who.reclaim:
                # Reclaim may take every victim priority and fair share may: if it found no
                # set at all (not merely one that broke the claimant's guarantee), neither will they.
                continue
            found_none = True
            for shape in shapes:
                key = (shape, *who.memo_key())
                if key in self.memo.no_victims:
                    found_none = False
                    continue
                found = search.find_victims(who, shape, self.candidates)
                if found is None or not self.within_guarantee(job, who, found[1]):
                    found_none = found_none and found is None
                    self.memo.no_victims.add(key)
                    continue
                slots, victims = found
                self.give_notice(job, slots, victims)
                return Fit.HELD
            nothing_for_reclaim = nothing_for_reclaim or (who.reclaim and found_none)
        self.note_retry(searches[0], shapes)
        return Fit.NO_VICTIMS

    def searches(self, job: Job, *, explaining: bool = False) -> list[Preemptor]:
        """The victim searches `job` may make, in the order to try them (none: it may not
        preempt). Fair share is left out when no team could give to it, unless `explaining`."""
        config = self.config
        if not config.preemption:
            return []
        cls = self.budgeted_of(job).cls
        final_share = self.shares.share(job.team, job.gpus)
        fair = config.fair_share is FairShare.PREEMPT and (explaining or self.shares.above(final_share, job.team))
        senior = self.is_senior(job)
        plain = Preemptor(
            job.id,
            job.team,
            cls,
            job.gpus,
            config.priority_preemption,
            fair_share=fair,
            final_share=final_share,
            place=submit_key(job) if config.seniority_after is not None else None,
            senior=senior,
        )
        searches = [plain] if cls.may_preempt or fair or senior else []
        if config.reclaim and self.shares.gpus[job.team] < self.shares.guarantee(job.team):
            over = self.shares.gpus[job.team] + job.gpus - self.shares.guarantee(job.team)
            own = self.candidates.team_gpus_preemptible(job.team, cls.value) if over > 0 and cls.may_preempt else 0
            if over <= own:
                # One search, across guarantees where it must: a node freed without taking a
                # team below its guarantee always scores better than one that needs it.
                searches = [replace(plain, reclaim=True, own_first=over > 0, cross=True), *searches]
        return searches

    def is_senior(self, job: Job) -> bool:
        """Whether `job` has waited `Config.seniority_after` (see `Preemptor.senior`); a 1-GPU
        job never is, as no job is smaller."""
        after = self.config.seniority_after
        return after is not None and job.gpus > 1 and job.waiting_since + after <= self.now

    def note_senior_at(self, job: Job) -> None:
        """Decide again when a waiting job becomes senior: nothing else may happen by then."""
        after = self.config.seniority_after
        if after is not None and job.gpus > 1 and self.config.preemption and job.waiting_since + after > self.now:
            self.note_retry_at(job.waiting_since + after)

    def within_guarantee(self, job: Job, who: Preemptor, victims: Sequence[Victim]) -> bool:
        """Reclaim only while the claimant's team stays within its guarantee once its own
        victims in the set have left."""
        if not any(v.reason is Reason.RECLAIM for v in victims):
            return True
        own = sum(v.candidate.gpus for v in victims if v.candidate.team == job.team)
        return self.shares.gpus[job.team] - own + job.gpus <= self.shares.guarantee(job.team)

    def give_notice(self, job: Job, slots: list[Slot], victims: list[Victim]) -> None:
        """Give notice to `victims` and hold their GPUs (and free ones of `slots`) for `job`."""
        placement = []
        for i, want in slots:
            mine = list(self.free.free[i][:want])
            if mine:
                self.free.take(i, mine)
            for victim in victims:
                for node, gpus in victim.candidate.slots:
                    if node == i and len(mine) < want:
                        mine.extend(gpus[: want - len(mine)])
            placement.append((i, tuple(sorted(mine))))
        deadlines = []
        for victim in victims:
            candidate = victim.candidate
            self.candidates.choose(candidate)
            self.shares.remove(candidate.team, candidate.gpus)
            # The grace is what the job needs to save, so its own class's, whatever its budget.
            deadline = self.now + self.config.priority_class(candidate.running.job.priority).grace_period
            deadlines.append(deadline)
            self.preemptions.append(
                Preempt(
                    candidate.id,
                    job.id,
                    deadline,
                    victim.reason,
                    messages.preempted(candidate, job, self.budgeted_of(job), victim.reason, self.now),
                )
            )
        held = tuple(Allocation(self.snapshot.nodes[i].name, gpus) for i, gpus in placement)
        self.shares.add(job.team, job.gpus)
        self.settled.add(job.id)
        self.hold(job, held, [v.candidate.id for v in victims], max(deadlines))

    def note_retry(self, who: Preemptor, shapes: tuple[Shape, ...]) -> None:
        """When the first minimum runtime that kept a victim from `who` ends."""
        limit = who.cls.value
        by_team = who.by_team_rule
        ends = [until for value, until in self.expiring.items() if value < limit or (by_team and value == limit)]
        if who.senior:
            ends += [
                until
                for c in self.candidates.with_min_runtime(self.memo.nodes_of(shapes))
                if c.protection is not None
                and (until := c.protection.until) is not None
                and open_to_seniority(c, who, self.shares)
            ]
        if ends:
            self.note_retry_at(min(ends))

    def note_retry_at(self, at: float) -> None:
        if self.retry_at is None or at < self.retry_at:
            self.retry_at = at

    def wait(self, job: Job, fit: Fit) -> None:
        """Record why the job waits; the words are only written when waits are explained, for
        the first `Config.explain_depth` jobs in line that wait."""
        self.settled.add(job.id)
        if self.depth is None or self.explained < self.depth:
            self.explained += 1
            self.waits.append(Wait(job.id, fit.reason, self.explain(job, fit.reason)))

    def plan(self) -> Plan:
        """The decision made."""
        return Plan(tuple(self.starts), tuple(self.preemptions), tuple(self.waits), self.retry_at)
