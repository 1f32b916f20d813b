"""The running jobs a victim search may look at, kept between decisions (`state.PoolState`).

A decision that built its preemption candidates from every running job would pay for each of
them (on 10,000 nodes, 60,000 jobs), though a victim search looks at a few nodes. The index is
kept up to date as attempts start, get notice, end and commit checkpoints, and a decision builds
only what it reads: the GPUs each (team, class) could give and the earliest end of a minimum
runtime from the index's per-group lists, the bounds of every node from its arrays, and a
node's candidates when a search first looks at that node. The decision is the one candidates
built from every running job give (tests/support/oracle.py, the property tests' reference).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np
import numpy.typing as npt

from gpupool.model import Config, JobId, Node, PriorityClass, RunningJob, placement_without
from gpupool.policy.free import FreeGpus
from gpupool.policy.free import Group as NodeGroup
from gpupool.policy.preempt.bounds import Group, GroupsByNode
from gpupool.policy.preempt.candidates import (
    ALL_SHORTCUTS,
    Candidate,
    Candidates,
    Crowd,
    ListedCrowd,
    Shortcuts,
    kept_of,
    lost_work,
    protection,
    shrink_of,
)
from gpupool.policy.share import TeamShares

Key = tuple[str, str | None, str, int, int | None, int, frozenset[NodeGroup]]
"""(team, the attempt's class or None, the job's class, preemptions, the job's preemption cap,
its GPUs, the groups of the nodes it runs on): running jobs whose class and static protection
every decision sees alike, and whose waits' explanations read alike (`candidates.Crowd`)."""


@dataclass(slots=True)
class _KeyJobs:
    """The running jobs of one key: the GPUs they hold, their starts in order, their ids in order."""

    gpus: int = 0
    started: list[tuple[float, JobId]] = field(default_factory=list)
    ids: list[JobId] = field(default_factory=list)


