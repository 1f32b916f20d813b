"""Whom to give notice: protection rules and the victim search."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from gpupool.model import Config, JobId, PriorityClass, Reason, RunningJob
from gpupool.policy.place import FreeGpus, Shape, Slot
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
    id: JobId = field(init=False)
    team: str = field(init=False)
    gpus: int = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.running.job.id
        self.team = self.running.job.team
        self.gpus = self.running.job.gpus

    def gpus_on(self, node: int) -> int:
        return sum(len(gpus) for i, gpus in self.slots if i == node)


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
    if ran < cls.min_runtime:
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


def victim_order(candidate: Candidate) -> tuple[int, float, float, str]:
    """Lower class first, then cheapest lost work, then most recently started; the id
    keeps the order total (an arbitrary but deterministic tie-break)."""
    return (candidate.cls.value, candidate.cost, -candidate.running.started_at, candidate.id)


@dataclass(frozen=True, slots=True)
class Victim:
    candidate: Candidate
    reason: Reason


@dataclass(slots=True)
class Candidates:
    """Preemption candidates of one decision, indexed by node; chosen ones are taken out."""

    free: FreeGpus
    shares: TeamShares
    build: Callable[[], list[list[Candidate]]]
    """Builds the candidates by node, on first use."""
    chosen: set[JobId] = field(default_factory=set)
    _on_node: list[list[Candidate]] | None = None
    _bounds: dict[tuple[int, bool], list[int]] = field(default_factory=dict)

    @property
    def on_node(self) -> list[list[Candidate]]:
        if self._on_node is None:
            self._on_node = self.build()
        return self._on_node

    def bound(self, who: Preemptor) -> list[int]:
        """Per node, an upper bound of the GPUs preemption could free for `who`: the unprotected
        jobs of a lower class (of an equal one too, when it may reclaim). Lets the victim
        search skip at a glance the nodes that cannot help."""
        limit, inclusive = who.cls.value, who.may_reclaim
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

    def over_guarantee(self, team: str) -> bool:
        return self.shares.above_guarantee(team)


@dataclass(frozen=True, slots=True)
class Preemptor:
    id: JobId
    team: str
    cls: PriorityClass
    may_reclaim: bool
    """Its team is below its guarantee, and stays within it with this job."""


def eligibility(candidate: Candidate, who: Preemptor, candidates: Candidates) -> Reason | None:
    if who.cls.may_preempt and candidate.cls.value < who.cls.value:
        return Reason.PRIORITY
    if who.may_reclaim and candidate.cls.value <= who.cls.value and candidates.over_guarantee(candidate.team):
        return Reason.RECLAIM
    return None


def find_victims(
    who: Preemptor, shape: Shape, candidates: Candidates, nodes_of: Sequence[int]
) -> tuple[list[Slot], list[Victim]] | None:
    """The cheapest sufficient set of victims that makes the gang fit, with its placement.

    Gang members are placed largest first. For each, every node is scored by the victims it
    would need, `(victims' classes highest first, total lost work, number of victims, free
    GPUs, node)`, and the best node is kept: nodes that need no victim always win; among nodes
    whose highest victim class is the same, the one whose other victims are of lower classes. On a node, candidates are
    taken in `victim_order` until the member fits, then reprieved in reverse while it still
    fits. Reclaim never takes a victim that would push its team below its guarantee.
    Returns None, choosing nobody, when no such set exists.
    """
    free = candidates.free
    bound = candidates.bound(who)
    removed: Counter[str] = Counter()
    freed: Counter[int] = Counter()
    chosen: dict[JobId, Victim] = {}
    used: set[int] = set()
    slots: list[Slot] = []
    for want in shape.slots:
        best: tuple[tuple[tuple[int, ...], float, int, int, int], int, list[Victim]] | None = None
        for i in nodes_of:
            if i in used:
                continue
            have = len(free.free[i]) + freed[i]
            picked: list[Victim] = []
            if have < want and have + bound[i] < want:
                continue
            if have < want:
                found = _victims_on_node(i, want - have, who, candidates, chosen, removed)
                if found is None:
                    continue
                picked = found
            score = (
                tuple(sorted((v.candidate.cls.value for v in picked), reverse=True)),
                sum(v.candidate.cost for v in picked),
                len(picked),
                have,
                i,
            )
            if best is None or score < best[0]:
                best = (score, i, picked)
        if best is None:
            return None
        _, node, picked = best
        used.add(node)
        slots.append((node, want))
        for victim in picked:
            chosen[victim.candidate.id] = victim
            removed[victim.candidate.team] += victim.candidate.gpus
            for i, gpus in victim.candidate.slots:
                freed[i] += len(gpus)
    return slots, reprieve(slots, list(chosen.values()), free)


def reprieve(slots: Sequence[Slot], victims: list[Victim], free: FreeGpus) -> list[Victim]:
    """Drop, most expensive first, every victim the whole gang still fits without: a victim
    needed on one node when it was chosen may be covered later by one spanning several."""
    kept = list(victims)
    for victim in sorted(victims, key=lambda v: victim_order(v.candidate), reverse=True):
        trial = [v for v in kept if v is not victim]
        if all(len(free.free[i]) + sum(v.candidate.gpus_on(i) for v in trial) >= want for i, want in slots):
            kept = trial
    return kept


def _victims_on_node(
    node: int,
    need: int,
    who: Preemptor,
    candidates: Candidates,
    chosen: Mapping[JobId, Victim],
    removed: Counter[str],
) -> list[Victim] | None:
    taken: list[Victim] = []
    taken_gpus: Counter[str] = Counter()
    got = 0
    for candidate in candidates.on_node[node]:
        if candidate.id in chosen or candidate.id in candidates.chosen or candidate.protection is not None:
            continue
        reason = eligibility(candidate, who, candidates)
        if reason is None:
            continue
        if reason is Reason.RECLAIM:
            team = candidate.team
            left = candidates.shares.gpus[team] - removed[team] - taken_gpus[team] - candidate.gpus
            if left < candidates.shares.guarantee(team):
                continue
        taken.append(Victim(candidate, reason))
        taken_gpus[candidate.team] += candidate.gpus
        got += candidate.gpus_on(node)
        if got >= need:
            break
    if got < need:
        return None
    for victim in reversed(list(taken)):
        spare = victim.candidate.gpus_on(node)
        if got - spare >= need:
            taken.remove(victim)
            got -= spare
    return taken
