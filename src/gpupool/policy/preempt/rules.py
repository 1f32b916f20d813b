"""The victim rules: who may take whom, stated once.

A job that looks for victims (a `Preemptor`) may take a running job (a `Candidate`) by one of
four rules, tried in this order:

1. priority preemption: a lower class, within the scope the policy gives it (`pool`: anyone's;
   `team`: its own team's; `above_guarantee`: its own, and another team's while that team stays
   at or above its guarantee);
2. reclaim: its team is below its guarantee, and takes GPUs back from a team above its own
   (across that team's guarantee by one whole job at most, where it must);
3. fair share: a team with a lower weighted share takes from one with a higher share, while that
   team stays at or above the claimant's share after the move and at or above its guarantee;
4. seniority: a job that has waited `policy.seniority_after` takes smaller jobs of its class or
   lower submitted after it (its own team's, another team's only down to its guarantee).

`eligibility` gives the verdict: the rule that takes the candidate, or, asked why not, the rule
that keeps the job from it with its numbers (what a wait's explanation says). Every other
question about the rules (whether a group of candidates is open to a search at all, whether
seniority could take a protected job once its protection ends, whether a crowd's members differ
by their place in line) is answered from the same statements.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from gpupool.model import Job, JobId, PriorityClass, PriorityScope, Reason, RunningJob
from gpupool.policy.line import submit_key
from gpupool.policy.preempt.bounds import Group, Rank
from gpupool.policy.preempt.candidates import Candidate
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


NOBODY = Leaving()
"""No victim chosen yet (never changed)."""


@dataclass(frozen=True, slots=True)
class Taken:
    """A rule takes the candidate."""

    reason: Reason
    below: int = 0
    """GPUs its leaving takes its team below its guarantee (reclaim that crosses it), as
    counted when it was chosen: what the search scores, not a total to add up."""
    floored: bool = False
    """The rule takes it only while its team stays at or above its guarantee."""


@dataclass(frozen=True, slots=True)
class Refused:
    """The team rule that keeps a job from a candidate, in words, with its numbers."""

    rule: str
    numbers: str = ""


_SILENT = Refused("")
"""A refusal nothing need be said of: the rule would take the team's jobs, only not this one."""
_PRIORITY = Taken(Reason.PRIORITY)
_PRIORITY_FLOORED = Taken(Reason.PRIORITY, floored=True)
_RECLAIM = Taken(Reason.RECLAIM, floored=True)
_FAIR_SHARE = Taken(Reason.FAIR_SHARE, floored=True)
_SENIORITY = Taken(Reason.SENIORITY)
_SENIORITY_FLOORED = Taken(Reason.SENIORITY, floored=True)


def eligibility(
    c: Candidate, who: Preemptor, shares: TeamShares, leaving: Leaving, *, why: bool = False
) -> Taken | Refused | None:
    """The rule by which `who` may take `c`, the victims of `leaving` chosen before it (a
    `Taken`); else None, or, asked `why`, the team rule that keeps `who` from another team's
    `c` (a `Refused`): seniority's, then priority preemption's scope, then reclaim's, then fair
    share's, the first that refuses it (None: no team rule is to blame, or the class is too high).
    Each rule says what it refuses only when asked `why` (a search never is: no words are made)."""
    own = c.team == who.team
    floor = shares.guarantee(c.team)
    gone = leaving.gpus[c.team] + c.gpus
    left = shares.gpus[c.team] - gone
    by_priority = _priority(c, who, own, left >= floor, shares, why)
    if isinstance(by_priority, Taken) or c.cls.value > who.cls.value:
        return by_priority if isinstance(by_priority, Taken) else None
    by_reclaim = by_fair_share = by_seniority = None
    if not own and who.reclaim:
        by_reclaim = _reclaim(c, left, floor, leaving, shares, cross=who.cross, why=why)
        if isinstance(by_reclaim, Taken):
            return by_reclaim
    if not own and who.fair_share:
        by_fair_share = _fair_share(c, who, left >= floor, shares.share(c.team, -gone), shares, why)
        if isinstance(by_fair_share, Taken):
            return by_fair_share
    if passed(c, who):
        if own:
            return _SENIORITY
        if left >= floor:
            return _SENIORITY_FLOORED
        by_seniority = _below_floor(c, shares) if why else None
    refused = by_seniority or by_priority or by_reclaim or by_fair_share
    return None if refused is _SILENT else refused


def _priority(
    c: Candidate, who: Preemptor, own: bool, stays: bool, shares: TeamShares, why: bool
) -> Taken | Refused | None:
    """Priority preemption: a lower class, within the scope the policy gives it (`stays`: the
    candidate's team stays at or above its guarantee without it). None: it does not apply."""
    if not (c.cls.value < who.cls.value and who.cls.may_preempt):
        return None
    if own or who.scope is PriorityScope.POOL:
        return _PRIORITY
    if who.scope is PriorityScope.ABOVE_GUARANTEE:
        if stays:
            return _PRIORITY_FLOORED
        return _below_floor(c, shares) if why else None
    if not why:
        return None
    return Refused(f"priority preemption takes only team {who.team}'s own jobs (policy.priority_preemption: team)")


