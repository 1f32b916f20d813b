"""The victim search: the cheapest sufficient set of candidates that makes a gang fit.

Who may be taken is `eligibility`: priority preemption (a lower class, within the scope the
policy gives it), reclaim (a team below its guarantee takes GPUs back from teams above theirs),
fair-share preemption (a team with a lower weighted share takes from one with a higher share)
and seniority (a job that has waited long takes smaller jobs of its class or lower submitted
after it). Which of them go first is `rank`, then `victim_order`; how nodes compare is the score in
`find_victims`.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpupool.model import JobId, PriorityClass, PriorityScope, Reason
from gpupool.policy.bounds import Bounds, Group, Rank
from gpupool.policy.order import submit_key
from gpupool.policy.place import FreeGpus, Shape, Slot
from gpupool.policy.preempt import Candidate, Candidates, victim_order
from gpupool.policy.share import TeamShares


@dataclass(frozen=True, slots=True)
class Preemptor:
    """A job that looks for victims, and the rules its search follows."""

    id: JobId
    team: str
    cls: PriorityClass
    gpus: int
    scope: PriorityScope = PriorityScope.POOL
    reclaim: bool = False
    """Its team is below its guarantee and stays within it with this job, once its own victims
    in the chosen set have left."""
    own_first: bool = False
    """Reclaim needs the team's own lower jobs to leave: they are taken before other teams'."""
    cross: bool = False
    """Reclaim may take a whole job that takes its team below its guarantee: nothing that
    keeps every team at its guarantee frees a placement."""
    fair_share: bool = False
    final_share: float = 0.0
    """The team's weighted share with this job: fair share only takes from teams whose share
    stays at or above it."""
    place: tuple[float, int, str] | None = None
    """Its place in line (`submit_key`) when the policy has seniority: what `passed` and
    `takes_back` compare."""
    senior: bool = False
    """It has waited `Config.seniority_after`: it may take the jobs it `passed`."""

    @property
    def inclusive(self) -> bool:
        """Whether jobs of its own class may be victims."""
        return self.reclaim or self.fair_share or self.senior

    @property
    def by_team_rule(self) -> bool:
        """Whether any other team's job of its own class may be a victim (seniority's are
        only those it `passed`), and so whether `rank` reads the teams' shares (else it is the
        class, as `victim_order`)."""
        return self.reclaim or self.fair_share

    def memo_key(self) -> tuple[object, ...]:
        """What the search's result depends on, beyond the shape (see Memo.no_victims): the
        team only where a rule reads it, the final share only for fair share, the place in line
        only where seniority reads it."""
        team = self.team if (self.inclusive or self.scope is not PriorityScope.POOL) else None
        share = self.final_share if self.fair_share else None
        place = self.place if self.senior or self.fair_share else None
        return (self.cls.value, team, self.reclaim, self.own_first, self.cross, share, self.senior, place, self.gpus)


@dataclass(frozen=True, slots=True)
class Victim:
    """A candidate chosen to be given notice, and why."""

    candidate: Candidate
    reason: Reason
    below: int = 0
    """GPUs its leaving takes its team below its guarantee (reclaim that crosses it), as
    counted when it was chosen: what the search scores, not a total to add up."""


@dataclass(slots=True)
class Leaving:
    """The victims one search has chosen so far, per team: their GPUs and the largest job."""

    gpus: Counter[str] = field(default_factory=Counter)
    largest: Counter[str] = field(default_factory=Counter)

    def add(self, c: Candidate) -> None:
        self.gpus[c.team] += c.gpus
        self.largest[c.team] = max(self.largest[c.team], c.gpus)

    def copy(self) -> Leaving:
        return Leaving(Counter(self.gpus), Counter(self.largest))


_PRIORITY = (Reason.PRIORITY, 0)
_SENIORITY = (Reason.SENIORITY, 0)


def eligibility(c: Candidate, who: Preemptor, shares: TeamShares, leaving: Leaving) -> tuple[Reason, int] | None:
    """Why `who` may take `c`, with the GPUs that takes `c`'s team below its guarantee; None if
    it may not. `leaving` holds the victims already chosen in this search.

    Reclaim across a guarantee takes a team below it by one whole job at most: the team stays
    above its guarantee without its largest victim, whatever order the victims were chosen in.
    Fair share never takes a job that could take the GPUs back by seniority (`takes_back`).
    Seniority takes the claimant's own jobs it `passed`, and other teams' only down to their
    guarantee."""
    own = c.team == who.team
    lower = c.cls.value < who.cls.value
    if lower and who.cls.may_preempt and (own or who.scope is PriorityScope.POOL):
        return _PRIORITY
    gone = leaving.gpus[c.team] + c.gpus
    floor = shares.guarantee(c.team)
    left = shares.gpus[c.team] - gone
    if lower and who.cls.may_preempt and who.scope is PriorityScope.ABOVE_GUARANTEE and left >= floor:
        return _PRIORITY
    if c.cls.value > who.cls.value:
        return None
    if not own:
        if who.reclaim:
            if left >= floor:
                return Reason.RECLAIM, 0
            if who.cross and left + max(leaving.largest[c.team], c.gpus) > floor:
                return Reason.RECLAIM, floor - left
        fair = who.fair_share and left >= floor and shares.share(c.team, -gone) >= who.final_share
        if fair and not takes_back(c, who):
            return Reason.FAIR_SHARE, 0
    if passed(c, who) and (own or left >= floor):
        return _SENIORITY
    return None


def passed(c: Candidate, who: Preemptor) -> bool:
    """Whether a senior `who` may take `c` by seniority, as backfill could have passed it with
    `c`: smaller, and submitted after it (a job as large started in its turn, by queue order,
    not in a hole `who` could not use)."""
    if not who.senior or who.place is None or c.cls.value > who.cls.value:
        return False
    return c.gpus < who.gpus and submit_key(c.running.job) > who.place


def open_to_seniority(c: Candidate, who: Preemptor, shares: TeamShares) -> bool:
    """Whether seniority could take `c` alone once its protection ends: `passed`, and its own
    team's or its team above its guarantee without it."""
    if not passed(c, who):
        return False
    return c.team == who.team or shares.gpus[c.team] - c.gpus >= shares.guarantee(c.team)


