"""The reference the core's kept state is measured against: the same decision, with the queue
order as a sort of every pending job and the preemption candidates built from every running
job, as written out plainly. Every test of the core decides both ways (`decide`) and the plans
must be equal; product code never takes this path.

The line and the running index are the state's two parts that decide by what they keep (the
pending jobs per kind, the running jobs per node and group in arrays); their references here
read the jobs alone. The free GPUs are checked against every GPU outside the placements.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from gpupool.model import (
    Config,
    Job,
    JobId,
    Node,
    Plan,
    PriorityClass,
    QueueOrder,
    RunningJob,
    Snapshot,
    placement_without,
)
from gpupool.policy import PoolState
from gpupool.policy import decide as decide_on
from gpupool.policy.free import FreeGpus
from gpupool.policy.free import Group as NodeGroup
from gpupool.policy.line import Kind, Line, kind_of, submit_key
from gpupool.policy.preempt.bounds import Group, GroupsByNode
from gpupool.policy.preempt.candidates import (
    ALL_SHORTCUTS,
    Candidate,
    Candidates,
    Crowd,
    ListedCrowd,
    ProtectionRule,
    Shortcuts,
    kept_of,
    lost_work,
    protection,
    shrink_of,
)
from gpupool.policy.running import Key, RunningIndex
from gpupool.policy.share import TeamShares


def decide(snapshot: Snapshot, config: Config, now: float, shortcuts: Shortcuts = ALL_SHORTCUTS) -> Plan:
    """The plan for `snapshot`, decided on the state the drivers keep and on the reference;
    an AssertionError if they differ."""
    plan = decide_on(PoolState.of(snapshot), config, now, shortcuts)
    assert decide_on(reference_state(snapshot), config, now, shortcuts) == plan, "the kept state changed the plan"
    return plan


def reference_state(snapshot: Snapshot) -> PoolState:
    """The state of `snapshot` with the reference line and running index, its free GPUs, GPUs
    per team and drains checked against what the jobs alone give."""
    state = PoolState(snapshot.nodes, line=SortedLine(), index=ScratchIndex)
    state.fill(snapshot)
    assert dict(state.free) == derived_free(snapshot), "the free GPUs are not those outside the placements"
    teams: Counter[str] = Counter()
    for r in snapshot.running:
        if r.notice is None:
            teams[r.job.team] += r.job.gpus
        else:  # a shrink's kept GPUs are still its team's, and those a growth holds
            teams[r.job.team] += sum(len(a.gpus) for a in r.notice.keep)
    assert dict(state.team_gpus) == dict(+teams), "the GPUs per team are not those the jobs hold and keep"
    assert state.draining == {r.job.id: r for r in snapshot.running if r.notice is not None}, "other drains"
    return state


def derived_free(snapshot: Snapshot) -> dict[str, tuple[int, ...]]:
    """Every GPU of every node that no running job's placement holds, nor a growth's notice."""
    held = {(a.node, g) for r in snapshot.running for a in r.placement for g in a.gpus}
    held |= {(a.node, g) for r in snapshot.running if r.notice is not None for a in r.notice.keep for g in a.gpus}
    return {n.name: tuple(g for g in range(n.gpus) if (n.name, g) not in held) for n in snapshot.nodes}


# --- the queue order, as a sort ------------------------------------------------------------


def queue_order(pending: Sequence[tuple[int, Job]], order: QueueOrder, share: Callable[[str], float]) -> Iterator[Job]:
    """Pending jobs, given as (class value, job), best first: by class value, nominated jobs
    first within a class, then the teams' jobs by weighted round-robin (the lowest share next,
    read again when the team's turn comes), each team's in submit order. `FIFO`: submit order."""
    if order is QueueOrder.FIFO:
        yield from sorted((job for _, job in pending), key=submit_key)
        return
    by_class: dict[int, dict[str, list[Job]]] = defaultdict(lambda: defaultdict(list))
    nominated: dict[int, list[Job]] = defaultdict(list)
    for value, job in pending:
        (nominated[value] if job.nominated else by_class[value][job.team]).append(job)
    for value in sorted(by_class.keys() | nominated.keys(), reverse=True):
        yield from sorted(nominated[value], key=submit_key)
        queues = {team: deque(sorted(jobs, key=submit_key)) for team, jobs in by_class[value].items()}
        heap = [(share(team), *submit_key(q[0]), team) for team, q in queues.items()]
        heapq.heapify(heap)
        while heap:
            stale_share, _, _, _, team = heapq.heappop(heap)
            queue = queues[team]
            current = share(team)
            if current > stale_share:
                heapq.heappush(heap, (current, *submit_key(queue[0]), team))
                continue
            yield queue.popleft()
            if queue:
                heapq.heappush(heap, (share(team), *submit_key(queue[0]), team))


class SortedLine(Line):
    """The line, given in queue order by a sort of every pending job (no kind is passed: a
    hopeless job is given, and waits)."""

    def in_order(
        self,
        value_of: Callable[[str, str], int],
        order: QueueOrder,
        share: Callable[[str], float],
        skip: set[JobId],
        hopeless: Callable[[Kind], bool] | None = None,
    ) -> Iterator[tuple[Kind, Job]]:
        pending = [(value_of(j.team, j.priority), j) for j in self.jobs.values() if j.id not in skip]
        return ((kind_of(job), job) for job in queue_order(pending, order, share))


# --- the candidates, from every running job --------------------------------------------------


class ScratchIndex(RunningIndex):
    """The running index as a plain dict of the jobs not draining, whose candidates are built
    from every one of them at once, each at the class its attempt runs at (none of the index's
    own bookkeeping is used)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        super().__init__(nodes)
        self.plain: dict[JobId, RunningJob] = {}

    def add(self, running: RunningJob) -> None:
        assert running.job.id not in self.plain and running.notice is None
        self.plain[running.job.id] = running

    def remove(self, job_id: JobId) -> RunningJob:
        return self.plain.pop(job_id)

    def checkpointed(self, running: RunningJob) -> None:
        self.plain[running.job.id] = running

    def candidates(
        self,
        free: FreeGpus,
        shares: TeamShares,
        class_of: Callable[[Key], PriorityClass],
        now: float,
        config: Config,
        shortcuts: Shortcuts = ALL_SHORTCUTS,
    ) -> tuple[Candidates, dict[int, float]]:
        expiring: dict[int, float] = {}
        built = []
        for running in self.plain.values():
            job = running.job
            slots = tuple((free.index[a.node], a.gpus) for a in running.placement)
            # The class an attempt runs at: its own when it started demoted, else its job's as
            # the team's budget use has it now (what a key of its attempt's and job's class reads).
            runs_at = class_of((job.team, running.priority, job.priority, 0, None, 0, frozenset()))
            candidate = Candidate(running, runs_at, slots)
            candidate.protection = guard = protection(running, candidate.cls, now, config)
            candidate.cost = lost_work(running, now)
            candidate.share = shares.share(candidate.team)
            if guard is not None and guard.until is not None:
                value = candidate.cls.value
                expiring[value] = min(expiring.get(value, guard.until), guard.until)
            built.append(candidate)
        shrinks = [
            (i, shrink)
            for c in built
            for i in dict.fromkeys(i for i, _ in c.slots)
            if (shrink := shrink_of(c, free.index, now, free.layout.names[i])) is not None
        ]
        return _listed(free, shares, built, shortcuts, shrinks), expiring


