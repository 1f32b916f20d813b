"""Why nobody was given notice: the rules that protect the jobs a waiting job could not take,
with their numbers (what a `no_victims` wait says).

Every rule reads a candidate by its team, class, size and protection, and seniority by its
place in line too. So the candidates are read by crowds (`candidates.Crowd`: alike in all of
these but the place in line), each crowd once, and member by member only where a search with
seniority could tell its members apart: what a wait costs does not grow with the pool, and the
words are those a reading of every candidate gives (a property test reads every crowd member
by member and compares).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpupool.model import Job, PriorityClass
from gpupool.policy.free import Group
from gpupool.policy.preempt.candidates import Candidate, Crowd, ProtectionRule
from gpupool.policy.preempt.rules import Preemptor, by_place, could_take, refusal, takes_to_floor
from gpupool.policy.share import TeamShares
from gpupool.units import human_seconds

SHOWN = 3
"""Jobs named per rule; the others are counted."""


@dataclass(frozen=True, slots=True)
class Kept:
    """What keeps a waiting job from victims: per protection rule (its words), the first jobs it
    protects (their words: earliest end first, then by id) and how many, rules in the order of
    their first job; per team rule and its numbers, the first ids it keeps out and how many,
    sorted by (rule, numbers)."""

    protected: tuple[tuple[str, tuple[str, ...], int], ...] = ()
    refused: tuple[tuple[str, str, tuple[str, ...], int], ...] = ()


@dataclass(slots=True)
class _Run:
    """Some jobs one rule names: the first ids (at most SHOWN, in order) and how many."""

    first: list[str]
    count: int


@dataclass(slots=True)
class _Reading:
    """What one explanation has found so far."""

    protected: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(when it ends, id, rule's words, the job's words) of protected jobs named one by one."""
    lasting: dict[str, list[tuple[_Run, str]]] = field(default_factory=dict)
    """Per rule's words, runs of jobs protected for good (ended never: by id), with the words
    after `job <id>` that each of them gets."""
    refused: dict[tuple[str, str], list[_Run]] = field(default_factory=dict)
    floored: dict[str, list[tuple[_Run, int]]] = field(default_factory=dict)
    """Per team, runs of jobs a search may take only down to the team's guarantee, with their GPUs each."""


def reading(job: Job, cls: PriorityClass, searches: Sequence[Preemptor], groups: Iterable[Group]) -> tuple[object, ...]:
    """What `kept_from` reads of a waiting job, for a memo within one state of the decision:
    its team, class, usable nodes and rules; its size and place in line only where a search
    reads them (seniority, and fair share's `takes_back`, when the policy has seniority)."""
    rules = tuple(
        (
            who.scope,
            who.reclaim,
            who.own_first,
            who.cross,
            who.fair_share,
            who.final_share if who.fair_share else None,
            who.senior,
            (who.gpus, who.place) if who.place is not None and (who.senior or who.fair_share) else None,
        )
        for who in searches
    )
    return (job.team, cls.value, cls.may_preempt, rules, frozenset(groups))


