"""Preemption within the queue pass: for a job that does not fit, the searches its policy
allows, the notices to the victims the first of them finds, or when to decide again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpupool.model import Allocation, FairShare, Job, Preempt, Reason
from gpupool.policy import messages
from gpupool.policy.decision import Decision, Fit
from gpupool.policy.free import Shape, Slot
from gpupool.policy.line import submit_key
from gpupool.policy.preempt import search
from gpupool.policy.preempt.rules import Preemptor, open_to_seniority
from gpupool.policy.preempt.search import Victim


def preempt_for(decision: Decision, job: Job, shapes: tuple[Shape, ...]) -> Fit:
    """Give notice to the cheapest sufficient victims; if there are none, say why not.

    The searches, in order, stop at the first that finds a set: reclaim (with priority and
    fair share), which takes a whole job across a victim team's guarantee only where no
    node can be freed without it (a guarantee is a promise: a job larger than a team's
    surplus must not keep a team below its own out forever); then priority and fair-share
    preemption alone, when reclaim found a set that would take the claimant's team over its
    own guarantee.
    """
    tried = searches(decision, job)
    if not tried:
        return Fit.NO_FIT
    memo = decision.memo
    nothing_for_reclaim = False
    for who in tried:
        if nothing_for_reclaim and not who.reclaim:
            # Reclaim may take every victim priority and fair share may: if it found no
            # set at all (not merely one that broke the claimant's guarantee), neither will they.
            continue
        found_none = True
        for shape in shapes:
            key = (shape, *who.memo_key())
            if key in memo.no_victims:
                found_none = False
                continue
            found = search.find_victims(who, shape, decision.candidates)
            if found is None or not _within_guarantee(decision, job, found[1]):
                found_none = found_none and found is None
                memo.no_victims.add(key)
                continue
            slots, victims = found
            _give_notice(decision, job, slots, victims)
            return Fit.HELD
        nothing_for_reclaim = nothing_for_reclaim or (who.reclaim and found_none)
    _note_retry(decision, tried[0], shapes)
    return Fit.NO_VICTIMS


def searches(decision: Decision, job: Job, *, explaining: bool = False) -> list[Preemptor]:
    """The victim searches `job` may make, in the order to try them (none: it may not
    preempt). Fair share is left out when no team could give to it, unless `explaining`."""
    config, shares = decision.config, decision.shares
    if not config.preemption:
        return []
    cls = decision.budgeted_of(job).cls
    final_share = shares.share(job.team, job.gpus)
    fair = config.fair_share is FairShare.PREEMPT and (explaining or shares.above(final_share, job.team))
    senior = decision.is_senior(job)
    plain = Preemptor(
        job.id,
        job.team,
        cls,
        job.gpus,
        config.priority_preemption,
        fair_share=fair,
        final_share=final_share,
        place=submit_key(job) if config.seniority_after is not None else None,
        senior=senior,
    )
    found = [plain] if cls.may_preempt or fair or senior else []
    if config.reclaim and shares.gpus[job.team] < shares.guarantee(job.team):
        over = shares.gpus[job.team] + job.gpus - shares.guarantee(job.team)
        own = decision.candidates.team_gpus_preemptible(job.team, cls.value) if over > 0 and cls.may_preempt else 0
        if over <= own:
            # One search, across guarantees where it must: a node freed without taking a
            # team below its guarantee always scores better than one that needs it.
            found = [replace(plain, reclaim=True, own_first=over > 0, cross=True), *found]
    return found


def note_senior_at(decision: Decision, job: Job) -> None:
    """Decide again when a waiting job becomes senior: nothing else may happen by then."""
    after = decision.config.seniority_after
    if after is not None and job.gpus > 1 and decision.config.preemption and job.waiting_since + after > decision.now:
        decision.note_retry_at(job.waiting_since + after)


def _within_guarantee(decision: Decision, job: Job, victims: Sequence[Victim]) -> bool:
    """Reclaim only while the claimant's team stays within its guarantee once its own
    victims in the set have left."""
    if not any(v.reason is Reason.RECLAIM for v in victims):
        return True
    shares = decision.shares
    own = sum(v.candidate.gpus for v in victims if v.candidate.team == job.team)
    return shares.gpus[job.team] - own + job.gpus <= shares.guarantee(job.team)


def _give_notice(decision: Decision, job: Job, slots: list[Slot], victims: list[Victim]) -> None:
    """Give notice to `victims` and hold their GPUs (and free ones of `slots`) for `job`."""
    free, candidates = decision.free, decision.candidates
    placement = []
    for i, want in slots:
        mine = list(free.free[i][:want])
        if mine:
            free.take(i, mine)
        for victim in victims:
            for node, gpus in victim.candidate.slots:
                if node == i and len(mine) < want:
                    mine.extend(gpus[: want - len(mine)])
        placement.append((i, tuple(sorted(mine))))
    deadlines = []
    budgeted = decision.budgeted_of(job)
    for victim in victims:
        candidate = victim.candidate
        candidates.choose(candidate)
        decision.shares.remove(candidate.team, candidate.gpus)
        # The grace is what the job needs to save, so its own class's, whatever its budget.
        deadline = decision.now + decision.config.priority_class(candidate.running.job.priority).grace_period
        deadlines.append(deadline)
        message = messages.preempted(candidate, job, budgeted, victim.reason, decision.now)
        decision.preemptions.append(Preempt(candidate.id, job.id, deadline, victim.reason, message, candidate.keep))
    held = tuple(Allocation(free.nodes[i].name, gpus) for i, gpus in placement)
    decision.shares.add(job.team, job.gpus)
    decision.hold(job, held, [v.candidate.label for v in victims], max(deadlines))


def _note_retry(decision: Decision, who: Preemptor, shapes: tuple[Shape, ...]) -> None:
    """When the first minimum runtime that kept a victim from `who` ends."""
    limit = who.cls.value
    by_team = who.by_team_rule
    ends = [until for value, until in decision.expiring.items() if value < limit or (by_team and value == limit)]
    if who.senior:
        nodes = decision.memo.nodes_of(shapes)
        ends += [
            until
            for c in decision.candidates.with_min_runtime(nodes)
            if c.protection is not None
            and (until := c.protection.until) is not None
            and open_to_seniority(c, who, decision.shares)
        ]
    if ends:
        decision.note_retry_at(min(ends))
