"""Stage 3 of a decision: elastic jobs grow into GPUs nobody waits for.

After the queue pass, the GPUs still free are those no job in line could start on. An elastic
job below its largest size grows into them once it has run `ElasticPolicy.min_time_at_size` at
its size: it keeps its GPUs and adds free ones (on its own node; whole members on other nodes
of its GPU type, for a gang), to the largest of its sizes they make. It is given notice to do
so: it saves, leaves, and starts again at once on them all.

No job grows while a job of its class or higher waits for GPUs (the free ones could be part of
that job's placement once more free up, and growing would only be undone), nor while a team
under its guarantee waits, unless that team is its own and the only one; nor if it was given
notice in the same decision. The higher classes grow first, then the
teams of the lowest weighted share, then the jobs submitted first.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpupool.model import Allocation, Grow, Job, Placement, RunningJob
from gpupool.policy import messages
from gpupool.policy.decision import Decision
from gpupool.policy.free import FreeGpus


def grow_elastic(decision: Decision) -> None:
    """Give notice to grow to every elastic job that free GPUs let grow, in order."""
    state = decision.state
    if not state.growable or not any(decision.free.free):
        return
    noticed = {p.victim for p in decision.preemptions}  # shrunk or evicted by this decision
    for running in sorted(state.growable.values(), key=lambda r: _order(decision, r)):
        if running.job.id not in noticed:
            _grow(decision, running)


def _order(decision: Decision, running: RunningJob) -> tuple[int, float, float, str]:
    """Higher class first, then the team of the lowest weighted share, then first submitted."""
    job = running.job
    value = decision.config.priority_class(running.priority or job.priority).value
    return (-value, decision.shares.share(job.team), job.submit_time, job.id)


def _grow(decision: Decision, running: RunningJob) -> None:
    """Grow `running` into free GPUs if nothing keeps it from them."""
    job = running.job
    cls = decision.config.priority_class(running.priority or job.priority)
    if decision.waiting_at is not None and decision.waiting_at >= cls.value:
        return
    if decision.waiting_under - {job.team}:
        return  # another team under its guarantee waits
    if decision.budgeted_as(job.team, cls.name).demoted_from is not None:
        return  # its team is over its budget for the class it runs at
    may_grow_at = running.started_at + decision.config.elastic.min_time_at_size
    if decision.now < may_grow_at:
        decision.note_retry_at(may_grow_at)
        return
    for size in reversed(job.sizes):
        if size <= job.gpus:
            return
        added = _added(decision.free, running, size - job.gpus)
        if added is not None:
            break
    else:
        return
    placement = _merged(running.placement, added)
    for allocation in added:
        decision.free.take(decision.free.node_index(allocation.node), allocation.gpus)
    decision.shares.add(job.team, size - job.gpus)
    deadline = decision.now + decision.config.priority_class(job.priority).grace_period  # as a notice's
    decision.grows.append(Grow(job.id, deadline, placement, messages.grew(job, size, added)))


def _added(free: FreeGpus, running: RunningJob, more: int) -> Placement | None:
    """`more` free GPUs that `running`'s job can grow into, or None if there are not as many:
    on the node it runs on; for a gang, whole members on nodes of its GPU type (shared, or its
    team's) that it is not on, those with the fewest free GPUs first."""
    job = running.job
    if job.gpus_per_node is None:
        return _on_its_nodes(free, running, more)
    members = []
    for i in _nodes_for_members(free, running, job):
        members.append(Allocation(free.nodes[i].name, free.free[i][: job.gpus_per_node]))
        if len(members) * job.gpus_per_node == more:
            return tuple(members)
    return None


def _on_its_nodes(free: FreeGpus, running: RunningJob, more: int) -> Placement | None:
    """`more` free GPUs on the nodes `running` holds, in its placement's order, or None."""
    added = []
    for allocation in running.placement:
        here = free.free[free.node_index(allocation.node)][:more]
        if here:
            added.append(Allocation(allocation.node, here))
            more -= len(here)
        if not more:
            return tuple(added)
    return None


def _nodes_for_members(free: FreeGpus, running: RunningJob, job: Job) -> Iterator[int]:
    """Nodes a new member of the gang fits on (free GPUs for it, of its GPU type, shared or its
    team's, not one it is on), those with the fewest free GPUs first."""
    on = {free.node_index(a.node) for a in running.placement}
    gpu_type = free.group[next(iter(on))][0]
    fits = [
        (len(gpus), i)
        for i, gpus in enumerate(free.free)
        if i not in on
        and len(gpus) >= (job.gpus_per_node or 0)
        and free.group[i][0] == gpu_type
        and free.group[i][1] in (None, job.team)
    ]
    return (i for _, i in sorted(fits))


def _merged(placement: Placement, added: Placement) -> Placement:
    """`placement` with the GPUs of `added`, one allocation per node, in placement order."""
    gpus = {a.node: list(a.gpus) for a in placement}
    for a in added:
        gpus.setdefault(a.node, []).extend(a.gpus)
    return tuple(Allocation(node, tuple(sorted(held))) for node, held in gpus.items())
