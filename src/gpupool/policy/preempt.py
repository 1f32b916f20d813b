"""Who could be given notice: running jobs as candidates, and the rules that protect them.

The search for victims among them is `victims.py`."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from gpupool.model import Config, JobId, PriorityClass, RunningJob
from gpupool.policy.bounds import Bounds, Group, GroupsByNode, Rank, bounds_of, ranked
from gpupool.policy.place import FreeGpus
from gpupool.policy.place import Group as NodeGroup
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
    id: JobId = field(init=False)
    team: str = field(init=False)
    gpus: int = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.running.job.id
        self.team = self.running.job.team
        self.gpus = self.running.job.gpus

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


def lost_work(running: RunningJob, now: float) -> float:
    """GPU-seconds lost if the job were stopped now without notice: work since the last
    committed checkpoint plus the restart of its next attempt."""
    since = running.last_checkpoint_at if running.last_checkpoint_at is not None else running.started_at
    return running.job.gpus * (max(0.0, now - since) + running.job.expected_restart)


def victim_order(candidate: Candidate) -> tuple[int, float, float, float, str]:
    """Lower class first, then cheapest lost work, then the team with the higher weighted
    share (equal victims are spread across teams by share), then most recently started; the
    id keeps the order total (an arbitrary but deterministic tie-break)."""
    return (candidate.cls.value, candidate.cost, -candidate.share, -candidate.running.started_at, candidate.id)


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

    def first(self, k: int) -> list[JobId]:
        """The `k` first ids, in order."""
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

    def first(self, k: int) -> list[JobId]:
        return [c.id for c in itertools.islice(self.members(), k)]

    def members(self) -> Iterator[Candidate]:
        return (c for c in self.listed if c.id not in self.chosen)


def crowd_key(c: Candidate, groups: frozenset[NodeGroup]) -> tuple[object, ...]:
    """What the members of one crowd share (a minimum runtime's words are each job's own)."""
    guard = c.protection
    words = None if guard is None or guard.rule is ProtectionRule.MIN_RUNTIME else guard.text
    return (c.team, c.cls, c.gpus, guard.rule if guard is not None else None, words, groups)


class NodeSource(Protocol):
    """Where candidates built lazily come from (`running.RunningIndex`'s per-decision view)."""

    def on(self, node: int) -> list[Candidate]: ...

    def with_min_runtime(self) -> Iterator[Candidate]: ...

    def crowds(self, chosen: set[JobId]) -> list[Crowd]: ...


@dataclass(slots=True)
class Candidates:
    """Preemption candidates of one decision, indexed by node; chosen ones are taken out."""

    free: FreeGpus
    shares: TeamShares
    on_node: list[list[Candidate] | None]
    """Candidates per node index, in snapshot order; `at` sorts a node's list in place into
    `victim_order` when it is first read. None: not built yet, `source` builds it."""
    groups: GroupsByNode
    """Per node, what the bounds of a search are made of. Built from a `source`, its rows also
    count candidates inside their minimum runtime: a looser bound, the same choice."""
    supply: Counter[Group]
    """GPUs held by the unprotected candidates not yet chosen, per group: what lets a search see
    at once that no rule could free enough anywhere."""
    chosen: set[JobId] = field(default_factory=set)
    source: NodeSource | None = None
    _bounds: dict[tuple[int, ...], Bounds] = field(default_factory=dict)
    _ordered: set[int] = field(default_factory=set)
    _crowds: list[Crowd] | None = None

    @classmethod
    def of(cls, free: FreeGpus, shares: TeamShares, candidates: Iterable[Candidate]) -> Candidates:
        """The candidates indexed by the nodes they hold GPUs on, with their groups and supply."""
        on_node: list[list[Candidate]] = [[] for _ in free.free]
        supply: Counter[Group] = Counter()
        held: dict[tuple[int, str, int], tuple[int, float, int]] = {}
        for candidate in candidates:
            slots = candidate.slots
            if len(slots) == 1:
                node, ids = slots[0]
                on_node[node].append(candidate)
                layout = [(node, len(ids))]
            else:
                layout = [(i, candidate.gpus_on(i)) for i in {i for i, _ in slots}]
                for i, _ in layout:
                    on_node[i].append(candidate)
            if candidate.protection is not None:
                continue
            team, value, cost = candidate.team, candidate.cls.value, candidate.cost
            for i, gpus in layout:
                supply[team, value] += gpus
                found = held.get((i, team, value))
                held[i, team, value] = (
                    (gpus, cost, gpus) if found is None else (found[0] + gpus, min(found[1], cost), max(found[2], gpus))
                )
        return cls(free, shares, [*on_node], GroupsByNode.of(len(on_node), held), supply)

    def at(self, node: int) -> list[Candidate]:
        """The candidates of node `node`, in `victim_order` (sorted when first asked for: most
        nodes' never are)."""
        here = self.on_node[node]
        if here is None:
            assert self.source is not None
            here = self.on_node[node] = self.source.on(node)
        if node not in self._ordered:
            self._ordered.add(node)
            here.sort(key=victim_order)
        return here

    def with_min_runtime(self, nodes: Iterable[int]) -> Iterator[Candidate]:
        """The candidates on `nodes` inside their minimum runtime (a gang on several of them
        may come more than once)."""
        if self.source is None:
            for i in nodes:
                for c in self.on_node[i] or ():
                    if c.protection is not None and c.protection.until is not None:
                        yield c
            return
        wanted = set(nodes)
        for c in self.source.with_min_runtime():
            if any(i in wanted for i, _ in c.slots):
                yield c

    def crowds(self) -> list[Crowd]:
        """Every candidate, by crowd (built when a wait is first explained)."""
        if self._crowds is None:
            if self.source is not None:
                self._crowds = self.source.crowds(self.chosen)
            else:
                by_key: dict[tuple[object, ...], tuple[list[Candidate], frozenset[NodeGroup]]] = {}
                seen: set[JobId] = set()
                group = self.free.group
                for here in self.on_node:
                    for c in here or ():
                        if c.id not in seen:
                            seen.add(c.id)
                            groups = frozenset(group[i] for i, _ in c.slots)
                            by_key.setdefault(crowd_key(c, groups), ([], groups))[0].append(c)
                self._crowds = [ListedCrowd(listed, groups, self.chosen) for listed, groups in by_key.values()]
        return self._crowds

    def bounds(self, ranks: Mapping[Group, Rank | None]) -> Bounds:
        """The `Bounds` of a search that ranks the groups as `ranks` does. Searches that rank
        them in the same order share their arrays (those of one class, of one team's senior
        jobs, reclaims while the teams above their guarantees keep their order): the groups
        never change within a decision."""
        admitted, places = ranked(self.groups, ranks)
        found = self._bounds.get(places)
        if found is None:
            found = self._bounds[places] = bounds_of(self.groups, admitted, places, self.free.counts_at_start())
        elif found.ranks != admitted:
            found = replace(found, ranks=admitted)
        return found

    def choose(self, candidate: Candidate) -> None:
        """Take `candidate` out: it has been given notice."""
        if candidate.id in self.chosen:
            return
        self.chosen.add(candidate.id)
        if candidate.protection is None:
            self.supply[candidate.team, candidate.cls.value] -= candidate.held

    def team_gpus_preemptible(self, team: str, below: int) -> int:
        """GPUs held by `team`'s unprotected, not yet chosen jobs of a class below `below`."""
        return sum(gpus for (of, value), gpus in self.supply.items() if of == team and value < below)
