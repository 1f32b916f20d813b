"""Why nobody was given notice: the rules that protect the jobs a waiting job could not take,
with their numbers (what a `no_victims` wait says)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from gpupool.model import Job, JobId, PriorityClass, PriorityScope, Reason
from gpupool.policy.preempt import Candidate, Candidates
from gpupool.policy.share import TeamShares
from gpupool.policy.victims import Leaving, Preemptor, eligibility, open_to_seniority, passed, takes_back


def kept_from(
    job: Job,
    cls: PriorityClass,
    searches: Sequence[Preemptor],
    candidates: Candidates,
    nodes: Iterable[int],
    shares: TeamShares,
) -> tuple[list[Candidate], list[tuple[str, str, JobId]]]:
    """Running jobs on `nodes` (those `job` may use) that its class could preempt but a rule
    protects, and those a team rule keeps its `searches` from, as (rule, numbers, job): what a
    person needs to know of why nobody is given notice."""
    # Reclaim and fair share may take other teams' jobs of the job's own class too, and
    # seniority the smaller later ones of any team.
    by_team = any(who.by_team_rule for who in searches)
    senior = next((who for who in searches if who.senior), None)
    protected: dict[JobId, Candidate] = {}
    refused: dict[JobId, tuple[str, str, JobId]] = {}
    floored: dict[str, dict[JobId, int]] = {}
    for i in nodes:
        for candidate in candidates.at(i):
            if candidate.id in candidates.chosen:
                continue
            if candidate.protection is not None:
                equal = candidate.cls.value == cls.value and (
                    (by_team and candidate.team != job.team)
                    or (senior is not None and open_to_seniority(candidate, senior, shares))
                )
                if candidate.cls.value < cls.value or equal:
                    protected.setdefault(candidate.id, candidate)
            elif searches and (rule := refusal(candidate, searches, shares)) is not None:
                refused.setdefault(candidate.id, (*rule, candidate.id))
            elif searches and any(takes_to_floor(candidate, who, shares) for who in searches):
                floored.setdefault(candidate.team, {})[candidate.id] = candidate.gpus
    # Each of a team's jobs may be taken alone, but not all that would be needed together.
    for team, jobs in floored.items():
        held, floor = shares.gpus[team], shares.guarantee(team)
        if sum(jobs.values()) > held - floor:
            numbers = f"team {team} holds {held} GPUs, {floor} guaranteed: {max(0, held - floor)} may be taken"
            refused.update((j, ("guarantee floor", numbers, j)) for j in jobs)
    return list(protected.values()), list(refused.values())


def takes_to_floor(candidate: Candidate, who: Preemptor, shares: TeamShares) -> bool:
    """Whether `who` may take `candidate` only down to its team's guarantee."""
    found = eligibility(candidate, replace(who, cross=False), shares, Leaving())
    if found is None:
        return False
    other = candidate.team != who.team
    scoped = who.scope is PriorityScope.ABOVE_GUARANTEE and other
    return found[0] in (Reason.RECLAIM, Reason.FAIR_SHARE) or (found[0] is Reason.SENIORITY and other) or scoped


def refusal(c: Candidate, searches: Sequence[Preemptor], shares: TeamShares) -> tuple[str, str] | None:
    """The team rule that keeps the searches of a job (the last one is the widest) from taking
    the unprotected candidate `c`, as (rule, numbers); None when no team rule does (one of
    them may take `c`, or `c`'s class is too high)."""
    who = searches[-1]
    if c.team == who.team or c.cls.value > who.cls.value:
        return None
    if any(eligibility(c, search, shares, Leaving()) is not None for search in searches):
        return None
    held, floor = shares.gpus[c.team], shares.guarantee(c.team)
    below_floor = ("guarantee floor", f"team {c.team} holds {held} GPUs, {floor} guaranteed")
    if passed(c, who):
        return below_floor
    if c.cls.value < who.cls.value and who.cls.may_preempt:
        if who.scope is PriorityScope.TEAM:
            return (f"priority preemption takes only team {who.team}'s own jobs (policy.priority_preemption: team)", "")
        if who.scope is PriorityScope.ABOVE_GUARANTEE and held - c.gpus < floor:
            return below_floor
        return None
    if who.reclaim and held > floor:
        return None
    if who.fair_share:
        if held - c.gpus < floor:
            return below_floor
        if takes_back(c, who):
            return ("seniority", "larger and submitted before it: it could take the GPUs back, so fair share leaves it")
        after = shares.share(c.team, -c.gpus)
        if after < who.final_share:
            return (
                "fair share",
                f"team {c.team} would have a share of {after:g} after, below team {who.team}'s "
                f"{who.final_share:g} with this job",
            )
        return None
    return below_floor if who.reclaim else None
