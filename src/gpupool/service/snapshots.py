"""The live loop's snapshots: the store read whole once, then kept up to date from its change
journal, so that a decision reads what changed since the last one (`store/reads.py`) and the
core decides on the state kept between decisions (`policy.PoolState`), not on a pool read anew.

A read takes everything again when the nodes changed, when more than a few thousand jobs
changed, after `forget` (an error, a halt) and every `resync` seconds: a safety net that costs
one whole read an hour. With `check` (GPUPOOL_CHECK_SNAPSHOTS=1, as the tests run), every read
also reads everything in the same transaction and raises `SnapshotDrift` if the kept state
differs from it.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpupool.model import HELD_BACK, Allocation, Job, Reason, RunningJob, Snapshot, Wait
from gpupool.policy import PoolState
from gpupool.store import Store
from gpupool.store.reads import SchedulingRead

UNEXPLAINED = {None, Reason.AWAITING_DRAIN.value, *(r.value for r in HELD_BACK)}
"""Reasons to wait that say nothing of a job in the core's line: none yet, or a hold's."""

CHECK = "GPUPOOL_CHECK_SNAPSHOTS"
"""Set to 1: every read is checked against a whole read (tests)."""


FREEZE_FROM = 10_000
"""Jobs kept from which a whole read moves them out of the cyclic collector's sight."""


class SnapshotDrift(AssertionError):
    """The kept state differs from what the store holds."""