def _reclaim(
    c: Candidate, left: int, floor: int, leaving: Leaving, shares: TeamShares, *, cross: bool, why: bool
) -> Taken | Refused | None:
    """Reclaim of another team's job, leaving its team `left` GPUs: down to its guarantee, or
    across it by one whole job at most where the search may cross (the team stays above its
    guarantee without its largest victim, whatever order the victims were chosen in)."""
    if left >= floor:
        return _RECLAIM
    if cross and left + max(leaving.largest[c.team], c.gpus) > floor:
        return Taken(Reason.RECLAIM, floor - left)
    if not why:
        return None
    return _SILENT if shares.gpus[c.team] > floor else _below_floor(c, shares)


def _fair_share(
    c: Candidate, who: Preemptor, stays: bool, after: float, shares: TeamShares, why: bool
) -> Taken | Refused | None:
    """Fair share from another team, which stays at or above its guarantee (`stays`) with a
    share `after` at or above the claimant's; never a job that could take the GPUs back by
    seniority (`takes_back`)."""
    if stays and not takes_back(c, who) and after >= who.final_share:
        return _FAIR_SHARE
    if not why:
        return None
    if not stays:
        return _below_floor(c, shares)
    if takes_back(c, who):
        return Refused(
            "seniority", "larger and submitted before it: it could take the GPUs back, so fair share leaves it"
        )
    return Refused(
        "fair share",
        f"team {c.team} would have a share of {after:g} after, below team {who.team}'s "
        f"{who.final_share:g} with this job",
    )


def _below_floor(c: Candidate, shares: TeamShares) -> Refused:
    held, floor = shares.gpus[c.team], shares.guarantee(c.team)
    return Refused("guarantee floor", f"team {c.team} holds {held} GPUs, {floor} guaranteed")


def refusal(c: Candidate, searches: Sequence[Preemptor], shares: TeamShares) -> Refused | None:
    """The team rule that keeps the searches of a job from taking the unprotected candidate
    `c`, as the last search's `eligibility` says it (None: one of them may take `c`, or no team
    rule is to blame)."""
    if any(eligibility(c, who, shares, NOBODY) is not None for who in searches):
        return None
    found = eligibility(c, searches[-1], shares, NOBODY, why=True)
    return found if isinstance(found, Refused) else None


def takes_to_floor(c: Candidate, who: Preemptor, shares: TeamShares) -> bool:
    """Whether `who` may take `c` alone, only down to its team's guarantee."""
    found = eligibility(c, who, shares, NOBODY)
    return isinstance(found, Taken) and found.floored


def _may_pass(c: Candidate, who: Preemptor) -> bool:
    """`passed` but for the place in line."""
    return who.senior and who.place is not None and c.cls.value <= who.cls.value and c.gpus < who.gpus


def passed(c: Candidate, who: Preemptor) -> bool:
    """Whether a senior `who` may take `c` by seniority, as backfill could have passed it with
    `c`: smaller, of its class or lower, and submitted after it (a job as large started in its
    turn, by queue order, not in a hole `who` could not use)."""
    place = who.place
    return place is not None and _may_pass(c, who) and submit_key(c.running.job) > place


def _may_take_back(c: Candidate, who: Preemptor) -> bool:
    """`takes_back` but for the place in line."""
    return who.place is not None and c.cls.value >= who.cls.value and c.gpus > who.gpus


def takes_back(c: Candidate, who: Preemptor) -> bool:
    """Whether `c`, requeued, could take `who`'s GPUs back by seniority: of `who`'s class or
    higher, larger, and submitted before it. Fair share leaves it alone (else the two rules
    evict each other in turn)."""
    place = who.place
    return place is not None and _may_take_back(c, who) and submit_key(c.running.job) < place


def by_place(c: Candidate, searches: Sequence[Preemptor]) -> bool:
    """Whether a search could tell `c` from candidates alike to it but for their place in line
    (`passed`, `takes_back`)."""
    return any(_may_pass(c, who) or _may_take_back(c, who) for who in searches)


def open_to_seniority(c: Candidate, who: Preemptor, shares: TeamShares) -> bool:
    """Whether seniority could take `c` alone once its protection ends."""
    return passed(c, who) and (c.team == who.team or shares.gpus[c.team] - c.gpus >= shares.guarantee(c.team))


def could_take(
    c: Candidate, team: str, cls: PriorityClass, by_team: bool, senior: Preemptor | None, shares: TeamShares
) -> bool:
    """Whether a job of `team` and `cls` could take `c` but for `c`'s protection: a lower
    class, or its own class where a team rule (`by_team`) or seniority (`senior`) reads it."""
    if c.cls.value < cls.value:
        return True
    return c.cls.value == cls.value and (
        (by_team and c.team != team) or (senior is not None and open_to_seniority(c, senior, shares))
    )


def admits(group: Group, who: Preemptor, shares: TeamShares) -> bool:
    """Whether some rule could take a job of `group` (team, class value) for `who`: what
    `eligibility` says of the group's most favourable member (one GPU, submitted last), no
    victim chosen yet. Every member a search could take, whatever it chose before, is one
    such a member's verdict admits (a search's victims only lower what a rule leaves a team)."""
    return eligibility(_most_favourable(*group), who, shares, NOBODY) is not None


@lru_cache(maxsize=4096)
def _most_favourable(team: str, value: int) -> Candidate:
    job = Job("", team, "", 1, math.inf)
    return Candidate(RunningJob(job, (), math.inf), PriorityClass("", value, may_preempt=False, preemptible=True), ())


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
