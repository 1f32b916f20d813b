"""The line: the pending jobs the core sees, kept between decisions, and the queue order.

Jobs are kept per kind of job (team, class asked, nominated, size, layout, GPU type), each
kind's list in submit order (`submit_key`), so that a decision takes them in queue order as
they come (`Line.in_order`) rather than sorting every pending job (100,000 at the scale of the
largest clusters) though most decisions start a few. The kinds also let the queue pass go by
the jobs alike to one that could neither start nor preempt, a kind at a time, when nothing it
would do for them shows in the plan (`queue.place_queue`).

The queue order (docs/policy.md): by class value (highest first); within a class
the jobs given victims (nominated) first, in submit order, then the teams' jobs by
weighted round-robin: the team with the lowest weighted share goes next, its share read again
each time its turn comes (a team that just got GPUs in the pass falls back behind teams that got
none), its jobs in submit order. `FIFO` is submit order alone.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from gpupool.model import Job, JobId, QueueOrder

Kind = tuple[str, str | None, int, int | None, str, bool, tuple[int, ...]]
"""(team, gpu_type, gpus, gpus_per_node, class asked, nominated, elastic sizes): jobs the queue
pass treats alike (with whether they are senior, which the clock decides)."""

Entry = tuple[tuple[float, int, str], Job]


def submit_key(job: Job) -> tuple[float, int, str]:
    """Original submit time, then arrival order; the id keeps the order total."""
    return (job.submit_time, job.order, job.id)


def kind_of(job: Job) -> Kind:
    return (job.team, job.gpu_type, job.gpus, job.gpus_per_node, job.priority, job.nominated, job.sizes)


class Line:
    """The pending jobs by id, and per kind in submit order (`submit_key`)."""

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self.jobs: dict[JobId, Job] = {}
        self.kinds: dict[Kind, list[Entry]] = {}
        for job in jobs:
            self.add(job)

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs.values())

    def add(self, job: Job) -> None:
        """`job` is in line (again), or changed (nominated, requeued)."""
        if job.id in self.jobs:
            self.remove(job.id)
        self.jobs[job.id] = job
        entries = self.kinds.setdefault(kind_of(job), [])
        key = submit_key(job)
        entries.insert(bisect_left(entries, (key,)), (key, job))

    def of(self, job_ids: Iterable[JobId]) -> Line:
        """A line of its own of the jobs of `job_ids` (in this line), as this line orders them."""
        return type(self)(self.jobs[job_id] for job_id in job_ids)

    def remove(self, job_id: JobId) -> Job:
        """The job left the line (it started, or was cancelled)."""
        job = self.jobs.pop(job_id)
        kind = kind_of(job)
        entries = self.kinds[kind]
        at = bisect_left(entries, (submit_key(job),))
        assert entries[at][1] is job, f"the line lost the place of job {job_id}"
        del entries[at]
        if not entries:
            del self.kinds[kind]
        return job

    def after(self, job: Job) -> Iterator[Job]:
        """The jobs of `job`'s kind after it in line (it must be in the index)."""
        entries = self.kinds[kind_of(job)]
        at = bisect_left(entries, (submit_key(job),))
        assert entries[at][1] is job, f"the line lost the place of job {job.id}"
        for _, later in entries[at + 1 :]:
            yield later

    def in_order(
        self,
        value_of: Callable[[str, str], int],
        order: QueueOrder,
        share: Callable[[str], float],
        skip: set[JobId],
        hopeless: Callable[[Kind], bool] | None = None,
    ) -> Iterator[tuple[Kind, Job]]:
        """The jobs in queue order (the module's docstring), with their kinds, without those of `skip`; a job's
        class value is `value_of(team, class asked)`, a team's weighted share `share(team)`,
        read again when the team's turn comes.

        With `hopeless`, jobs of the kinds it names are passed without being given: the caller
        says that such a job would only wait, with nothing to show for it. They are passed as
        the queue order would have given them, so that the others come in the same order (see
        `_pass_tied`)."""
        effort = _Effort(2 * len(self.jobs))
        if order is QueueOrder.FIFO:
            yield from _Line(list(self.kinds.items()), skip).jobs(hopeless, effort)
            return
        lines: dict[tuple[int, str | None], list[tuple[Kind, list[Entry]]]] = {}
        for kind, entries in self.kinds.items():
            team, _, _, _, asked, nominated, _ = kind
            lines.setdefault((value_of(team, asked), None if nominated else team), []).append((kind, entries))
        for value in sorted({value for value, _ in lines}, reverse=True):
            if (value, None) in lines:
                yield from _Line(lines[value, None], skip).jobs(hopeless, effort)
            queues = {team: _Line(kinds, skip) for (v, team), kinds in lines.items() if v == value and team is not None}
            heap = [(share(team), *q.head_key(), team) for team, q in queues.items() if q.heads]
            heapq.heapify(heap)
            # A team's share is read again when its turn comes: if it got GPUs since its turn
            # was queued, it competes again at its new share.
            while heap:
                if (
                    hopeless is not None
                    and effort.worth
                    and hopeless(queues[heap[0][4]].head_kind())
                    and _pass_tied(heap, queues, share, hopeless, effort)
                ):
                    continue
                stale_share, _, _, _, team = heapq.heappop(heap)
                queue = queues[team]
                current = share(team)
                if current > stale_share:
                    heapq.heappush(heap, (current, *queue.head_key(), team))
                    continue
                kind, job = queue.take()
                if hopeless is None or not hopeless(kind):
                    yield kind, job
                if queue.heads:
                    heapq.heappush(heap, (share(team), *queue.head_key(), team))


