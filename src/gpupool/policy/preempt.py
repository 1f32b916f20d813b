"""Who could be given notice: running jobs as candidates, and the rules that protect them.

The search for victims among them is `victims.py`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from enum import Enum

from gpupool.model import Config, JobId, PriorityClass, RunningJob
from gpupool.policy.place import FreeGpus
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


LowerBound = tuple[tuple[tuple[float, ...]], float]
"""A lower bound of what the victims a node needs cost in a search (the ranks and lost work of
`victims.node_score`): the lowest rank and the lowest lost work of the node's candidates the
search might take. No set of victims on the node scores better than one victim with both: its
worst rank is no lower, and at an equal rank alone, its lost work no less."""


def lower_bound(
    here: Sequence[Candidate],
    limit: int,
    inclusive: bool,
    taken_before: Container[JobId],
    rank_of: Callable[[Candidate], tuple[float, ...]],
) -> LowerBound | None:
    """The `LowerBound` of a node for a search of class value `limit` (see `Candidates.bound`
    for `inclusive`), from its candidates not protected nor `taken_before`; None if there
    are none."""
    takeable = [
        c
        for c in here
        if c.protection is None
        and (c.cls.value < limit or (inclusive and c.cls.value == limit))
        and c.id not in taken_before
    ]
    if not takeable:
        return None
    return ((min(rank_of(c) for c in takeable),), min(c.cost for c in takeable))


@dataclass(slots=True)
class Candidates:
    """Preemption candidates of one decision, indexed by node; chosen ones are taken out."""

    free: FreeGpus
    shares: TeamShares
    on_node: list[list[Candidate]]
    """Candidates per node index, in `victim_order`."""
    chosen: set[JobId] = field(default_factory=set)
    _bounds: dict[tuple[int, bool], list[int]] = field(default_factory=dict)
    _cheapest: dict[tuple[int, bool], dict[int, LowerBound | None]] = field(default_factory=dict)
    _supply: Counter[tuple[str, int]] | None = None

    def bound(self, limit: int, inclusive: bool) -> list[int]:
        """Per node, an upper bound of the GPUs preemption could free for a job of class value
        `limit`: the unprotected jobs of a lower class (of an equal one too when `inclusive`:
        reclaim and fair share). Lets the victim search skip at a glance the nodes that cannot
        help."""
        key = (limit, inclusive)
        if key not in self._bounds:
            self._bounds[key] = [
                sum(
                    h.gpus_on(i)
                    for h in here
                    if h.protection is None and (h.cls.value < limit or (inclusive and h.cls.value == limit))
                )
                for i, here in enumerate(self.on_node)
            ]
        return self._bounds[key]

    def cheapest(self, limit: int, inclusive: bool) -> dict[int, LowerBound | None]:
        """Per node, the `LowerBound` of a search whose ranks are the class alone (see
        `bound` for `limit` and `inclusive`), None where no candidate could be taken. Built
        once per decision; victims chosen later only raise a node's true bound."""
        key = (limit, inclusive)
        if key not in self._cheapest:
            cheapest = {
                i: lower_bound(here, limit, inclusive, set(), lambda h: (h.cls.value,))
                for i, here in enumerate(self.on_node)
            }
            self._cheapest[key] = cheapest
        return self._cheapest[key]

    @property
    def supply(self) -> Counter[tuple[str, int]]:
        """GPUs of the unprotected candidates not yet chosen, per (team, class value): what
        lets a search see at once that no rule could free enough anywhere."""
        if self._supply is None:
            supply: Counter[tuple[str, int]] = Counter()
            seen: set[JobId] = set()
            for here in self.on_node:
                for c in here:
                    if c.protection is None and c.id not in seen and c.id not in self.chosen:
                        seen.add(c.id)
                        supply[c.team, c.cls.value] += c.gpus
            self._supply = supply
        return self._supply

    def choose(self, candidate: Candidate) -> None:
        """Take `candidate` out: it has been given notice."""
        if candidate.id in self.chosen:
            return
        self.chosen.add(candidate.id)
        if self._supply is not None and candidate.protection is None:
            self._supply[candidate.team, candidate.cls.value] -= candidate.gpus

    def team_gpus_preemptible(self, team: str, below: int) -> int:
        """GPUs of `team`'s unprotected, not yet chosen jobs of a class below `below`."""
        return sum(gpus for (of, value), gpus in self.supply.items() if of == team and value < below)
