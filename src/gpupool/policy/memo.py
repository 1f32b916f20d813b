"""What one decision remembers so as not to work out the same thing twice."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.model import Job, PlacementRule
from gpupool.policy.free import FreeGpus, Group, Shape, Slot
from gpupool.policy.place import choose_slots, fits_empty, job_shapes
from gpupool.policy.preempt.explain import Kept


@dataclass(slots=True)
class Memo:
    """Lookups of one decision, and the failures it may remember.

    The invariant the failures rest on: once the queue pass has begun, free GPUs only shrink
    and candidates only leave (are chosen), so a shape that found no free slots, or no
    victims for the same search, will find none later in the same decision. Teams' GPUs are
    the exception: they change in the pass (a team grows as its jobs start, shrinks as they are
    given notice), which can open reclaim, fair share, seniority or `above_guarantee` later in the pass for
    a search remembered as failed; such a job waits for the next decision. The
    one place GPUs come back is a placement on GPUs lent by draining jobs: it neither reads nor
    writes `no_fit`, and it takes every lent GPU back before it returns.
    """

    free: FreeGpus
    no_fit: set[Shape] = field(default_factory=set)
    """Shapes that did not fit on free GPUs."""
    no_victims: set[tuple[object, ...]] = field(default_factory=set)
    """(shape, *Preemptor.memo_key()) of searches that found no victims."""
    free_in: dict[tuple[tuple[Group, ...], int], int] = field(default_factory=dict)
    """Free GPUs in the nodes of some groups, by the teams' changes so far (what `no_fit` says)."""
    explained: dict[tuple[object, ...], Kept] = field(default_factory=dict)
    """What kept waiting jobs from victims, by `explain.reading` and the teams' changes so far
    (candidates are chosen only as teams change)."""
    _ever_fits: dict[tuple[Shape, ...], bool] = field(default_factory=dict)

    def shapes_of(self, job: Job) -> tuple[Shape, ...]:
        """Every way `job` could be laid out (computed once per kind of job and nodes' layout)."""
        key = (job.team, job.gpu_type, job.gpus, job.gpus_per_node)
        shapes = self.free.layout.shapes.get(key)
        if shapes is None:
            shapes = self.free.layout.shapes[key] = job_shapes(job, self.free)
        return shapes

    def nodes_of(self, shapes: tuple[Shape, ...]) -> list[int]:
        """Indexes of the nodes any of `shapes` may use, in pool order."""
        return sorted({i for shape in shapes for i in self.free.nodes_in(shape.groups)})

    def fit_slots(self, job: Job, rule: PlacementRule, *, lent: bool = False) -> list[Slot] | None:
        """Slots on the first of the job's shapes that fits, by `rule`; a shape that did not fit
        on free GPUs is remembered (see `no_fit`), unless GPUs were lent for the try."""
        for shape in self.shapes_of(job):
            if not lent and shape in self.no_fit:
                continue
            slots = choose_slots(shape, self.free, rule)
            if slots is not None:
                return slots
            if not lent:
                self.no_fit.add(shape)
        return None

    def fits_ever(self, shapes: tuple[Shape, ...]) -> bool:
        """Whether one of `shapes` fits its nodes when they are all empty."""
        if shapes not in self._ever_fits:
            self._ever_fits[shapes] = any(fits_empty(s, self.free) for s in shapes)
        return self._ever_fits[shapes]