def _listed(
    free: FreeGpus,
    shares: TeamShares,
    built: list[Candidate],
    shortcuts: Shortcuts,
    shrinks: Sequence[tuple[int, Candidate]] = (),
) -> Candidates:
    """The candidates indexed by the nodes they hold GPUs on, with their groups and supply; the
    `shrinks` of elastic ones, each for a node, are on that node, and bound what a search could
    get there, but add nothing to the supply (their GPUs are their jobs')."""
    on_node: list[list[Candidate]] = [[] for _ in free.free]
    supply: Counter[Group] = Counter()
    held: dict[tuple[int, str, int], tuple[int, float, int]] = {}
    listed = [(None, c) for c in built] + list(shrinks)
    for at, candidate in listed:
        nodes = dict.fromkeys(i for i, _ in candidate.slots) if at is None else (at,)
        layout = [(i, candidate.gpus_on(i)) for i in nodes]
        for i, _ in layout:
            on_node[i].append(candidate)
        if candidate.protection is not None:
            continue
        team, value, cost = candidate.team, candidate.cls.value, candidate.cost
        for i, gpus in layout:
            if not candidate.keep:
                supply[team, value] += gpus
            found = held.get((i, team, value))
            held[i, team, value] = (
                (gpus, cost, gpus) if found is None else (found[0] + gpus, min(found[1], cost), max(found[2], gpus))
            )
    groups = replace(GroupsByNode.of(len(on_node), held), shrinks=bool(shrinks))
    return Candidates(free, shares, _ListSource(on_node, built, free.group), groups, supply, shortcuts)


