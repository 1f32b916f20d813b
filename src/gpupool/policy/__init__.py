"""The pure scheduling core: `decide(snapshot, config, now) -> Plan`.

No clock, no I/O, no randomness: the same snapshot, config and time give the same plan.
The stages are plain modules: `order` (queue order), `place` (where), `preempt` (whom),
`budget` (priority budgets); this module wires them into one decision.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from gpupool.model import (
    Allocation,
    Config,
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
    Team,
    Wait,
)
from gpupool.policy import messages
from gpupool.policy.budget import Effective, effective_class
from gpupool.policy.order import queue_order
from gpupool.policy.place import FreeGpus, Group, Shape, can_ever_fit, choose_slots, fits_empty, job_shapes
from gpupool.policy.preempt import (
    Candidate,
    Candidates,
    Preemptor,
    Victim,
    find_victims,
    lost_work,
    protection,
    victim_order,
)

__all__ = ["can_ever_fit", "decide"]


def decide(snapshot: Snapshot, config: Config, now: float) -> Plan:
    """Decide which pending jobs start where and which running jobs get notice.

    1. Build a private working state (free GPUs, GPUs per team) from the snapshot.
    2. Jobs whose victims are draining hold the GPUs being freed for them; jobs whose victims
       have left (nominated) come first in their class.
    3. Take the queue in order; place each job on free GPUs, else preempt for it when the
       policy allows and a sufficient set of victims exists, else say why it waits.
    """
    cycle = _Cycle(snapshot, config, now)
    cycle.hold_for_drains()
    cycle.place_queue()
    return cycle.plan()


@dataclass(slots=True)
class _Cycle:
    snapshot: Snapshot
    config: Config
    now: float
    free: FreeGpus = field(init=False)
    teams: Mapping[str, Team] = field(init=False)
    candidates: Candidates = field(init=False)
    expiring: dict[int, float] = field(default_factory=dict)
    """Per class value, the earliest end of a minimum-runtime protection."""
    draining_for: dict[JobId, list[RunningJob]] = field(init=False)
    effective: dict[tuple[str, str], Effective] = field(init=False)
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    settled: set[JobId] = field(default_factory=set)
    retry_at: float | None = None
    blocked: set[Group] = field(default_factory=set)
    no_fit: set[Shape] = field(default_factory=set)
    no_victims: set[tuple[Shape, int, str | None]] = field(default_factory=set)
    shapes: dict[tuple[str, str | None, int, int | None], tuple[Shape, ...]] = field(default_factory=dict)
    nodes_of: dict[tuple[Group, ...], list[int]] = field(default_factory=dict)
    ever_fits: dict[tuple[Shape, ...], bool] = field(default_factory=dict)
    orphans: list[RunningJob] = field(default_factory=list)
    """Victims draining for a job that no longer waits: their GPUs will be free for anyone."""

    def __post_init__(self) -> None:
        snapshot = self.snapshot
        self.free = FreeGpus(snapshot.nodes, snapshot.running, snapshot.free)
        self.teams = snapshot.teams if snapshot.teams is not None else self.config.teams
        self.effective = {}
        self.draining_for = defaultdict(list)
        alloc: Counter[str] = Counter()
        for running in snapshot.running:
            if running.notice is not None:
                self.draining_for[running.notice.for_job].append(running)
            else:
                alloc[running.job.team] += running.job.gpus
        guarantee = {name: team.guaranteed_gpus for name, team in self.teams.items()}
        self.candidates = Candidates(self.free, alloc, guarantee, self.build_candidates)

    def build_candidates(self) -> list[list[Candidate]]:
        """Running jobs that are not draining, by node, in victim order. Built only when a
        job first needs preemption: most decisions never look at victims."""
        on_node: list[list[Candidate]] = [[] for _ in self.snapshot.nodes]
        for running in self.snapshot.running:
            if running.notice is not None:
                continue
            cls = self.running_class(running)
            slots = tuple((self.free.node_index(a.node), a.gpus) for a in running.placement)
            candidate = Candidate(running, cls, slots)
            candidate.protection = protection(running, cls, self.now, self.config)
            candidate.cost = lost_work(running, self.now)
            until = candidate.protection.until if candidate.protection is not None else None
            if until is not None:
                self.expiring[cls.value] = min(self.expiring.get(cls.value, until), until)
            for i in {i for i, _ in slots}:
                on_node[i].append(candidate)
        for here in on_node:
            here.sort(key=victim_order)
        return on_node

    # --- lookups -------------------------------------------------------------------------

    def team(self, name: str) -> Team:
        return self.teams.get(name) or Team(name)

    def effective_of(self, job: Job) -> Effective:
        key = (job.team, job.priority)
        if key not in self.effective:
            self.effective[key] = effective_class(self.config, self.snapshot.usage, self.team(job.team), job.priority)
        return self.effective[key]

    def running_class(self, running: RunningJob) -> PriorityClass:
        """The class an attempt runs at was fixed when it started (budgets may have lowered it)."""
        if running.priority is not None:
            return self.config.priority_class(running.priority)
        return self.effective_of(running.job).cls

    def shapes_of(self, job: Job) -> tuple[Shape, ...]:
        key = (job.team, job.gpu_type, job.gpus, job.gpus_per_node)
        if key not in self.shapes:
            self.shapes[key] = job_shapes(job, self.free)
        return self.shapes[key]

    def nodes_in(self, groups: tuple[Group, ...]) -> list[int]:
        if groups not in self.nodes_of:
            self.nodes_of[groups] = [i for i, g in enumerate(self.free.group) if g in groups]
        return self.nodes_of[groups]

    # --- 2. GPUs held for jobs whose victims drain ------------------------------------------

    def hold_for_drains(self) -> None:
        """Every job whose victims drain holds their GPUs, plus free ones, before anything
        else is placed; only then does a job whose held placement is all free GPUs start. A
        drain whose preemptor is gone (started elsewhere, cancelled) frees GPUs for anyone."""
        pending = {job.id: job for job in self.snapshot.pending}
        self.orphans = sorted(
            (r for job_id, rs in self.draining_for.items() if job_id not in pending for r in rs), key=lambda r: r.job.id
        )
        waiting = [pending[j] for j in self.draining_for if j in pending]
        held: list[tuple[Job, Placement, list[RunningJob]]] = []
        for job in queue_order([(self.effective_of(j).cls.value, j) for j in waiting], self.config.order, self.share):
            victims = sorted(self.draining_for[job.id], key=lambda r: r.job.id)
            placement = self.place_with(job, victims)
            if placement:
                self.candidates.alloc[job.team] += job.gpus
                self.settled.add(job.id)
                held.append((job, placement, victims))
        for job, placement, victims in held:
            draining = {(a.node, g) for r in victims for a in r.placement for g in a.gpus}
            if any((a.node, g) in draining for a in placement for g in a.gpus):
                deadline = max(r.notice.deadline for r in victims if r.notice is not None)
                self.hold(job, placement, [r.job.id for r in victims], deadline)
            else:
                self.start(job, placement)
                self.orphans.extend(victims)

    def place_with(self, job: Job, lenders: Sequence[RunningJob]) -> Placement:
        """Place `job` on free GPUs plus those `lenders` hold (they are draining); the GPUs of
        the placement are taken, the lenders' other GPUs stay theirs. Empty if it does not fit."""
        lent = [(self.free.node_index(a.node), a.gpus) for r in lenders for a in r.placement]
        for i, gpus in lent:
            self.free.give(i, gpus)
        slots = self.best_fit_slots(job, lent=True) or []
        own = {i: [g for j, gpus in lent if j == i for g in gpus] for i, _ in slots}
        placement: Placement = ()
        for i, want in slots:
            # The lenders' GPUs first: free ones may be what another held placement counts on.
            free = sorted(self.free.free[i], key=lambda g: (g not in own[i], g))[:want]
            self.free.take(i, free)
            placement += (Allocation(self.snapshot.nodes[i].name, tuple(sorted(free))),)
        for i, gpus in lent:
            still_lent = [g for g in gpus if g in self.free.free[i]]
            if still_lent:
                self.free.take(i, still_lent)
        return placement

    def hold(self, job: Job, placement: Placement, victims: Sequence[JobId], deadline: float) -> None:
        """`job` holds `placement` while `victims` drain; its team counts those GPUs already."""
        message = messages.awaiting_drain(victims, deadline, self.now)
        self.waits.append(Wait(job.id, Reason.AWAITING_DRAIN, message, placement))

    # --- 3. the queue --------------------------------------------------------------------

    def share(self, team: str) -> float:
        return self.candidates.alloc[team] / max(self.team(team).weight, 1e-9)

    def place_queue(self) -> None:
        pending = [(self.effective_of(j).cls.value, j) for j in self.snapshot.pending if j.id not in self.settled]
        # Free GPUs and candidates only shrink during a cycle: a kind of job that could neither
        # start nor preempt cannot later in the same cycle, so the rest of its kind wait at once.
        stuck: dict[tuple[str, str | None, int, int | None, str], Reason] = {}
        for job in queue_order(pending, self.config.order, self.share):
            if job.id in self.settled:
                continue
            kind = (job.team, job.gpu_type, job.gpus, job.gpus_per_node, job.priority)
            reason = stuck.get(kind)
            if reason is not None:
                self.wait(job, reason, partial(self.explain, job, reason))
                continue
            shapes = self.shapes_of(job)
            if self.blocked and any(g in self.blocked for s in shapes for g in s.groups):
                self.wait(job, Reason.QUEUE_BLOCKED, messages.queue_blocked)
                continue
            if self.start_on_free(job) or (self.orphans and self.hold_orphans(job)):
                continue
            if not self.fits_ever(shapes):
                reason = Reason.NEVER_FITS
            else:
                reason = self.preempt_for(job, shapes)
                if reason is None:
                    continue  # its victims drain; the GPUs are held for it
                if self.config.queue is QueueMode.STRICT:
                    self.blocked.update(g for s in shapes for g in s.groups)
            stuck[kind] = reason
            self.wait(job, reason, partial(self.explain, job, reason))

    def explain(self, job: Job, reason: Reason) -> str:
        if reason is Reason.NEVER_FITS:
            return messages.never_fits(job, [n for n in self.snapshot.nodes if n.team in (None, job.team)])
        eff = self.effective_of(job)
        if reason is Reason.NO_VICTIMS:
            text = messages.no_victims(job, eff.cls, self.protected_below(job, eff.cls), self.now)
        else:
            text = messages.no_fit(job, self.free, self.shapes_of(job)[0].groups)
        return f"{text}; {eff.note}" if eff.note else text

    def protected_below(self, job: Job, cls: PriorityClass) -> list[Candidate]:
        """Running jobs on the nodes `job` may use that its class could preempt but a rule
        protects: what a person needs to know of why nobody is given notice."""
        nodes = {i for shape in self.shapes_of(job) for i in self.nodes_in(shape.groups)}
        seen: dict[JobId, Candidate] = {}
        for i in sorted(nodes):
            for candidate in self.candidates.on_node[i]:
                if candidate.protection is not None and candidate.cls.value < cls.value:
                    seen.setdefault(candidate.id, candidate)
        return list(seen.values())

    def fits_ever(self, shapes: tuple[Shape, ...]) -> bool:
        if shapes not in self.ever_fits:
            self.ever_fits[shapes] = any(fits_empty(s, self.snapshot.nodes) for s in shapes)
        return self.ever_fits[shapes]

    def best_fit_slots(self, job: Job, *, lent: bool = False) -> list[tuple[int, int]] | None:
        """Slots on the first shape that fits. Free GPUs only shrink during a cycle, so a
        shape that did not fit never will: remember it, unless GPUs were lent for the try."""
        for shape in self.shapes_of(job):
            if not lent and shape in self.no_fit:
                continue
            slots = choose_slots(shape, self.free)
            if slots is not None:
                return slots
            if not lent:
                self.no_fit.add(shape)
        return None

    def start_on_free(self, job: Job) -> bool:
        slots = self.best_fit_slots(job)
        if slots is None:
            return False
        self.candidates.alloc[job.team] += job.gpus
        self.start(job, self.free.allocate(slots))
        return True

    def start(self, job: Job, placement: Placement) -> None:
        """Record the start of `job` on `placement` (taken already, and counted for its team)."""
        eff = self.effective_of(job)
        self.settled.add(job.id)
        reason = Reason.BUDGET_EXCEEDED if eff.demoted_from else Reason.FREE_GPUS
        self.starts.append(Start(job.id, placement, eff.cls.name, reason, messages.started(job, placement, eff)))

    def hold_orphans(self, job: Job) -> bool:
        """Hold GPUs that drains for a job that no longer waits will free, if they make `job` fit."""
        placement = self.place_with(job, self.orphans)
        if not placement:
            return False
        used = {(a.node, g) for a in placement for g in a.gpus}
        claimed = [r for r in self.orphans if any((a.node, g) in used for a in r.placement for g in a.gpus)]
        self.orphans = [r for r in self.orphans if r not in claimed]
        self.candidates.alloc[job.team] += job.gpus
        self.settled.add(job.id)
        deadline = max(r.notice.deadline for r in claimed if r.notice is not None)
        self.hold(job, placement, [r.job.id for r in claimed], deadline)
        return True

    def preempt_for(self, job: Job, shapes: tuple[Shape, ...]) -> Reason | None:
        """Give notice to the cheapest sufficient victims; if there are none, say why not."""
        eff = self.effective_of(job)
        guarantee = self.team(job.team).guaranteed_gpus
        may_reclaim = self.config.reclaim and self.candidates.alloc[job.team] + job.gpus <= guarantee
        if not self.config.preemption or not (eff.cls.may_preempt or may_reclaim):
            return Reason.NO_FIT
        who = Preemptor(job.id, job.team, eff.cls, may_reclaim)
        for shape in shapes:
            key = (shape, eff.cls.value, job.team if may_reclaim else None)
            if key in self.no_victims:
                continue
            found = find_victims(who, shape, self.candidates, self.nodes_in(shape.groups))
            if found is None:
                self.no_victims.add(key)
                continue
            slots, victims = found
            self.give_notice(job, eff.cls, slots, victims)
            return None
        self.note_retry(eff.cls, may_reclaim)
        return Reason.NO_VICTIMS

    def give_notice(self, job: Job, cls: PriorityClass, slots: list[tuple[int, int]], victims: list[Victim]) -> None:
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
            self.candidates.chosen.add(candidate.id)
            self.candidates.alloc[candidate.team] -= candidate.gpus
            # The grace is what the job needs to save, so its own class's, whatever its budget.
            deadline = self.now + self.config.priority_class(candidate.running.job.priority).grace_period
            deadlines.append(deadline)
            self.preemptions.append(
                Preempt(
                    candidate.id,
                    job.id,
                    deadline,
                    victim.reason,
                    messages.preempted(candidate, job, self.effective_of(job), victim.reason, self.now),
                )
            )
        held = tuple(Allocation(self.snapshot.nodes[i].name, gpus) for i, gpus in placement)
        self.candidates.alloc[job.team] += job.gpus
        self.settled.add(job.id)
        self.hold(job, held, [v.candidate.id for v in victims], max(deadlines))

    def note_retry(self, cls: PriorityClass, may_reclaim: bool) -> None:
        ends = [
            until for value, until in self.expiring.items() if value < cls.value or (may_reclaim and value == cls.value)
        ]
        if ends and (self.retry_at is None or min(ends) < self.retry_at):
            self.retry_at = min(ends)

    def wait(self, job: Job, reason: Reason, message: Callable[[], str]) -> None:
        """Record why the job waits; the words are only written when waits are explained."""
        self.settled.add(job.id)
        if self.config.explain_waits:
            self.waits.append(Wait(job.id, reason, message()))

    def plan(self) -> Plan:
        return Plan(tuple(self.starts), tuple(self.preemptions), tuple(self.waits), self.retry_at)