@dataclass
class KeptSnapshots:
    store: Store
    check: bool = field(default_factory=lambda: os.environ.get(CHECK) == "1")
    resync: float = 3600.0
    """Seconds after which a read takes everything again, whatever the journal says."""
    prune_every: int = 100
    """Reads between two prunes of the journal."""
    state: PoolState | None = None
    position: int | None = None
    watched: set[int] = field(default_factory=set)
    """Jobs in line whose holds are read at every read (`JobNow.watched`)."""
    holds: dict[int, Wait] = field(default_factory=dict)
    arrived: list[int] = field(default_factory=list)
    """The jobs that came in the core's line at the last read (new, requeued, or no longer held
    back; at a whole read, those whose stored reason to wait is none or no longer true)."""
    reserved: dict[str, set[int]] = field(default_factory=dict)
    """GPUs taken out of the kept state's free ones, per node: dirty GPUs (`read`)."""
    read_whole_at: float | None = None
    read_whole: bool = False
    """Whether the last read took everything."""
    reads: int = 0

    def read(self, now: float, dirty: Mapping[str, frozenset[int]] | None = None) -> tuple[PoolState, list[Wait]]:
        """The state to decide on at `now`, and the jobs held back from the core, with why.
        `dirty`: GPUs per node a process of no live attempt holds: those free now are taken
        out of the free ones, as if held, until they are no longer dirty (one held by a
        running attempt is taken once that attempt has let it go)."""
        fresh = self.state is not None and self.read_whole_at is not None and now - self.read_whole_at < self.resync
        since = self.position if fresh else None
        read = self.store.read_scheduling(now, since, self.watched, whole=self.check and since is not None)
        self.arrived = []
        self.read_whole = read.nodes is not None
        if read.nodes is not None:
            self.start_over(read)
            self.read_whole_at = now
        else:
            self.apply(read)
        assert self.state is not None
        self.position = read.position
        self.reserve(dirty or {})
        if read.whole is not None:
            self.compare(read.whole)
        self.reads += 1
        if self.reads % self.prune_every == 0:
            self.store.prune_changes(read.position)
        self.state.usage, self.state.teams = read.usage, read.teams
        return self.state, list(self.holds.values())

    def forget(self) -> None:
        """Take everything again at the next read."""
        self.state = None

    def reserve(self, dirty: Mapping[str, frozenset[int]]) -> None:
        """Make the GPUs taken out of the free ones the dirty ones that are free or taken."""
        state = self.state
        assert state is not None
        for node, taken in list(self.reserved.items()):
            clean = taken - dirty.get(node, frozenset())
            if clean and node in state.free:
                state.free.give((Allocation(node, tuple(sorted(clean))),))
            taken.difference_update(clean)
            if not taken:
                del self.reserved[node]
        for node, gpus in dirty.items():
            if node not in state.free:
                continue
            newly = sorted(set(gpus) & set(state.free[node]))
            if newly:
                state.free.take((Allocation(node, tuple(newly)),))
                self.reserved.setdefault(node, set()).update(newly)

    def start_over(self, read: SchedulingRead) -> None:
        assert read.nodes is not None
        self.reserved = {}
        self.state = PoolState(read.nodes)
        self.watched, self.holds = set(), {}
        self.apply(read)
        # The kept jobs live on, and hold no reference cycle: out of the cyclic collector's
        # sight, whose full passes over a large pool's jobs would pause decisions (as the
        # simulator freezes its jobs; what leaves the state later is freed all the same).
        if len(self.state.running) + len(self.state.line) + len(self.state.held) >= FREEZE_FROM:
            gc.collect()  # what is garbage now is not frozen with them
            gc.freeze()

    def apply(self, read: SchedulingRead) -> None:
        """Put the jobs read as they are now; held ones out of the core's line."""
        state = self.state
        assert state is not None
        touched = set(self.watched)
        whole = read.nodes is not None
        seen: set[int] = set()
        """Jobs read that were in the core's line before this read (or whose reason is true)."""
        for now in read.jobs:
            key = str(now.id)
            if key in state.line.jobs or (whole and now.reason not in UNEXPLAINED):
                seen.add(now.id)
            state.put(key, now.running)
            if now.pending is not None:
                state.hold(now.pending)  # until its holds are read below
                touched.add(now.id)
            else:
                self.holds.pop(now.id, None)
            if now.watched:
                self.watched.add(now.id)
            else:
                self.watched.discard(now.id)
        for job_id in touched:
            key = str(job_id)
            job = state.line.jobs.get(key) or state.held.get(key)
            if job is None:
                continue
            hold = read.holds.get(job_id)
            if hold is not None:
                self.holds[job_id] = hold
                state.hold(job)
            else:
                self.holds.pop(job_id, None)
                if job_id not in seen and key not in state.line.jobs:
                    self.arrived.append(job_id)
                if state.line.jobs.get(key) != job:
                    state.queue(job)

    def compare(self, whole: SchedulingRead) -> None:
        """Raise `SnapshotDrift` unless the kept state is what `whole` says, indexes too."""
        state = self.state
        assert state is not None and whole.nodes is not None
        running = {r.job.id: r for j in whole.jobs if (r := j.running) is not None}
        in_line = {p.id: p for j in whole.jobs if (p := j.pending) is not None and j.id not in whole.holds}
        held = {p.id: p for j in whole.jobs if (p := j.pending) is not None and j.id in whole.holds}
        expected = PoolState.of(Snapshot(whole.nodes, list(running.values()), list(in_line.values())))
        for node, taken in self.reserved.items():
            if node in expected.free and taken <= set(expected.free[node]):
                expected.free.take((Allocation(node, tuple(sorted(taken))),))
        not_draining = {job_id: r for job_id, r in running.items() if r.notice is None}
        problems = [
            what
            for what, same in (
                ("nodes", list(state.nodes) == whole.nodes),
                ("running jobs", state.running == running),
                ("drains", state.draining == expected.draining),
                ("jobs in line", state.line.jobs == in_line and state.line.kinds == expected.line.kinds),
                ("held jobs", self.holds == whole.holds and state.held == held),
                ("free GPUs", dict(state.free) == dict(expected.free)),
                ("GPUs per team", +state.team_gpus == +expected.team_gpus),
                ("running index", state.index.jobs == not_draining),
            )
            if not same
        ]
        if problems:
            self.forget()
            detail = _first_difference(state.running, running, state.line.jobs, in_line)
            raise SnapshotDrift(f"the kept snapshot differs from the store in its {', '.join(problems)}{detail}")


def _first_difference(
    kept_running: dict[str, RunningJob],
    running: dict[str, RunningJob],
    kept_line: dict[str, Job],
    line: dict[str, Job],
) -> str:
    for kept, stored, what in ((kept_running, running, "running"), (kept_line, line, "in line")):
        for job_id in sorted(kept.keys() | stored.keys()):
            if kept.get(job_id) != stored.get(job_id):
                return f" (first: job {job_id} {what}: kept {kept.get(job_id)}, stored {stored.get(job_id)})"
    return ""


__all__ = ["CHECK", "UNEXPLAINED", "KeptSnapshots", "SnapshotDrift"]