HeapEntry = tuple[float, float, int, str, str]
"""(team's share when pushed, *submit key of its next job, team): a team's turn."""


class _Effort:
    """What passing jobs a kind at a time has cost: the kinds looked at. Each pass looks at every
    kind of the teams tied (or of the line), so with many of them and few jobs passed each time
    it could cost more than passing every job one by one; once it has looked at `budget` kinds
    (twice the jobs in line), it gives way to that (`worth`) for the rest of the queue."""

    __slots__ = ("budget", "looked")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.looked = 0

    @property
    def worth(self) -> bool:
        return self.looked <= self.budget


def _pass_tied(
    heap: list[HeapEntry],
    queues: dict[str, _Line],
    share: Callable[[str], float],
    hopeless: Callable[[Kind], bool],
    effort: _Effort,
) -> bool:
    """Pass, at once, the hopeless jobs the queue order would give before the next job that is
    not, when the first turns are all at one share that is still each team's (False, changing
    nothing, otherwise: the caller takes one turn as the queue order does).

    Teams at one share take their turns in submit order, merged; passed jobs change no share,
    so every job of these teams before the first one that is not hopeless (of any of them) is
    given, and passed, before it; each team's turn is then at its next job. Teams at a higher
    share wait behind them either way."""
    level = heap[0][0]
    tied = []
    while heap and heap[0][0] == level:
        tied.append(heapq.heappop(heap))
    if any(share(entry[4]) != level for entry in tied):
        for entry in tied:
            heapq.heappush(heap, entry)
        return False
    first: tuple[float, int, str] | None = None
    for entry in tied:
        key = queues[entry[4]].first_not(hopeless)
        if key is not None and (first is None or key < first):
            first = key
    for entry in tied:
        queue = queues[entry[4]]
        effort.looked += 2 * len(queue.kinds)
        queue.pass_before(hopeless, first)
        if queue.heads:
            heapq.heappush(heap, (level, *queue.head_key(), entry[4]))
    return True


class _Line:
    """The jobs of some kinds merged in submit order, each kind's list read from a cursor, so
    that the jobs of a kind can be passed at once."""

    __slots__ = ("entries", "heads", "kinds", "place", "skip")

    def __init__(self, kinds: list[tuple[Kind, list[Entry]]], skip: set[JobId]) -> None:
        self.kinds = [kind for kind, _ in kinds]
        self.entries = [entries for _, entries in kinds]
        self.place = [0] * len(kinds)
        self.skip = skip
        self.heads: list[tuple[tuple[float, int, str], int]] = []
        """(submit key, k) of each kind's next job not skipped, as a heap."""
        for k in range(len(kinds)):
            self._push(k)

    def _push(self, k: int) -> None:
        entries, at = self.entries[k], self.place[k]
        while at < len(entries) and entries[at][1].id in self.skip:
            at += 1
        self.place[k] = at
        if at < len(entries):
            heapq.heappush(self.heads, (entries[at][0], k))

    def head_key(self) -> tuple[float, int, str]:
        return self.heads[0][0]

    def head_kind(self) -> Kind:
        return self.kinds[self.heads[0][1]]

    def take(self) -> tuple[Kind, Job]:
        _, k = heapq.heappop(self.heads)
        job = self.entries[k][self.place[k]][1]
        self.place[k] += 1
        self._push(k)
        return self.kinds[k], job

    def jobs(self, hopeless: Callable[[Kind], bool] | None, effort: _Effort) -> Iterator[tuple[Kind, Job]]:
        """Its jobs in order with their kinds, those of `hopeless` kinds passed (no share is
        read here)."""
        while self.heads:
            if hopeless is not None and hopeless(self.head_kind()):
                if effort.worth:
                    effort.looked += 2 * len(self.kinds)
                    self.pass_before(hopeless, self.first_not(hopeless))
                else:
                    self.take()
                continue
            yield self.take()

    def first_not(self, hopeless: Callable[[Kind], bool]) -> tuple[float, int, str] | None:
        """The submit key of its first job not of a hopeless kind (None: there is none)."""
        first = None
        for k, kind in enumerate(self.kinds):
            entries, at = self.entries[k], self.place[k]
            if at < len(entries) and not hopeless(kind):
                key = entries[at][0]
                if first is None or key < first:
                    first = key
        return first

    def pass_before(self, hopeless: Callable[[Kind], bool], before: tuple[float, int, str] | None) -> None:
        """Pass the jobs of hopeless kinds submitted before `before` (all of them if None)."""
        for k, kind in enumerate(self.kinds):
            if hopeless(kind):
                entries, at = self.entries[k], self.place[k]
                self.place[k] = bisect_left(entries, (before,), at) if before is not None else len(entries)
        self.heads = []
        for k in range(len(self.kinds)):
            self._push(k)
