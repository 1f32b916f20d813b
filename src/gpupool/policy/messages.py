"""The words of decisions: every Start, Preempt and Wait says why, with the numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpupool.model import Job, Node, Placement, PriorityClass, Reason
from gpupool.policy.budget import BudgetedClass
from gpupool.policy.preempt.candidates import Candidate
from gpupool.policy.preempt.explain import Kept
from gpupool.units import human_seconds, plural


def where(placement: Placement) -> str:
    """A placement in words: `n0[0,1], n1[0,1]`."""
    return ", ".join([f"{a.node}[{','.join(map(str, a.gpus))}]" for a in placement])


def who(job: Job, priority: str | None = None) -> str:
    """A job in words: `job 7 (team nlp, high)`."""
    return f"job {job.label} (team {job.team}, {priority or job.priority})"


def wanted(job: Job) -> str:
    """The GPUs a job waits for, in words: `2 GPUs`, or an elastic job's `4 to 16 GPUs`."""
    return f"{job.smallest} to {job.largest} GPUs" if job.elastic else plural(job.gpus, "GPU")


def started(job: Job, placement: Placement, budgeted: BudgetedClass) -> str:
    """Why a job started where it did."""
    text = f"started {who(job, budgeted.cls.name)} on free GPUs {where(placement)}"
    if job.elastic:
        text += f", {job.gpus} of its {job.smallest} to {job.largest} GPUs"
    return f"{text}; {budgeted.note}" if budgeted.note else text


def grew(job: Job, size: int, added: Placement) -> str:
    """Why an elastic job is given notice to grow, and onto what."""
    return (
        f"grows job {job.label} (team {job.team}) from {job.gpus} to {size} of its {job.smallest} to "
        f"{job.largest} GPUs, onto free GPUs {where(added)} that no job in line could use"
    )


def preempted(victim: Candidate, job: Job, budgeted: BudgetedClass, reason: Reason, now: float) -> str:
    """Why a victim is given notice (or, an elastic job, shrunk), for whom, and what it had saved."""
    running = victim.running
    if running.last_checkpoint_at is not None:
        checkpoint = f"last checkpoint {human_seconds(now - running.last_checkpoint_at)} ago"
    else:
        checkpoint = f"no checkpoint in {human_seconds(now - running.started_at)} of running"
    v = running.job
    if victim.keep:
        kept = sum(len(a.gpus) for a in victim.keep)
        done = f"shrank job {v.label} from {v.gpus} to {kept} GPUs"
    else:
        done = f"preempted job {v.label}"
    text = (
        f"{done} (team {v.team}, {victim.cls.name}, {checkpoint}) "
        f"for job {job.label} (team {job.team}, {budgeted.cls.name})"
    )
    if reason is Reason.RECLAIM:
        text += f": team {job.team} reclaims its guaranteed GPUs from team {v.team}, which is above its own"
    elif reason is Reason.SENIORITY:
        waited = human_seconds(now - job.waiting_since)
        text += f": job {job.label} has waited {waited} (policy.seniority_after), and was submitted before it"
    return f"{text}; {budgeted.note}" if budgeted.note else text


def awaiting_drain(victims: Sequence[str], deadline: float, now: float) -> str:
    """Why a job holds GPUs and waits: its victims drain."""
    return f"GPUs held while job(s) {', '.join(victims)} drain (deadline in {human_seconds(deadline - now)})"


def never_fits(job: Job, nodes: Sequence[Node] = ()) -> str:
    """Why no placement of `nodes` (of those the job may use: shared or its team's, of its
    GPU type) could ever hold the job (an elastic one at its smallest size)."""
    if job.elastic:
        return f"{never_fits(replace(job, gpus=job.smallest, sizes=()), nodes)} (its smallest size)"
    kind = f" of type {job.gpu_type}" if job.gpu_type else ""
    usable = [n for n in nodes if n.team in (None, job.team) and job.gpu_type in (None, n.gpu_type)]
    if job.gpus_per_node:
        members = job.gpus // job.gpus_per_node
        big_enough: dict[str, int] = {}
        for n in usable:
            if n.gpus >= job.gpus_per_node:
                big_enough[n.gpu_type] = big_enough.get(n.gpu_type, 0) + 1
        need = f"can never fit: {plural(job.gpus, 'GPU')}{kind} as {plural(members, 'member')} of {job.gpus_per_node}"
        if job.gpu_type is None and len(big_enough) > 1:
            # The members of a gang share one GPU type: nodes of several types do not add up.
            (first, count), *others = sorted(big_enough.items())
            rest = [f"{n} of type {t}" for t, n in others]
            each = ", ".join([f"{plural(count, 'such node')} of type {first}", *rest])
            return (
                f"{need} on separate nodes need {plural(members, 'node')} of one GPU type with at least "
                f"{plural(job.gpus_per_node, 'GPU')}; the pool has {each}"
            )
        return (
            f"{need} on separate nodes need {plural(members, 'node')} with at least "
            f"{plural(job.gpus_per_node, 'GPU')}{kind}; the pool has {sum(big_enough.values())}"
        )
    total = sum(n.gpus for n in usable)
    have = f"{plural(total, 'GPU')}{kind}"
    return f"can never fit: {plural(job.gpus, 'GPU')}{kind}, and the nodes it may use have {have} in all"


def no_fit(job: Job, free: int) -> str:
    """Why a job that may not preempt waits, with the GPUs `free` in the nodes it may use."""
    return f"waits for {wanted(job)} ({free} free in its nodes, not enough in one placement)"


def queue_blocked() -> str:
    """Why a job waits behind an earlier one in a strict queue."""
    return "waits behind an earlier job that does not fit (strict queue)"


def no_victims(job: Job, cls: PriorityClass, kept: Kept, senior: tuple[float, float] | None = None) -> str:
    """Why no job is given notice for `job`, with the rules that protect those it could take
    and the team rules that keep it from others (`kept`). `senior`: (how long it has waited,
    `seniority_after`) when it may take by seniority."""
    text = (
        f"waits for {wanted(job)}: no set of preemptible jobs below {cls.name} "
        f"(or above their team's guarantee) frees a placement now"
    )
    if senior is not None:
        waited, after = senior
        text += (
            f", nor of smaller jobs of {cls.name} or lower submitted after it, which it may take as it has "
            f"waited {human_seconds(waited)} (policy.seniority_after: {human_seconds(after)})"
        )
    if kept.refused:
        rules = [
            f"{rule}: {numbers} ({_jobs(ids, count)})" if numbers else f"{rule}: {_jobs(ids, count)}"
            for rule, numbers, ids, count in kept.refused
        ]
        text += f"; kept by team rules: {'; '.join(rules)}"
    if not kept.protected:
        return text
    parts = [f"{rule}: {_more(jobs, count)}" for rule, jobs, count in kept.protected]
    return f"{text}; protected: {'; '.join(parts)}"


def _more(shown: Sequence[str], count: int) -> str:
    """The jobs named, and how many more there are."""
    return ", ".join(shown) + (f" and {count - len(shown)} more" if count > len(shown) else "")


def _jobs(ids: Sequence[str], count: int) -> str:
    return f"job {_more(ids, count)}" if count == 1 else f"jobs {_more(ids, count)}"