class RunningIndex:
    """The running jobs that are not draining, by node, by key and as one row per (job, node)
    in arrays (a dropped row takes the last one's place, so every row is live)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = nodes
        self.index = {node.name: i for i, node in enumerate(nodes)}
        self.group: list[NodeGroup] = [(node.gpu_type, node.team) for node in nodes]
        self.key_of: dict[JobId, Key] = {}
        self.jobs: dict[JobId, RunningJob] = {}
        self.on_node: list[dict[JobId, RunningJob]] = [{} for _ in nodes]
        self.keys: dict[Key, int] = {}
        self.by_key: list[_KeyJobs] = []
        self._unused: list[int] = []
        """Ids of keys no job holds any more, to be given again."""
        self.rows_of: dict[JobId, list[int]] = {}
        self._row_job: list[JobId] = []
        # Plain typed arrays: a driver's change writes one item at a time, which numpy makes
        # slow; a decision reads them as numpy arrays without a copy (`np.frombuffer`).
        self.node = array("q")
        self.key = array("q")
        self.gpus = array("d")
        self.job_gpus = array("d")
        self.since = array("d")
        self.restart = array("d")
        self.shrink_to = array("d")
        """A shrink's row: the size it restarts at (0 for a whole job's row)."""

    # --- kept up to date by the state -----------------------------------------------------

    def add(self, running: RunningJob) -> None:
        """A job started (or its attempt is no longer under notice)."""
        job = running.job
        if job.id in self.jobs:
            raise ValueError(f"job {job.id} is in the running index twice")
        if running.notice is not None:
            raise ValueError(f"job {job.id} is draining: the running index holds the others")
        held: Counter[int] = Counter()
        for alloc in running.placement:
            try:
                held[self.index[alloc.node]] += len(alloc.gpus)
            except KeyError:
                raise ValueError(f"job {job.id} runs on unknown node {alloc.node!r}") from None
        self.jobs[job.id] = running
        groups = frozenset(self.group[i] for i in held)
        self.key_of[job.id] = whole = (
            job.team,
            running.priority,
            job.priority,
            job.preemptions,
            job.max_preemptions,
            job.gpus,
            groups,
        )
        key = self._key_id(whole)
        kept = self.by_key[key]
        kept.gpus += sum(held.values())
        insort(kept.started, (running.started_at, job.id))
        insort(kept.ids, job.id)
        since = running.last_checkpoint_at if running.last_checkpoint_at is not None else running.started_at
        rows = []
        for i, gpus in held.items():
            self.on_node[i][job.id] = running
            rows.append(self._append_row(job.id, i, key, gpus, job.gpus, since, job.expected_restart))
        if job.elastic and job.gpus > job.smallest:
            # On each of its nodes, its shrink to its smallest size that frees most there
            # (`shrink_of`) is a candidate too.
            for i in held:
                name = self.nodes[i].name
                keep = kept_of(running.placement, job.smallest, (name,))
                gpus = sum(len(a.gpus) for a in placement_without(running.placement, keep) if a.node == name)
                if gpus:
                    rows.append(
                        self._append_row(job.id, i, key, gpus, job.gpus, since, job.expected_restart, job.smallest)
                    )
        self.rows_of[job.id] = rows

    def remove(self, job_id: JobId) -> RunningJob:
        """A job left, or was given notice."""
        running = self.jobs.pop(job_id)
        key = self.key_of.pop(job_id)
        k = self.keys[key]
        kept = self.by_key[k]
        kept.gpus -= sum(len(a.gpus) for a in running.placement)
        started = kept.started
        del started[bisect_left(started, (running.started_at, job_id))]
        del kept.ids[bisect_left(kept.ids, job_id)]
        if not started:
            # A key no job holds any more is not looked at again (its class may be gone).
            del self.keys[key]
            self._unused.append(k)
        for alloc in running.placement:
            self.on_node[self.index[alloc.node]].pop(job_id, None)
        for row in sorted(self.rows_of.pop(job_id), reverse=True):
            self._drop_row(row)
        return running

    def checkpointed(self, running: RunningJob) -> None:
        """The job's attempt committed a checkpoint: `running` has it."""
        job_id = running.job.id
        held = self.jobs.get(job_id)
        if held is None or held.placement != running.placement or held.started_at != running.started_at:
            raise ValueError(f"job {job_id} is not running in the index as the checkpoint says")
        self.jobs[job_id] = running
        for alloc in running.placement:
            self.on_node[self.index[alloc.node]][job_id] = running
        since = running.last_checkpoint_at if running.last_checkpoint_at is not None else running.started_at
        for row in self.rows_of[job_id]:
            self.since[row] = since

    def _key_id(self, key: Key) -> int:
        found = self.keys.get(key)
        if found is None:
            if self._unused:
                found = self.keys[key] = self._unused.pop()
                self.by_key[found] = _KeyJobs()
            else:
                found = self.keys[key] = len(self.by_key)
                self.by_key.append(_KeyJobs())
        return found

    def _append_row(
        self,
        job_id: JobId,
        node: int,
        key: int,
        gpus: int,
        job_gpus: int,
        since: float,
        restart: float,
        shrink_to: int = 0,
    ) -> int:
        row = len(self._row_job)
        self.node.append(node)
        self.key.append(key)
        self.gpus.append(gpus)
        self.job_gpus.append(job_gpus)
        self.since.append(since)
        self.restart.append(restart)
        self.shrink_to.append(shrink_to)
        self._row_job.append(job_id)
        return row

    def _drop_row(self, row: int) -> None:
        """Move the last row into `row` (rows are dropped largest first within one job)."""
        last = len(self._row_job) - 1
        moved = self._row_job.pop()
        for column in (self.node, self.key):
            value = column.pop()
            if row != last:
                column[row] = value
        for floats in (self.gpus, self.job_gpus, self.since, self.restart, self.shrink_to):
            number = floats.pop()
            if row != last:
                floats[row] = number
        if row != last:
            self._row_job[row] = moved
            rows = self.rows_of.get(moved)
            if rows is not None:
                rows[rows.index(last)] = row

    # --- read by one decision ------------------------------------------------------------

    def candidates(
        self,
        free: FreeGpus,
        shares: TeamShares,
        class_of: Callable[[Key], PriorityClass],
        now: float,
        config: Config,
        shortcuts: Shortcuts = ALL_SHORTCUTS,
    ) -> tuple[Candidates, dict[int, float]]:
        """One decision's candidates, with the earliest end of a minimum runtime per class
        value (what `Plan.retry_at` may be set to); `shares` as they stand at the decision's
        first victim search."""
        classes = {k: class_of(key) for key, k in self.keys.items()}
        supply = _Supply.of(self, classes, now, config)
        bounds = self._groups_by_node(len(free.free), supply, now)
        lazy = _LazyNodes(self, {key: classes[k] for key, k in self.keys.items()}, now, config, shares, supply.recent)
        return Candidates(free, shares, lazy, bounds, supply.gpus, shortcuts), supply.expiring

    def _groups_by_node(self, nodes: int, supply: _Supply, now: float) -> GroupsByNode:
        """The rows of the candidates a search could take (those of the groups with GPUs to
        give) by node and group, with their lost work `now`: what the bounds are made of."""
        groups = {group: n for n, group in enumerate(supply.gpus)}
        key_group = np.full(max(len(self.by_key), 1), -1, dtype=np.intp)
        for k, group in supply.group_of.items():
            key_group[k] = groups.get(group, -1)

        def read(column: array[int] | array[float], dtype: type) -> npt.NDArray[Any]:
            return np.frombuffer(column, dtype=dtype) if len(column) else np.zeros(0, dtype=dtype)

        row_group = key_group[read(self.key, np.int64)]
        taken = row_group >= 0
        since = read(self.since, np.float64)[taken]
        job_gpus, restart = read(self.job_gpus, np.float64)[taken], read(self.restart, np.float64)[taken]
        shrink_to = read(self.shrink_to, np.float64)[taken]
        # As `lost_work` and `shrink_cost` work them out, operation for operation: a bound is
        # never above the cost it bounds by a rounding.
        ran = np.maximum(0.0, now - since)
        cost = job_gpus * (ran + restart)
        shrinks = shrink_to > 0
        if shrinks.any():
            cost[shrinks] = job_gpus[shrinks] * ran[shrinks] + shrink_to[shrinks] * restart[shrinks]
        held = read(self.gpus, np.float64)[taken]
        node = read(self.node, np.int64)[taken].astype(np.intp)
        # A row: one job (or one of its shrinks), one node.
        return GroupsByNode(nodes, list(groups), node, row_group[taken], held, cost, held, bool(shrinks.any()))


