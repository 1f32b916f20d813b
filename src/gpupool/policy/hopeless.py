"""Jobs the queue pass need not try: alike to one that could neither start nor preempt.

Within one decision free GPUs and candidates only shrink (see `memo.Memo`), and a strict
queue's blocks only grow, so a job alike to one that could not start, found no victims, can
never fit or waits behind a block (same kind, `line.Kind`, and whether it is senior) meets the
same fate: it waits, for the same reason. When waits are not
explained (the simulator), nothing of such a job shows in the plan, but for when it becomes
senior (`Plan.retry_at`). The line then goes by whole kinds of such jobs without the
pass taking them one by one (`passable`), and the time they become senior is noted for them
all at once (`learn`).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpupool.model import Job, JobId
from gpupool.policy.line import Kind, Line, kind_of

Alike = tuple[str, str | None, int, int | None, str, bool, tuple[int, ...], bool]
"""A pending job's kind (`line.Kind`) and whether it is senior: jobs the queue pass treats alike."""

F = TypeVar("F")


def alike_of(kind: Kind, senior: bool) -> Alike:
    """The `Alike` of a job of `kind`, senior or not."""
    return (*kind, senior)


@dataclass(slots=True)
class Hopeless(Generic[F]):
    """What became of the first hopeless job of each `Alike` in one decision's queue pass.

    `line` is the line the pass reads; `skip` the jobs it leaves out; `senior_after` the
    policy's seniority."""

    senior_after: float | None
    now: float
    line: Line
    skip: Set[JobId] = frozenset()
    fits: dict[Alike, F] = field(default_factory=dict)
    _left: dict[Kind, tuple[bool, bool]] = field(default_factory=dict)
    """Per kind of more than one GPU, with seniority: whether jobs not senior, and senior ones,
    are left in line after the last one found hopeless."""

    def get(self, alike: Alike) -> F | None:
        return self.fits.get(alike)

    def learn(self, job: Job, alike: Alike, fit: F, *, becomes_senior: bool) -> float | None:
        """`job` (alike to `alike`) is hopeless with `fit`. Returns the earliest time a job of
        its kind after it in line, not senior now, becomes senior, when those jobs are passed
        and `becomes_senior` says their wait notes it (None: nothing to note)."""
        self.fits[alike] = fit
        after = self.senior_after
        if after is None or job.gpus == 1:
            return None
        junior = senior = False
        first: float | None = None
        for later in self.line.after(job):
            if later.id in self.skip:
                continue
            at = later.waiting_since + after
            if at <= self.now:
                senior = True
            else:
                junior = True
                first = at if first is None or at < first else first
        self._left[kind_of(job)] = (junior, senior)
        return first if becomes_senior and not alike[-1] else None

    def passable(self, kind: Kind) -> bool:
        """Whether every job of `kind` left in line is alike to a hopeless one: a 1-GPU job is
        never senior (no job is smaller); a larger one may be, so both of its alikes that are
        left must be hopeless."""
        if not self.fits:
            return False
        if self.senior_after is None or kind[2] == 1:
            return (*kind, False) in self.fits
        left = self._left.get(kind)
        if left is None:
            return False
        junior, senior = left
        return (not junior or (*kind, False) in self.fits) and (not senior or (*kind, True) in self.fits)
