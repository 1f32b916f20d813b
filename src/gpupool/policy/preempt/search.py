"""The victim search: the cheapest sufficient set of candidates that makes a gang fit.

Who may be taken is `rules.eligibility`; which of them go first is `rules.rank`, then
`candidates.victim_order`; how nodes compare is `node_score`. The search's shortcuts change no
choice (a property test turns them off, `candidates.Shortcuts`): it gives up at once when no
rule could free enough GPUs anywhere, it looks at nodes in the order of a lower bound of their
score (`bounds.Bounds`), stopping at the first bound no better than its best, and searches that
rank the candidates' groups alike share their bounds.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpupool.model import Reason
from gpupool.policy.free import FreeGpus, Shape, Slot
from gpupool.policy.preempt.bounds import Bounds, Group, Rank
from gpupool.policy.preempt.candidates import Candidate, Candidates, fitted, resized, victim_order
from gpupool.policy.preempt.rules import Leaving, Preemptor, Taken, admits, eligibility, rank


@dataclass(frozen=True, slots=True)
class Victim:
    """A candidate chosen to be given notice, and why."""

    candidate: Candidate
    reason: Reason
    below: int = 0
    """GPUs its leaving takes its team below its guarantee (reclaim that crosses it), as
    counted when it was chosen: what the search scores, not a total to add up."""


Score = tuple[int, tuple[Rank, ...], float, int, int, int, int]
"""(GPUs taken below guarantees, victims' ranks worst first, their lost work, how many are
evicted (not shrunk), their number, the node's free GPUs, the node): how a search compares
nodes for one gang member, lowest best."""


@dataclass(slots=True)
class _Search:
    """One search: whose, the same rules without crossing a guarantee, and the ranks it gives
    the candidates' groups (each worked out once)."""

    who: Preemptor
    candidates: Candidates
    strict: Preemptor = field(init=False)
    ranks: dict[Group, Rank] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.strict = replace(self.who, cross=False) if self.who.cross else self.who

    def rank_of_group(self, group: Group) -> Rank:
        found = self.ranks.get(group)
        if found is None:
            found = self.ranks[group] = rank(group, self.who, self.candidates.shares)
        return found

    def rank_of(self, c: Candidate) -> Rank:
        return self.rank_of_group((c.team, c.cls.value))


@dataclass(slots=True)
class _Chosen:
    """What one search has chosen so far: a node per gang member, and the victims on them."""

    slots: list[Slot] = field(default_factory=list)
    used: set[int] = field(default_factory=set)
    victims: dict[str, Victim] = field(default_factory=dict)
    gone: Leaving = field(default_factory=Leaving)
    freed: Counter[int] = field(default_factory=Counter)
    """GPUs per node that the victims chosen so far free."""

    def add(self, node: int, want: int, picked: Sequence[Victim]) -> None:
        self.used.add(node)
        self.slots.append((node, want))
        for victim in picked:
            prior = self.victims.get(victim.candidate.id)
            if prior is not None:  # an eviction in place of an earlier member's shrink
                for i, gpus in prior.candidate.slots:
                    self.freed[i] -= len(gpus)
                self.gone = self.without(victim.candidate.id)
            self.victims[victim.candidate.id] = victim
            self.gone.add(victim.candidate)
            for i, gpus in victim.candidate.slots:
                self.freed[i] += len(gpus)

    def without(self, job_id: str) -> Leaving:
        """The victims so far, but job `job_id`'s (a copy)."""
        found = Leaving()
        for victim in self.victims.values():
            if victim.candidate.id != job_id:
                found.add(victim.candidate)
        return found


def find_victims(who: Preemptor, shape: Shape, candidates: Candidates) -> tuple[list[Slot], list[Victim]] | None:
    """The cheapest sufficient set of victims that makes the gang fit, with its placement.

    Gang members are placed largest first, each on the node of the lowest `node_score`: nodes
    that need no victim always win; among nodes whose worst victim ranks the same, the one
    whose other victims rank better. Once every member has a node, victims are reprieved across
    the gang. Returns None, choosing nobody, when no such set exists.
    """
    search = _Search(who, candidates)
    admitted = {
        group: search.rank_of_group(group) if admits(group, who, candidates.shares) else None
        for group in candidates.supply
    }
    if candidates.shortcuts.give_up and _cannot_free(shape, candidates, admitted):
        return None
    bounds = candidates.bounds(admitted)
    chosen = _Chosen()
    for want in shape.slots:
        best = _best_node(want, shape, search, bounds, chosen)
        if best is None:
            return None
        _, node, picked = best
        chosen.add(node, want, picked)
    return chosen.slots, reprieve(chosen.slots, list(chosen.victims.values()), candidates.free)


def _cannot_free(shape: Shape, candidates: Candidates, admitted: Mapping[Group, Rank | None]) -> bool:
    """Whether the free GPUs of the shape's nodes and every GPU the groups a search admits
    hold anywhere fall short of the gang: no rule could free enough."""
    could = sum(gpus for group, gpus in candidates.supply.items() if gpus > 0 and admitted[group] is not None)
    return candidates.free.total(shape.groups) + could < sum(shape.slots)


def _best_node(
    want: int, shape: Shape, search: _Search, bounds: Bounds, chosen: _Chosen
) -> tuple[Score, int, list[Victim]] | None:
    """The node of the lowest score for a member of `want` GPUs, with the victims it needs
    there: one where it fits without victims if any (the one of fewest free GPUs), else the best
    of those the bounds could not rule out, looked at in the order of their bounds."""
    free = search.candidates.free
    fits = _fits_free(want, shape, free, chosen)
    if fits is not None:
        have, i = fits
        return (0, (), 0.0, 0, 0, have, i), i, []
    best: tuple[Score, int, list[Victim]] | None = None
    for lowest, i in _looks(want, shape, free, bounds, chosen):
        if best is not None and lowest >= best[0]:
            break
        have = len(free.free[i]) + chosen.freed[i]
        picked = _victims_on_node(i, want - have, search, chosen)
        if picked is None:
            continue
        score = (*node_score(picked, search.rank_of), have, i)
        if best is None or score < best[0]:
            best = (score, i, picked)
    return best


def _fits_free(want: int, shape: Shape, free: FreeGpus, chosen: _Chosen) -> tuple[int, int] | None:
    """(free GPUs, node) of the node of the shape's groups with the fewest free GPUs, counting
    those its victims so far free, that holds `want` without a victim; None if none does."""
    found: tuple[int, int] | None = None
    for i, more in chosen.freed.items():
        have = len(free.free[i]) + more
        if (
            i not in chosen.used
            and have >= want
            and free.group[i] in shape.groups
            and (found is None or (have, i) < found)
        ):
            found = (have, i)
    exclude = chosen.used | chosen.freed.keys()
    for count in range(want, free.capacity + 1 if found is None else found[0] + 1):
        first: int | None = None
        for group in shape.groups:
            if group in free.layout.sizes:
                node = free.first_with(group, count, exclude)
                if node is not None and (first is None or node < first):
                    first = node
        if first is not None:
            return min(found, (count, first)) if found is not None else (count, first)
    return found


def _looks(
    want: int, shape: Shape, free: FreeGpus, bounds: Bounds, chosen: _Chosen
) -> Iterator[tuple[tuple[object, ...], int]]:
    """The nodes of the shape's groups where victims could make room for `want`, with the lower
    bound of their score, in the order of the bounds: the nodes whose free GPUs have not changed
    since the bounds were made come in `Bounds.order_for`; the others (changed in this decision,
    or freed by this search's victims) are looked at apart and merged in."""
    used, freed = chosen.used, chosen.freed
    apart = free.changed | freed.keys()

    def helps(i: int, have: int) -> bool:
        return i not in used and free.group[i] in shape.groups and have < want <= have + bounds.gpus[i]

    def unchanged() -> Iterator[tuple[tuple[object, ...], int]]:
        for i in bounds.order_for(want):
            if i not in apart and i not in used and free.group[i] in shape.groups:
                yield bounds.bound(i, len(free.free[i]), want), i

    changed = []
    for i in apart:
        have = len(free.free[i]) + freed.get(i, 0)
        if bounds.lowest[i] >= 0 and helps(i, have):
            changed.append((bounds.bound(i, have, want), i))
    changed.sort()
    return heapq.merge(unchanged(), changed)


def node_score(
    picked: Sequence[Victim], rank_of: Callable[[Candidate], Rank]
) -> tuple[int, tuple[Rank, ...], float, int, int]:
    """What the victims a node needs cost: GPUs taken below guarantees, their ranks worst
    first, their lost work, how many of them are evicted (at equal lost work a shrink is the
    better choice: an evicted job also waits in line again), their number. The lost work is
    summed exactly (`math.fsum`, one rounding): so no set of `k` victims that each cost at
    least `c` sums below `k * c`, and `Bounds.bound` can be that product with no margin that
    ties would fall inside."""
    return (
        sum(v.below for v in picked),
        tuple(sorted((rank_of(v.candidate) for v in picked), reverse=True)),
        math.fsum(v.candidate.cost for v in picked),
        sum(1 for v in picked if not v.candidate.keep),
        len(picked),
    )


def reprieve(slots: Sequence[Slot], victims: list[Victim], free: FreeGpus) -> list[Victim]:
    """Drop, most expensive first, every victim the whole gang still fits without: a victim
    needed on one node when it was chosen may be covered later by one spanning several. Then
    each shrink frees no more than the gang needs (`_trimmed`)."""
    kept = list(victims)
    for victim in sorted(victims, key=lambda v: victim_order(v.candidate), reverse=True):
        trial = [v for v in kept if v is not victim]
        if _fits(slots, trial, free):
            kept = trial
    for n, victim in enumerate(kept):
        if victim.candidate.keep:
            kept[n] = _trimmed(slots, kept, n, free)
    return kept


def _fits(slots: Sequence[Slot], victims: Sequence[Victim], free: FreeGpus) -> bool:
    """Whether every member of the gang fits its node once `victims` have left it."""
    return all(len(free.free[i]) + sum(v.candidate.gpus_on(i) for v in victims) >= want for i, want in slots)


def _trimmed(slots: Sequence[Slot], victims: list[Victim], n: int, free: FreeGpus) -> Victim:
    """Victim `n`, a shrink, with its job keeping the largest of its sizes with which the gang
    still fits, its GPUs off the gang's nodes kept first (as it was chosen, if no larger size
    fits)."""
    victim = victims[n]
    shrink = victim.candidate
    job = shrink.running.job
    kept = sum(len(a.gpus) for a in shrink.keep)
    leave = {free.layout.names[i] for i, _ in slots}
    for size in reversed(job.sizes):
        if kept < size < job.gpus:
            trial = replace(victim, candidate=resized(shrink, size, leave, free.index))
            if _fits(slots, [*victims[:n], trial, *victims[n + 1 :]], free):
                return trial
    return victim


def _leaving(gone: Leaving, taken: Iterable[Victim]) -> Leaving:
    """`gone` with the victims `taken` on a node added (a copy)."""
    found = gone.copy()
    for victim in taken:
        found.add(victim.candidate)
    return found


def _victims_on_node(node: int, need: int, search: _Search, chosen: _Chosen) -> list[Victim] | None:
    """The victims that free `need` GPUs on `node` at the lowest score: the candidates there in
    rank order until they free enough, those not needed reprieved; or the best single one that
    frees enough alone, when it scores better (taking the cheapest first may need several
    victims where one would do). None if the candidates there cannot free enough."""
    here = search.candidates.at(node)
    if search.who.by_team_rule:
        # Stable: equal ranks keep the victim order the list is built in.
        here = sorted(here, key=search.rank_of)
    picked = _in_order(node, need, search, here, chosen)
    if picked is not None and len(picked) > 1:
        alone = _one_victim(node, need, search, here, chosen)
        if alone is not None and node_score([alone], search.rank_of) < node_score(picked, search.rank_of):
            return [alone]
    return picked


def _one_victim(node: int, need: int, search: _Search, order: Sequence[Candidate], chosen: _Chosen) -> Victim | None:
    """The best single candidate that frees `need` GPUs on the node alone, if any."""
    best: tuple[tuple[object, ...], Victim] | None = None
    taken_before, shares = search.candidates.chosen, search.candidates.shares
    free = search.candidates.free
    for listed in order:
        if listed.gpus_on(node) < need or listed.protection is not None:
            continue
        if listed.id in chosen.victims or listed.id in taken_before:
            continue
        candidate = fitted(listed, node, need, free.index, free.layout.names[node]) if listed.keep else listed
        found = eligibility(candidate, search.who, shares, chosen.gone)
        if not isinstance(found, Taken):
            continue
        victim = Victim(candidate, found.reason, found.below)
        score = node_score([victim], search.rank_of)
        if best is None or score < best[0]:
            best = (score, victim)
    return best[1] if best is not None else None


def _in_order(
    node: int, need: int, search: _Search, order: Sequence[Candidate], chosen: _Chosen
) -> list[Victim] | None:
    """Candidates of the node, in `order`, until they free `need` GPUs; then those not needed
    are reprieved, last taken first. Across guarantees (`who.cross`), those that keep their team
    at its guarantee are taken first (by the same rules without crossing), then those that take
    it least below."""
    taken: list[Victim] = []
    leaving: Leaving | None = None  # copied from `chosen.gone` once this node takes a victim
    got = 0
    who, shares, taken_before = search.who, search.candidates.shares, search.candidates.chosen
    free = search.candidates.free

    def take(candidates: Iterable[Candidate], rules: Preemptor) -> None:
        nonlocal got, leaving
        for listed in candidates:
            if listed.protection is not None or listed.id in taken_before:
                continue
            prior = chosen.victims.get(listed.id)  # an earlier member's victim
            earlier = next((n for n, v in enumerate(taken) if v.candidate.id == listed.id), None)
            replaced = prior if prior is not None else taken[earlier] if earlier is not None else None
            if replaced is not None and (listed.keep or not replaced.candidate.keep):
                continue  # a shrink of a job taken already, or the job twice
            # A shrink as large as this node allows.
            candidate = fitted(listed, node, need - got, free.index, free.layout.names[node]) if listed.keep else listed
            if replaced is None:
                before = leaving or chosen.gone
            else:  # its job after its shrink, which was not enough: evicted instead
                others = [v for v in taken if v is not replaced]
                before = _leaving(chosen.gone if prior is None else chosen.without(listed.id), others)
            found = eligibility(candidate, rules, shares, before)
            if not isinstance(found, Taken):
                continue
            if earlier is not None:
                got -= taken[earlier].candidate.gpus_on(node)
                del taken[earlier]
            if replaced is not None:
                leaving = before
            elif leaving is None:
                leaving = chosen.gone.copy()
            taken.append(Victim(candidate, found.reason, found.below))
            leaving.add(candidate)
            got += _gain(taken[-1], node, chosen)
            if got >= need:
                return

    take(order, search.strict)
    if got < need and who.cross:
        evicted = {v.candidate.id for v in taken if not v.candidate.keep}
        so_far = leaving or chosen.gone
        left = [c for c in order if c.id not in evicted]
        left.sort(key=lambda c: shares.guarantee(c.team) - (shares.gpus[c.team] - so_far.gpus[c.team] - c.gpus))
        take(left, who)
    if got < need:
        return None
    taken = _reprieved(node, need, taken, chosen)
    return _evicting_instead(node, need, search, order, chosen, taken)


def _gain(victim: Victim, node: int, chosen: _Chosen) -> int:
    """GPUs `victim` frees on `node` beyond what the search's victims so far free there (an
    eviction that replaces an earlier member's shrink of the same job frees the rest)."""
    prior = chosen.victims.get(victim.candidate.id)
    return victim.candidate.gpus_on(node) - (prior.candidate.gpus_on(node) if prior is not None else 0)


def _reprieved(node: int, need: int, taken: list[Victim], chosen: _Chosen) -> list[Victim]:
    """`taken` without those the node does not need to free `need` GPUs, last taken first."""
    got = sum(_gain(v, node, chosen) for v in taken)
    kept = list(taken)
    for victim in reversed(taken):
        spare = _gain(victim, node, chosen)
        if got - spare >= need:
            kept.remove(victim)
            got -= spare
    return kept


def _evicting_instead(
    node: int, need: int, search: _Search, order: Sequence[Candidate], chosen: _Chosen, taken: list[Victim]
) -> list[Victim]:
    """`taken`, with a shrink among them replaced by its job's eviction where that scores
    better: the whole job frees more, and may reprieve others that cost more than it adds."""
    wholes = {c.id: c for c in order if not c.keep}
    for n, victim in enumerate(taken):
        whole = wholes.get(victim.candidate.id)
        if not victim.candidate.keep or whole is None:
            continue
        others = taken[:n] + taken[n + 1 :]
        found = eligibility(whole, search.who, search.candidates.shares, _leaving(chosen.gone, others))
        if not isinstance(found, Taken):
            continue
        trial = [*taken[:n], Victim(whole, found.reason, found.below), *taken[n + 1 :]]
        trial = _reprieved(node, need, trial, chosen)
        if node_score(trial, search.rank_of) < node_score(taken, search.rank_of):
            return _evicting_instead(node, need, search, order, chosen, trial)
    return taken