def takes_back(c: Candidate, who: Preemptor) -> bool:
    """Whether `c`, requeued, could take `who`'s GPUs back by seniority: of `who`'s class or
    higher, larger, and submitted before it. Fair share leaves it alone (else the two rules
    evict each other in turn)."""
    if who.place is None or c.cls.value < who.cls.value:
        return False
    return c.gpus > who.gpus and submit_key(c.running.job) < who.place


def rank(group: Group, who: Preemptor, shares: TeamShares) -> Rank:
    """Which candidates go first, before `victim_order`, by their group (team, class value):
    the lowest class for priority preemption; for reclaim, the teams furthest above their
    guarantee (weighted) first and the claimant's own jobs last (first when they must leave for
    it to stay within its guarantee); for fair share, at one class, the team with the highest
    weighted share first."""
    team, value = group
    if who.reclaim:
        above = (shares.gpus[team] - shares.guarantee(team)) / max(shares.team(team).weight, 1e-9)
        return ((team == who.team) is not who.own_first, -above, value)
    if who.fair_share:
        return (value, -shares.share(team))
    return (value,)


def admits(group: Group, who: Preemptor, shares: TeamShares) -> bool:
    """Whether some rule of `eligibility` could take a job of `group` (team, class value) for
    `who` before any victim leaves: a team is taken from only while it is above its guarantee,
    except by its own jobs and by priority preemption at `pool` scope."""
    team, value = group
    limit = who.cls.value
    if value > limit:
        return False
    own = team == who.team
    above = shares.above_guarantee(team)
    scoped = own or who.scope is PriorityScope.POOL or (who.scope is PriorityScope.ABOVE_GUARANTEE and above)
    if value < limit and who.cls.may_preempt and scoped:
        return True
    if not own and above and (who.reclaim or (who.fair_share and shares.share(team) >= who.final_share)):
        return True
    return who.senior and (own or above)


def could_free(ranks: Mapping[Group, object], supply: Mapping[Group, int]) -> int:
    """An upper bound of the GPUs a search could take: those of the groups it admits (a rank
    that is not None)."""
    return sum(gpus for group, gpus in supply.items() if gpus > 0 and ranks[group] is not None)


