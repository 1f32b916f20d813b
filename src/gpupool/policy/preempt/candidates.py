"""Who could be given notice: running jobs as one decision's candidates, what protects them
(a class that is not preemptible, a minimum runtime, a preemption cap) and what taking them
would cost. The rules of who may take whom are `rules.py`, the search among them `search.py`."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from gpupool.model import (
    Allocation,
    Config,
    JobId,
    Placement,
    PriorityClass,
    RunningJob,
    placed_gpus,
    placement_without,
)
from gpupool.policy.free import FreeGpus
from gpupool.policy.free import Group as NodeGroup
from gpupool.policy.preempt.bounds import Bounds, Group, GroupsByNode, Rank, bounds_of, ranked, unbounded
from gpupool.policy.share import TeamShares


@dataclass(slots=True)
class Candidate:
    """A running job as the working state of one decision sees it."""

    running: RunningJob
    cls: PriorityClass
    """Its effective class (budgets may have lowered it)."""
    slots: tuple[tuple[int, tuple[int, ...]], ...]
    """(node index, GPU ids) it holds."""
    protection: Protection | None = None
    cost: float = 0.0
    """Its lost work if preempted now (`lost_work`)."""
    share: float = 0.0
    """Its team's weighted share when the candidates were built (at the decision's first
    victim search): a tie-break of `victim_order`."""
    keep: Placement = ()
    """A shrink (an elastic job's GPUs above one of its smaller sizes, `shrink_of`): what the
    job keeps, while `slots` are what it frees; () for the whole job."""
    lost: float = 0.0
    """A shrink's work lost since the job's last checkpoint (`lost_since`): its cost at any
    size is this and the restart at that size (`resized`)."""
    id: JobId = field(init=False)
    label: str = field(init=False)
    team: str = field(init=False)
    gpus: int = field(init=False)
    """GPUs its team gives up if it is taken: the job's, or a shrink's freed ones."""

    def __post_init__(self) -> None:
        self.id = self.running.job.id
        self.label = self.running.job.label
        self.team = self.running.job.team
        self.gpus = self.held if self.keep else self.running.job.gpus

    @property
    def held(self) -> int:
        """GPUs its placement holds (what its leaving frees; a driver's snapshot may disagree
        with the job's request)."""
        return sum(len(gpus) for _, gpus in self.slots)

    def gpus_on(self, node: int) -> int:
        """GPUs it holds on node `node`."""
        slots = self.slots
        if len(slots) == 1:
            return len(slots[0][1]) if slots[0][0] == node else 0
        return sum(len(gpus) for i, gpus in slots if i == node)


class ProtectionRule(Enum):
    """The rule that protects a running job from preemption."""

    NOT_PREEMPTIBLE = "not_preemptible"
    MIN_RUNTIME = "min_runtime"
    PREEMPTION_CAP = "preemption_cap"


@dataclass(frozen=True, slots=True)
class Protection:
    """Why a running job may not be preempted now: the rule, in words with its numbers, and
    when it ends (None for a protection that lasts)."""

    rule: ProtectionRule
    text: str
    until: float | None = None


def protection(running: RunningJob, cls: PriorityClass, now: float, config: Config) -> Protection | None:
    """Why this running job may not be preempted now, or None if it may."""
    if not cls.preemptible:
        return Protection(ProtectionRule.NOT_PREEMPTIBLE, f"class {cls.name} is not preemptible")
    ran = now - running.started_at
    # Compared as the time it ends, which is what `Plan.retry_at` is set to.
    if running.started_at + cls.min_runtime > now:
        text = f"inside its minimum runtime ({ran:.0f} of {cls.min_runtime:.0f} s)"
        return Protection(ProtectionRule.MIN_RUNTIME, text, running.started_at + cls.min_runtime)
    cap = running.job.max_preemptions if running.job.max_preemptions is not None else config.max_preemptions
    if cap is not None and running.job.preemptions >= cap:
        return Protection(ProtectionRule.PREEMPTION_CAP, f"at its preemption cap ({running.job.preemptions} of {cap})")
    return None


def lost_since(running: RunningJob, now: float) -> float:
    """GPU-seconds of work the job's GPUs did since its last committed checkpoint."""
    since = running.last_checkpoint_at if running.last_checkpoint_at is not None else running.started_at
    return running.job.gpus * max(0.0, now - since)


def lost_work(running: RunningJob, now: float) -> float:
    """GPU-seconds lost if the job were stopped now without notice: work since the last
    committed checkpoint plus the restart of its next attempt."""
    since = running.last_checkpoint_at if running.last_checkpoint_at is not None else running.started_at
    return running.job.gpus * (max(0.0, now - since) + running.job.expected_restart)


def shrink_cost(running: RunningJob, now: float) -> float:
    """GPU-seconds lost if the elastic job were resized now: every GPU's work since the last
    committed checkpoint, and the restart of the next attempt at its smallest size (no wait in
    line: its GPUs are held for it). A shrink keeps as many GPUs as its preemptor leaves it
    (`search._trimmed`); their restart is not charged, as their work after it repays it: so the
    search never keeps a job smaller to make its shrink look cheaper."""
    return lost_since(running, now) + running.job.smallest * running.job.expected_restart


def kept_of(placement: Placement, gpus: int, leave: Collection[str]) -> Placement:
    """The `gpus` GPUs of `placement` that an elastic job resized to `gpus` keeps: first those
    on nodes not in `leave`, then those on nodes in it, each in placement order (whole members
    of a gang: its sizes and allocations are whole members)."""
    order = sorted(range(len(placement)), key=lambda n: placement[n].node in leave)
    kept: dict[int, Allocation] = {}
    for n in order:
        if gpus <= 0:
            break
        allocation = placement[n]
        kept[n] = Allocation(allocation.node, allocation.gpus[:gpus])
        gpus -= len(kept[n].gpus)
    return tuple(kept[n] for n in sorted(kept))


def resized(c: Candidate, size: int, leave: Collection[str], node_index: Mapping[str, int]) -> Candidate:
    """The shrink of `c`'s elastic job to `size` GPUs, keeping those off the nodes in `leave`
    first (`kept_of`), at the cost of a resize (`shrink_cost`); `c` is the job or one of its
    shrinks."""
    running = c.running
    keep = kept_of(running.placement, size, leave)
    slots = tuple((node_index[a.node], a.gpus) for a in placement_without(running.placement, keep))
    cost = c.lost + running.job.smallest * running.job.expected_restart  # `shrink_cost`, op for op
    return Candidate(running, c.cls, slots, c.protection, cost, c.share, keep, c.lost)


def shrink_of(whole: Candidate, node_index: Mapping[str, int], now: float, node: str) -> Candidate | None:
    """The shrink of `whole`'s elastic job to its smallest size that frees most on `node` (it
    keeps GPUs on its other nodes first), as a candidate of its own; None for a job that cannot
    shrink or frees nothing there."""
    running = whole.running
    job = running.job
    if not job.elastic or job.gpus <= job.smallest:
        return None
    lost = replace(whole, lost=lost_since(running, now))
    shrink = resized(lost, job.smallest, (node,), node_index)
    return shrink if shrink.gpus_on(node_index[node]) else None


def fitted(shrink: Candidate, node: int, need: int, node_index: Mapping[str, int], name: str) -> Candidate:
    """`shrink` keeping the largest of its job's sizes with which it still frees `need` GPUs on
    node `node` (named `name`), or as it is when no larger size does."""
    job = shrink.running.job
    kept = placed_gpus(shrink.keep)
    for size in reversed(job.sizes):
        if kept < size < job.gpus:
            larger = resized(shrink, size, (name,), node_index)
            if larger.gpus_on(node) >= need:
                return larger
    return shrink


def victim_order(candidate: Candidate) -> tuple[int, float, bool, float, float, str]:
    """Lower class first, then cheapest lost work (at equal cost a shrink before an eviction,
    which also waits in line), then the team with the higher weighted share (equal victims are
    spread across teams by share), then most recently started; the id keeps the order total
    (an arbitrary but deterministic tie-break)."""
    return (
        candidate.cls.value,
        candidate.cost,
        not candidate.keep,
        -candidate.share,
        -candidate.running.started_at,
        candidate.id,
    )


class Crowd(Protocol):
    """Candidates every rule of a wait's explanation reads alike, but for their place in line
    (`explain.py`): of one team, class, size and protection (its rule and words), on nodes of
    the same groups. Those chosen in the decision so far are left out."""

    @property
    def sample(self) -> Candidate:
        """One of them: what they have in common."""
        ...

    @property
    def groups(self) -> frozenset[NodeGroup]:
        """The groups of the nodes they hold GPUs on."""
        ...

    def count(self) -> int:
        """How many there are."""
        ...

    def first(self, k: int) -> list[str]:
        """The `k` first, in order, as people name them (`Job.label`)."""
        ...

    def members(self) -> Iterator[Candidate]:
        """Every one of them."""
        ...


@dataclass(slots=True)
class ListedCrowd:
    """A crowd of candidates built already, in id order."""

    listed: list[Candidate]
    groups: frozenset[NodeGroup]
    chosen: set[JobId]
    ids: set[JobId] = field(init=False)

    def __post_init__(self) -> None:
        self.listed.sort(key=lambda c: c.id)
        self.ids = {c.id for c in self.listed}

    @property
    def sample(self) -> Candidate:
        return self.listed[0]

    def count(self) -> int:
        return len(self.listed) - sum(1 for j in self.chosen if j in self.ids)

    def first(self, k: int) -> list[str]:
        return [c.label for c in itertools.islice(self.members(), k)]

    def members(self) -> Iterator[Candidate]:
        return (c for c in self.listed if c.id not in self.chosen)


@dataclass(frozen=True, slots=True)
class Shortcuts:
    """The victim search's shortcuts, each of which changes no choice (a property test turns
    them off): a search gives up at once when no rule could free enough GPUs anywhere
    (`give_up`); it looks at nodes in the order of a lower bound of their score and stops at the
    first that cannot beat its best (`bounds`); searches that rank the candidates' groups in the
    same order share the arrays of their bounds (`share_bounds`)."""

    give_up: bool = True
    bounds: bool = True
    share_bounds: bool = True


ALL_SHORTCUTS = Shortcuts()


class NodeSource(Protocol):
    """Where a decision's candidates come from, built as they are first read (the running
    index's view of one decision, `running.RunningIndex.candidates`)."""

    def on(self, node: int) -> list[Candidate]: ...

    def with_min_runtime(self) -> Iterator[Candidate]: ...

    def crowds(self, chosen: set[JobId]) -> list[Crowd]: ...


@dataclass(slots=True)
class Candidates:
    """Preemption candidates of one decision, indexed by node; chosen ones are taken out."""

    free: FreeGpus
    shares: TeamShares
    source: NodeSource
    groups: GroupsByNode
    """Per node, what the bounds of a search are made of. Its rows may also count candidates
    inside their minimum runtime: a looser bound, the same choice."""
    supply: Counter[Group]
    """GPUs held by the unprotected candidates not yet chosen, per group: what lets a search see
    at once that no rule could free enough anywhere."""
    shortcuts: Shortcuts = ALL_SHORTCUTS
    on_node: list[list[Candidate] | None] = field(init=False)
    """Candidates per node index, in node order; `at` builds a node's list from `source` and
    sorts it into `victim_order` when it is first read (most nodes' never are)."""
    chosen: set[JobId] = field(default_factory=set)
    _bounds: dict[tuple[int, ...], Bounds] = field(default_factory=dict)
    _crowds: list[Crowd] | None = None

    def __post_init__(self) -> None:
        self.on_node = [None] * len(self.free.free)

    def at(self, node: int) -> list[Candidate]:
        """The candidates of node `node`, in `victim_order` (sorted when first asked for: most
        nodes' never are)."""
        here = self.on_node[node]
        if here is None:
            here = self.on_node[node] = self.source.on(node)
            here.sort(key=victim_order)
        return here

    def with_min_runtime(self, nodes: Iterable[int]) -> Iterator[Candidate]:
        """The candidates on `nodes` inside their minimum runtime (a gang on several of them
        may come more than once)."""
        wanted = set(nodes)
        for c in self.source.with_min_runtime():
            if any(i in wanted for i, _ in c.slots):
                yield c

    def crowds(self) -> list[Crowd]:
        """Every candidate, by crowd (built when a wait is first explained)."""
        if self._crowds is None:
            self._crowds = self.source.crowds(self.chosen)
        return self._crowds

    def bounds(self, ranks: Mapping[Group, Rank | None]) -> Bounds:
        """The `Bounds` of a search that ranks the groups as `ranks` does. Searches that rank
        them in the same order share their arrays (those of one class, of one team's senior
        jobs, reclaims while the teams above their guarantees keep their order): the groups
        never change within a decision."""
        counts = self.free.counts_at_start
        if not self.shortcuts.bounds:
            return unbounded(counts)
        admitted, places = ranked(self.groups, ranks)
        found = self._bounds.get(places) if self.shortcuts.share_bounds else None
        if found is None:
            found = self._bounds[places] = bounds_of(self.groups, admitted, places, counts)
        elif found.ranks != admitted:
            found = replace(found, ranks=admitted)
        return found

    def choose(self, candidate: Candidate) -> None:
        """Take `candidate` out: it has been given notice (a shrink's job too: it drains, and
        no later search takes what it keeps)."""
        if candidate.id in self.chosen:
            return
        self.chosen.add(candidate.id)
        if candidate.protection is None:
            self.supply[candidate.team, candidate.cls.value] -= placed_gpus(candidate.running.placement)

    def team_gpus_preemptible(self, team: str, below: int) -> int:
        """GPUs held by `team`'s unprotected, not yet chosen jobs of a class below `below`."""
        return sum(gpus for (of, value), gpus in self.supply.items() if of == team and value < below)