@dataclass(slots=True)
class _Supply:
    """What each group (team, class value) of candidates could give one decision's searches:
    the GPUs of its jobs neither protected nor at their preemption cap, with the jobs inside
    their minimum runtime and when the first of those ends per class value."""

    gpus: Counter[Group] = field(default_factory=Counter)
    group_of: dict[int, Group] = field(default_factory=dict)
    """Per key not at its cap, its group."""
    expiring: dict[int, float] = field(default_factory=dict)
    recent: list[JobId] = field(default_factory=list)
    """The jobs inside their minimum runtime."""

    @classmethod
    def of(cls, index: RunningIndex, classes: Mapping[int, PriorityClass], now: float, config: Config) -> _Supply:
        found = cls()
        for (team, _, _, preemptions, own_cap, _, _), k in index.keys.items():
            cls_ = classes[k]
            if not cls_.preemptible:
                continue
            kept = index.by_key[k]
            cap = own_cap if own_cap is not None else config.max_preemptions
            capped = cap is not None and preemptions >= cap
            gpus = kept.gpus
            # Starts in order: those whose minimum runtime has not ended are the last ones.
            for started_at, job_id in reversed(kept.started):
                if not started_at + cls_.min_runtime > now:
                    break
                until = started_at + cls_.min_runtime
                found.expiring[cls_.value] = min(found.expiring.get(cls_.value, until), until)
                found.recent.append(job_id)
                if not capped:
                    gpus -= sum(len(a.gpus) for a in index.jobs[job_id].placement)
            if not capped:
                found.group_of[k] = (team, cls_.value)
                if gpus:
                    found.gpus[team, cls_.value] += gpus
        return found