def find_victims(who: Preemptor, shape: Shape, candidates: Candidates) -> tuple[list[Slot], list[Victim]] | None:
    """The cheapest sufficient set of victims that makes the gang fit, with its placement.

    Gang members are placed largest first. For each, every node is scored by the victims it
    would need, `(GPUs taken below guarantees, victims' ranks worst first, total lost work,
    number of victims, free GPUs, node)`, and the best node is kept: nodes that need no victim
    always win; among nodes whose worst victim ranks the same, the one whose other victims rank
    better. On a node, candidates are taken in rank order until the member fits, then reprieved
    in reverse while it still fits; once every member has a node, victims are reprieved across
    the gang. Returns None, choosing nobody, when no such set exists.

    Nodes are looked at in the order of a lower bound of their score (`bounds.Bounds`), and the
    look stops at the first bound no better than the best score found: the choice is the one a
    look at every node would make, without the cost of one (nor of a pass over the nodes: the
    bounds come in order, see `_looks`).
    """
    free, shares = candidates.free, candidates.shares
    rank_of_group: dict[Group, Rank] = {}

    def rank_group(group: Group) -> Rank:
        found = rank_of_group.get(group)
        if found is None:
            found = rank_of_group[group] = rank(group, who, shares)
        return found

    def rank_of(c: Candidate) -> Rank:
        return rank_group((c.team, c.cls.value))

    ranks = {group: rank_group(group) if admits(group, who, shares) else None for group in candidates.supply}
    if free.total(shape.groups) + could_free(ranks, candidates.supply) < sum(shape.slots):
        return None
    bounds = candidates.bounds(ranks)
    default_rank = not who.by_team_rule
    strict = replace(who, cross=False) if who.cross else who
    gone = Leaving()
    freed: Counter[int] = Counter()
    chosen: dict[JobId, Victim] = {}
    used: set[int] = set()
    slots: list[Slot] = []
    for want in shape.slots:
        looks = _looks(want, shape, free, bounds, used, freed)
        best: tuple[tuple[object, ...], int, list[Victim]] | None = None
        fits = _fits_free(want, shape, free, used, freed)
        if fits is not None:
            # A node it fits on without victims scores better than any that needs one.
            have, i = fits
            best = ((0, (), 0, 0, have, i), i, [])
            looks = iter(())
        for lowest, i in looks:
            if best is not None and lowest >= best[0]:
                break
            have = len(free.free[i]) + freed[i]
            picked: list[Victim] = []
            if have < want:
                here = candidates.at(i)
                if not default_rank:
                    # Stable: equal ranks keep the victim order the list is built in.
                    here = sorted(here, key=rank_of)
                found = _victims_on_node(i, want - have, who, strict, here, candidates.chosen, chosen, gone, shares)
                if found is None:
                    continue
                picked = found
                if len(picked) > 1:
                    # Taking the cheapest first may need several victims where one would do.
                    alone = _one_victim(i, want - have, who, here, candidates.chosen, chosen, gone, shares, rank_of)
                    if alone is not None and node_score([alone], rank_of) < node_score(picked, rank_of):
                        picked = [alone]
            score = (*node_score(picked, rank_of), have, i)
            if best is None or score < best[0]:
                best = (score, i, picked)
        if best is None:
            return None
        _, node, picked = best
        used.add(node)
        slots.append((node, want))
        for victim in picked:
            chosen[victim.candidate.id] = victim
            gone.add(victim.candidate)
            for i, gpus in victim.candidate.slots:
                freed[i] += len(gpus)
    return slots, reprieve(slots, list(chosen.values()), free)


def _fits_free(
    want: int, shape: Shape, free: FreeGpus, used: set[int], freed: Mapping[int, int]
) -> tuple[int, int] | None:
    """(free GPUs, node) of the node of the shape's groups with the fewest free GPUs, counting
    those its victims so far free, that holds `want` without a victim; None if none does."""
    found: tuple[int, int] | None = None
    for i, more in freed.items():
        have = len(free.free[i]) + more
        if i not in used and have >= want and free.group[i] in shape.groups and (found is None or (have, i) < found):
            found = (have, i)
    exclude = used | freed.keys()
    for count in range(want, free.capacity + 1 if found is None else found[0] + 1):
        first: int | None = None
        for group in shape.groups:
            buckets = free.buckets.get(group)
            if buckets is not None:
                node = buckets[count].first(exclude)
                if node is not None and (first is None or node < first):
                    first = node
        if first is not None:
            return min(found, (count, first)) if found is not None else (count, first)
    return found


