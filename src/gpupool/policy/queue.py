"""Stage 2 of a decision: the queue pass. The jobs in line, in queue order, each started on free
GPUs, else on GPUs that orphaned drains free, else given victims, else told why it waits.

Free GPUs and candidates only shrink during the pass (see `memo.Memo`): jobs alike (team,
type, size, layout, class, seniority) to one that could neither start nor preempt, or that a
strict queue blocked, cannot later in it either, so they wait at once, for the same reason; and
once no more waits are explained, the line goes by their kinds without giving their jobs at
all (`hopeless.Hopeless`).
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.model import Job, QueueMode, Reason, Wait
from gpupool.policy import messages
from gpupool.policy.decision import Decision, Fit
from gpupool.policy.drain import Orphans, hold_orphans
from gpupool.policy.hopeless import Hopeless, alike_of
from gpupool.policy.line import Kind
from gpupool.policy.preempt.explain import kept_from, reading
from gpupool.policy.preempt.notice import note_senior_at, preempt_for, searches

_LEARNED = {Fit.NO_FIT: True, Fit.NO_VICTIMS: True, Fit.NEVER_FITS: False, Fit.QUEUE_BLOCKED: False}
"""The fates an alike job meets too, and whether a job that meets it may be told when it becomes
senior (a job that can never fit, or waits behind a strict queue's block, is not)."""


def place_queue(decision: Decision, orphans: Orphans) -> None:
    """Take the jobs in line in queue order, and start, hold for or explain each."""
    config = decision.config
    line = decision.state.line
    before = set(decision.settled)
    hopeless: Hopeless[Fit] = Hopeless(config.seniority_after, decision.now, line, before)
    # Waits past the explained depth are not in the plan: past it, the line goes by the jobs of
    # kinds alike to hopeless ones. Every wait explained, none may be passed.
    passing = None if decision.depth is None else _passable(decision, hopeless)
    for kind, job in line.in_order(decision.class_value, config.order, decision.shares.share, before, passing):
        if job.id in decision.settled:
            continue
        # Alike jobs come in their place in line (nominated ones first), so a senior one
        # that found no victims leaves later senior ones none either (they may take fewer).
        alike = alike_of(kind, decision.is_senior(job))
        fit = hopeless.get(alike)
        if fit is None:
            fit = _place(decision, job, orphans)
            if not fit.waits:
                continue
            if fit in _LEARNED:
                becomes_senior = _LEARNED[fit] and config.preemption
                senior_at = hopeless.learn(job, alike, fit, becomes_senior=becomes_senior)
                if senior_at is not None:
                    decision.note_retry_at(senior_at)
        if fit in (Fit.NO_FIT, Fit.NO_VICTIMS):
            note_senior_at(decision, job)
        _wait(decision, job, fit)


def _passable(decision: Decision, hopeless: Hopeless[Fit]) -> Callable[[Kind], bool]:
    """Whether the queue pass may go by the jobs of a kind without trying them: alike to
    hopeless ones, once no wait is explained any more."""
    depth = decision.depth
    assert depth is not None

    def passable(kind: Kind) -> bool:
        return decision.explained >= depth and hopeless.passable(kind)

    return passable


def _place(decision: Decision, job: Job, orphans: Orphans) -> Fit:
    """Start `job` on free GPUs, else hold GPUs orphaned drains free, else preempt for it. An
    elastic job starts at the largest of its sizes that free GPUs hold; what it holds or takes
    from others is its smallest: more comes later, from GPUs nobody waits for."""
    memo = decision.memo
    shapes = memo.shapes_of(job)
    if decision.blocked and any(g in decision.blocked for s in shapes for g in s.groups):
        return Fit.QUEUE_BLOCKED
    if _start_on_free(decision, job):
        return Fit.STARTED
    job = job.at_size(job.smallest)
    shapes = memo.shapes_of(job)
    if orphans.draining and hold_orphans(decision, job, orphans):
        return Fit.HELD
    if not memo.fits_ever(shapes):
        return Fit.NEVER_FITS
    fit = preempt_for(decision, job, shapes)
    if fit.waits and decision.config.queue is QueueMode.STRICT:
        decision.blocked.update(g for s in shapes for g in s.groups)
    return fit


def _start_on_free(decision: Decision, job: Job) -> bool:
    """Start `job` on free GPUs at the largest of its sizes they hold, if one fits."""
    for size in reversed(job.sizes or (job.gpus,)):
        sized = job.at_size(size)
        slots = decision.memo.fit_slots(sized, decision.config.placement)
        if slots is not None:
            decision.shares.add(job.team, size)
            decision.start(sized, decision.free.allocate(slots))
            return True
    return False


def _wait(decision: Decision, job: Job, fit: Fit) -> None:
    """Record why the job waits; the words are only written when waits are explained, for
    the first `Config.explain_depth` jobs in line that wait."""
    decision.settled.add(job.id)
    if fit is not Fit.NEVER_FITS:
        decision.note_waiting(job)
    if decision.depth is None or decision.explained < decision.depth:
        decision.explained += 1
        decision.waits.append(Wait(job.id, fit.reason, _words(decision, job, fit.reason)))


def _words(decision: Decision, job: Job, reason: Reason) -> str:
    """The words of a wait, with the numbers a person needs."""
    if reason is Reason.QUEUE_BLOCKED:
        return messages.queue_blocked()
    if reason is Reason.NEVER_FITS:
        return messages.never_fits(job, decision.state.nodes)
    budgeted = decision.budgeted_of(job)
    memo, shares = decision.memo, decision.shares
    if reason is Reason.NO_VICTIMS:
        groups = {g for shape in memo.shapes_of(job) for g in shape.groups}
        tried = searches(decision, job, explaining=True)
        key = (*reading(job, budgeted.cls, tried, groups), shares.changes)
        kept = memo.explained.get(key)
        if kept is None:
            crowds = decision.candidates.crowds()
            kept = memo.explained[key] = kept_from(job, budgeted.cls, tried, crowds, groups, shares, decision.now)
        after = decision.config.seniority_after
        senior = (decision.now - job.waiting_since, after) if after is not None and decision.is_senior(job) else None
        text = messages.no_victims(job, budgeted.cls, kept, senior)
    else:
        first = memo.shapes_of(job)[0].groups
        free = memo.free_in.get((first, shares.changes))
        if free is None:
            # GPUs are taken and freed only as teams' GPUs change.
            free = memo.free_in[first, shares.changes] = decision.free.total(first)
        text = messages.no_fit(job, free)
    return f"{text}; {budgeted.note}" if budgeted.note else text