def kept_from(
    job: Job,
    cls: PriorityClass,
    searches: Sequence[Preemptor],
    crowds: Iterable[Crowd],
    groups: Iterable[Group],
    shares: TeamShares,
    now: float,
    *,
    one_by_one: bool = False,
) -> Kept:
    """The running jobs on the nodes of `groups` (those `job` may use) that its class could
    preempt but a rule protects, and those a team rule keeps its `searches` from: what a
    person needs to know of why nobody is given notice. `one_by_one` reads every crowd member
    by member (what the crowds must agree with)."""
    # Reclaim and fair share may take other teams' jobs of the job's own class too, and
    # seniority the smaller later ones of any team.
    by_team = any(who.by_team_rule for who in searches)
    senior = next((who for who in searches if who.senior), None)
    strict = [replace(who, cross=False) for who in searches]
    usable = set(groups)
    found = _Reading()
    for crowd in crowds:
        if usable.isdisjoint(crowd.groups) or crowd.count() == 0:
            continue
        sample = crowd.sample
        rule = sample.protection.rule if sample.protection is not None else None
        if rule is ProtectionRule.MIN_RUNTIME or one_by_one or by_place(sample, searches):
            for c in crowd.members():
                _read_one(c, job, cls, searches, strict, by_team, senior, shares, now, found)
            continue
        if rule is not None:
            if could_take(sample, job.team, cls, by_team, senior, shares):
                words, detail = _protection_words(sample, now)
                found.lasting.setdefault(words, []).append((_Run(crowd.first(SHOWN), crowd.count()), detail))
            continue
        if not searches:
            continue
        refused = refusal(sample, searches, shares)
        if refused is not None:
            found.refused.setdefault((refused.rule, refused.numbers), []).append(
                _Run(crowd.first(SHOWN), crowd.count())
            )
        elif any(takes_to_floor(sample, who, shares) for who in strict):
            found.floored.setdefault(sample.team, []).append((_Run(crowd.first(SHOWN), crowd.count()), sample.gpus))
    # Each of a team's jobs may be taken alone, but not all that would be needed together.
    for team, runs in found.floored.items():
        held, floor = shares.gpus[team], shares.guarantee(team)
        if sum(run.count * gpus for run, gpus in runs) > held - floor:
            numbers = f"team {team} holds {held} GPUs, {floor} guaranteed: {max(0, held - floor)} may be taken"
            found.refused.setdefault(("guarantee floor", numbers), []).extend(run for run, _ in runs)
    return _summary(found)


def _read_one(
    c: Candidate,
    job: Job,
    cls: PriorityClass,
    searches: Sequence[Preemptor],
    strict: Sequence[Preemptor],
    by_team: bool,
    senior: Preemptor | None,
    shares: TeamShares,
    now: float,
    found: _Reading,
) -> None:
    """Read one candidate as its crowd would be read, by its own place in line."""
    if c.protection is not None:
        if could_take(c, job.team, cls, by_team, senior, shares):
            words, detail = _protection_words(c, now)
            if c.protection.until is not None:
                found.protected.append((c.protection.until, c.label, words, f"job {c.label}{detail}"))
            else:
                found.lasting.setdefault(words, []).append((_Run([c.label], 1), detail))
        return
    if not searches:
        return
    refused = refusal(c, searches, shares)
    if refused is not None:
        found.refused.setdefault((refused.rule, refused.numbers), []).append(_Run([c.label], 1))
    elif any(takes_to_floor(c, who, shares) for who in strict):
        found.floored.setdefault(c.team, []).append((_Run([c.label], 1), c.gpus))


def _protection_words(c: Candidate, now: float) -> tuple[str, str]:
    """The words of the rule that protects `c`, and what a job it protects gets after `job <id>`."""
    guard = c.protection
    assert guard is not None
    if guard.rule is ProtectionRule.MIN_RUNTIME and guard.until is not None:
        rule = f"inside their minimum runtime ({c.cls.name}: {human_seconds(c.cls.min_runtime)})"
        return rule, f" for {human_seconds(guard.until - now)} more"
    if guard.rule is ProtectionRule.PREEMPTION_CAP:
        return "at their preemption cap", f" {guard.text.removeprefix('at its preemption cap ')}"
    return guard.text, ""


def _summary(found: _Reading) -> Kept:
    """The rules and the first jobs each names, in the order the words give them."""
    entries: dict[str, list[tuple[float, str, str]]] = {}
    counts: dict[str, int] = {}
    for until, job_id, words, detail in found.protected:
        entries.setdefault(words, []).append((until, job_id, detail))
        counts[words] = counts.get(words, 0) + 1
    for words, runs in found.lasting.items():
        for run, detail in runs:
            entries.setdefault(words, []).extend((math.inf, j, f"job {j}{detail}") for j in run.first)
            counts[words] = counts.get(words, 0) + run.count
    firsts = {words: heapq.nsmallest(SHOWN, listed) for words, listed in entries.items()}
    protected = tuple(
        (words, tuple(detail for _, _, detail in first), counts[words])
        for words, first in sorted(firsts.items(), key=lambda item: item[1][0][:2])
    )
    refused = tuple(
        (
            rule,
            numbers,
            tuple(heapq.nsmallest(SHOWN, (j for run in runs for j in run.first))),
            sum(r.count for r in runs),
        )
        for (rule, numbers), runs in sorted(found.refused.items())
    )
    return Kept(protected, refused)