class _LazyNodes:
    """Builds one decision's candidates of a node when a search first looks at it. It holds
    no reference to the decision (which holds the candidates): no cycle for the collector."""

    def __init__(
        self,
        index: RunningIndex,
        classes: Mapping[Key, PriorityClass],
        now: float,
        config: Config,
        shares: TeamShares,
        in_min_runtime: list[JobId],
    ) -> None:
        self.index = index
        self.classes = classes
        self.now = now
        self.config = config
        # The teams' shares when the candidates were first needed: a tie-break of victim_order.
        self.shares = TeamShares(shares.teams, Counter(shares.gpus))
        self.made: dict[JobId, Candidate] = {}
        self.shrinks: dict[tuple[JobId, int], Candidate | None] = {}
        self.in_min_runtime = in_min_runtime

    def on(self, node: int) -> list[Candidate]:
        """The candidates holding GPUs on `node`: each job, and the shrink of an elastic one
        that frees GPUs there."""
        found = []
        for job_id, running in self.index.on_node[node].items():
            whole = self.made.get(job_id) or self._make(running)
            found.append(whole)
            if running.job.elastic:
                if (job_id, node) not in self.shrinks:
                    name = self.index.nodes[node].name
                    self.shrinks[job_id, node] = shrink_of(whole, self.index.index, self.now, name)
                shrink = self.shrinks[job_id, node]
                if shrink is not None:
                    found.append(shrink)
        return found

    def with_min_runtime(self) -> Iterator[Candidate]:
        """The candidates inside their minimum runtime."""
        for job_id in self.in_min_runtime:
            yield self.made.get(job_id) or self._make(self.index.jobs[job_id])

    def crowds(self, chosen: set[JobId]) -> list[Crowd]:
        """The candidates by crowd: a key's jobs inside their minimum runtime (built, as few
        are), and its others, by id."""
        found: list[Crowd] = []
        now = self.now
        for key, k in self.index.keys.items():
            cls = self.classes[key]
            kept = self.index.by_key[k]
            recent: list[JobId] = []
            if cls.preemptible:
                for started_at, job_id in reversed(kept.started):
                    if not started_at + cls.min_runtime > now:
                        break
                    recent.append(job_id)
            if recent:
                found.append(ListedCrowd([self.candidate(j) for j in recent], key[6], chosen))
            if len(recent) < len(kept.ids):
                found.append(_KeyCrowd(self, kept.ids, set(recent), key[6], chosen))
        return found

    def candidate(self, job_id: JobId) -> Candidate:
        """The candidate of running job `job_id`."""
        return self.made.get(job_id) or self._make(self.index.jobs[job_id])

    def _make(self, running: RunningJob) -> Candidate:
        index = self.index.index
        cls = self.classes[self.index.key_of[running.job.id]]
        candidate = Candidate(running, cls, tuple([(index[a.node], a.gpus) for a in running.placement]))
        candidate.protection = protection(running, cls, self.now, self.config)
        candidate.cost = lost_work(running, self.now)
        candidate.share = self.shares.share(candidate.team)
        self.made[candidate.id] = candidate
        return candidate


@dataclass(slots=True)
class _KeyCrowd:
    """The jobs of one key but those `apart` (inside their minimum runtime), by id: the
    candidates of the ones a wait's explanation names are built, the others only counted."""

    nodes: _LazyNodes
    ids: list[JobId]
    apart: set[JobId]
    groups: frozenset[NodeGroup]
    chosen: set[JobId]
    _sample: Candidate | None = None
    _count: tuple[int, int] = (-1, 0)
    """(how many were chosen, its count then): candidates are only ever added to `chosen`."""

    @property
    def sample(self) -> Candidate:
        if self._sample is None:
            self._sample = self.nodes.candidate(next(j for j in self.ids if j not in self.apart))
        return self._sample

    def count(self) -> int:
        seen, count = self._count
        if seen != len(self.chosen):
            ids = self.ids
            taken = sum(
                1
                for j in self.chosen
                if j not in self.apart and (at := bisect_left(ids, j)) < len(ids) and ids[at] == j
            )
            count = len(ids) - len(self.apart) - taken
            self._count = (len(self.chosen), count)
        return count

    def first(self, k: int) -> list[str]:
        jobs = self.nodes.index.jobs
        return [
            jobs[j].job.label for j in islice((j for j in self.ids if j not in self.apart and j not in self.chosen), k)
        ]

    def members(self) -> Iterator[Candidate]:
        return (self.nodes.candidate(j) for j in self.ids if j not in self.apart and j not in self.chosen)


__all__ = ["Key", "RunningIndex"]