@dataclass(slots=True)
class _ListSource:
    """The candidates of one decision, all built."""

    on_node: list[list[Candidate]]
    every: list[Candidate]
    group: list[NodeGroup]

    def on(self, node: int) -> list[Candidate]:
        return list(self.on_node[node])

    def with_min_runtime(self) -> Iterator[Candidate]:
        return (c for c in self.every if c.protection is not None and c.protection.until is not None)

    def crowds(self, chosen: set[JobId]) -> list[Crowd]:
        by_key: dict[tuple[object, ...], tuple[list[Candidate], frozenset[NodeGroup]]] = {}
        for c in self.every:
            groups = frozenset(self.group[i] for i, _ in c.slots)
            by_key.setdefault(_crowd_key(c, groups), ([], groups))[0].append(c)
        return [ListedCrowd(listed, groups, chosen) for listed, groups in by_key.values()]


def _crowd_key(c: Candidate, groups: frozenset[NodeGroup]) -> tuple[object, ...]:
    """What the members of one crowd share (a minimum runtime's words are each job's own)."""
    guard = c.protection
    words = None if guard is None or guard.rule is ProtectionRule.MIN_RUNTIME else guard.text
    return (c.team, c.cls, c.gpus, guard.rule if guard is not None else None, words, groups)


def assert_index_matches(index: RunningIndex, running: Sequence[RunningJob]) -> None:
    """Raise AssertionError unless `index` holds exactly the jobs of `running` not draining,
    with one row per (job, node), and one per node an elastic job's shrink frees GPUs on."""
    expected = {r.job.id: r for r in running if r.notice is None}
    assert index.jobs == expected, "the running index holds other jobs than the running ones"
    held: Counter[tuple[JobId, int]] = Counter()
    shrinks: Counter[tuple[JobId, int]] = Counter()
    for r in expected.values():
        for alloc in r.placement:
            held[r.job.id, index.index[alloc.node]] += len(alloc.gpus)
        if r.job.elastic and r.job.gpus > r.job.smallest:
            for node in dict.fromkeys(a.node for a in r.placement):
                keep = kept_of(r.placement, r.job.smallest, (node,))
                freed = sum(len(a.gpus) for a in placement_without(r.placement, keep) if a.node == node)
                shrinks[r.job.id, index.index[node]] += freed
    rows: Counter[tuple[JobId, int]] = Counter()
    shrink_rows: Counter[tuple[JobId, int]] = Counter()
    for k in range(len(index._row_job)):
        (shrink_rows if index.shrink_to[k] else rows)[index._row_job[k], index.node[k]] += int(index.gpus[k])
    assert rows == held, "the running index's rows do not match its jobs"
    assert shrink_rows == +shrinks, "the running index's shrink rows do not match its elastic jobs"