def _looks(
    want: int, shape: Shape, free: FreeGpus, bounds: Bounds, used: set[int], freed: Mapping[int, int]
) -> Iterator[tuple[tuple[object, ...], int]]:
    """The nodes of the shape's groups where victims could make room for `want`, with the lower
    bound of their score, in the order of the bounds: the nodes whose free GPUs have not changed
    since the bounds were made come in `Bounds.order`; the others (changed in this decision, or
    freed by this search's victims) are looked at apart and merged in."""
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
    picked: Sequence[Victim], rank_of: Callable[[Candidate], tuple[float, ...]]
) -> tuple[int, tuple[tuple[float, ...], ...], float, int]:
    """What the victims a node needs cost: GPUs taken below guarantees, their ranks worst
    first, their lost work, their number. The lost work is summed exactly (`math.fsum`, one
    rounding): so no set of `k` victims that each cost at least `c` sums below `k * c`, and
    `Bounds.bound` can be that product with no margin that ties would fall inside."""
    return (
        sum(v.below for v in picked),
        tuple(sorted((rank_of(v.candidate) for v in picked), reverse=True)),
        math.fsum(v.candidate.cost for v in picked),
        len(picked),
    )


def reprieve(slots: Sequence[Slot], victims: list[Victim], free: FreeGpus) -> list[Victim]:
    """Drop, most expensive first, every victim the whole gang still fits without: a victim
    needed on one node when it was chosen may be covered later by one spanning several."""
    kept = list(victims)
    for victim in sorted(victims, key=lambda v: victim_order(v.candidate), reverse=True):
        trial = [v for v in kept if v is not victim]
        if all(len(free.free[i]) + sum(v.candidate.gpus_on(i) for v in trial) >= want for i, want in slots):
            kept = trial
    return kept


def _one_victim(
    node: int,
    need: int,
    who: Preemptor,
    order: Sequence[Candidate],
    taken_before: set[JobId],
    chosen: Mapping[JobId, Victim],
    gone: Leaving,
    shares: TeamShares,
    rank_of: Callable[[Candidate], tuple[float, ...]],
) -> Victim | None:
    """The best single candidate that frees `need` GPUs on the node alone, if any."""
    best: tuple[tuple[object, ...], Victim] | None = None
    for candidate in order:
        if candidate.gpus_on(node) < need or candidate.protection is not None:
            continue
        if candidate.id in chosen or candidate.id in taken_before:
            continue
        found = eligibility(candidate, who, shares, gone)
        if found is None:
            continue
        victim = Victim(candidate, *found)
        score = node_score([victim], rank_of)
        if best is None or score < best[0]:
            best = (score, victim)
    return best[1] if best is not None else None


def _victims_on_node(
    node: int,
    need: int,
    who: Preemptor,
    strict: Preemptor,
    order: Sequence[Candidate],
    taken_before: set[JobId],
    chosen: Mapping[JobId, Victim],
    gone: Leaving,
    shares: TeamShares,
) -> list[Victim] | None:
    """Candidates of the node, in `order`, until they free `need` GPUs; then those not needed
    are reprieved, last taken first. Across guarantees (`who.cross`), those that keep their team
    at its guarantee are taken first (by `strict`, the same rules without crossing), then
    those that take it least below."""
    taken: list[Victim] = []
    leaving: Leaving | None = None  # copied from `gone` once this node takes a victim
    got = 0

    def take(candidates: Iterable[Candidate], rules: Preemptor) -> None:
        nonlocal got, leaving
        for candidate in candidates:
            if candidate.protection is not None or candidate.id in chosen or candidate.id in taken_before:
                continue
            found = eligibility(candidate, rules, shares, leaving or gone)
            if found is None:
                continue
            if leaving is None:
                leaving = gone.copy()
            taken.append(Victim(candidate, *found))
            leaving.add(candidate)
            got += candidate.gpus_on(node)
            if got >= need:
                return

    take(order, strict)
    if got < need and who.cross:
        ids = {v.candidate.id for v in taken}
        so_far = leaving or gone
        left = [c for c in order if c.id not in ids]
        left.sort(key=lambda c: shares.guarantee(c.team) - (shares.gpus[c.team] - so_far.gpus[c.team] - c.gpus))
        take(left, who)
    if got < need:
        return None
    for victim in reversed(list(taken)):
        spare = victim.candidate.gpus_on(node)
        if got - spare >= need:
            taken.remove(victim)
            got -= spare
    return taken
