"""The order in which pending jobs are considered."""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence

from gpupool.model import Job, QueueOrder


def submit_key(job: Job) -> tuple[float, int, str]:
    """Original submit time, then arrival order; the id keeps the order total."""
    return (job.submit_time, job.order, job.id)


def queue_order(pending: Sequence[tuple[int, Job]], order: QueueOrder, share: Callable[[str], float]) -> Iterator[Job]:
    """Yield pending jobs, given as (effective class value, job), best first.

    `PRIORITY`: by `(-class value, nominated first, team's weighted share, submit time,
    arrival order)`. The share is
    read again each time a team's next job comes up, so a team that just got GPUs in this
    very pass falls back behind teams that got none (weighted round-robin within a class).
    `FIFO`: by `(submit time, arrival order)` alone (nothing is preempted under it).
    """
    if order is QueueOrder.FIFO:
        yield from sorted((job for _, job in pending), key=submit_key)
        return
    by_class: dict[int, dict[str, list[Job]]] = defaultdict(lambda: defaultdict(list))
    nominated: dict[int, list[Job]] = defaultdict(list)
    for value, job in pending:
        (nominated[value] if job.nominated else by_class[value][job.team]).append(job)
    for value in sorted(by_class.keys() | nominated.keys(), reverse=True):
        # Within a class, the jobs whose victims have left come first: the GPUs were freed for
        # them (a requeued victim of the same class must not take them back).
        yield from sorted(nominated[value], key=submit_key)
        queues = {team: deque(sorted(jobs, key=submit_key)) for team, jobs in by_class[value].items()}
        heap = [(share(team), *submit_key(q[0]), team) for team, q in queues.items()]
        heapq.heapify(heap)
        while heap:
            stale_share, _, _, _, team = heapq.heappop(heap)
            queue = queues[team]
            current = share(team)
            if current > stale_share:
                # The team got GPUs since it was queued: let it compete again at its new share.
                heapq.heappush(heap, (current, *submit_key(queue[0]), team))
                continue
            yield queue.popleft()
            if queue:
                heapq.heappush(heap, (share(team), *submit_key(queue[0]), team))
