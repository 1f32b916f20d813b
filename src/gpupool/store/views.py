"""What people look at: every GPU of the pool with who holds it and why, and each team's use
of the pool against its guarantee and budgets. Reads only."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select, true
from sqlalchemy.orm import Session

from gpupool.model import job_label
from gpupool.settle import JobState
from gpupool.store.base import StoreBase
from gpupool.store.schema import AttemptRow, JobRow, NodeRow, PlacementRow


@dataclass(frozen=True, slots=True)
class GpuView:
    node: str
    gpu: int
    state: str
    """idle, allocated, draining (its job has notice, or reached its time limit) or held (free,
    kept for a preemptor)."""
    job: int | None = None
    team: str | None = None
    user: str | None = None
    for_job: int | None = None
    """For draining and held GPUs: the job they are freed or kept for."""
    job_label: str | None = None
    """The holder as people name it (`model.job_label`)."""
    for_label: str | None = None
    """`for_job` as people name it."""


class ViewsStore(StoreBase):
    def pool_view(self, names: Sequence[str] | None = None) -> tuple[list[NodeRow], list[GpuView]]:
        """Every node that is up (of `names`, if given) and every GPU on it, in order, in one read."""
        with self.reading() as s:
            chosen = select(NodeRow).where(NodeRow.up)
            if names is not None:
                chosen = chosen.where(NodeRow.name.in_(list(names)))
            nodes = list(s.scalars(chosen.order_by(NodeRow.name)))
            holders = s.execute(
                select(
                    PlacementRow.node,
                    PlacementRow.gpu,
                    JobRow.id,
                    JobRow.team,
                    JobRow.user,
                    AttemptRow.notice_for,
                    AttemptRow.notice_at,
                    AttemptRow.timeout_at,
                    JobRow.array_id,
                    JobRow.array_index,
                    PlacementRow.added,
                    AttemptRow.notice_keep,
                )
                .join(JobRow, JobRow.id == PlacementRow.job_id)
                .join(
                    AttemptRow,
                    (AttemptRow.job_id == PlacementRow.job_id) & (AttemptRow.attempt == PlacementRow.attempt),
                )
                .where(PlacementRow.held_until.is_(None))
                .where(PlacementRow.node.in_([n.name for n in nodes]) if names is not None else true())
            )
            held = {}
            growing: dict[tuple[str, int], int] = {}
            for node, gpu, job, team, user, notice_for, notice_at, timeout_at, array, index, added, keep in holders:
                if added:  # a free GPU a growth holds for the job's next attempt
                    growing[(node, gpu)] = job
                    continue
                stays = gpu in (keep or {}).get(node, ())  # what a resize keeps stays the job's
                notice = (None, None) if stays else (notice_for, notice_at)
                held[(node, gpu)] = (job, team, user, *notice, timeout_at, array, index)
            kept = {**self._kept(s), **growing}
            wanted = set(kept.values())
            wanted |= {notice_for for _, _, _, notice_for, *_ in held.values() if notice_for is not None}
            labels = self.labels_in(s, wanted)

        def _label(job_id: int | None) -> str | None:
            return None if job_id is None else labels.get(job_id, str(job_id))

        views = []
        for n in nodes:
            for gpu in range(n.gpus):
                key = (n.name, gpu)
                if key in held:
                    job, team, user, notice_for, notice_at, timeout_at, array, index = held[key]
                    leaving = notice_at is not None or timeout_at is not None  # notice, or its time limit
                    state = "draining" if leaving else "allocated"
                    label = job_label(job, array, index)
                    for_job = notice_for or kept.get(key)
                    views.append(GpuView(n.name, gpu, state, job, team, user, for_job, label, _label(for_job)))
                elif key in kept:
                    views.append(GpuView(n.name, gpu, "held", for_job=kept[key], for_label=_label(kept[key])))
                else:
                    views.append(GpuView(n.name, gpu, "idle"))
        return nodes, views

    @staticmethod
    def _kept(s: Session) -> dict[tuple[str, int], int]:
        """The free GPUs pending jobs hold for themselves while their victims drain: (node, GPU)
        → the job."""
        kept: dict[tuple[str, int], int] = {}
        waiting = select(JobRow.id, JobRow.held_gpus).where(
            JobRow.state == JobState.PENDING.value, JobRow.held_gpus.is_not(None)
        )
        for job_id, gpus in s.execute(waiting):
            for node, ids in (gpus or {}).items():
                for gpu in ids:
                    kept[(node, int(gpu))] = job_id
        return kept

    def team_use(self) -> tuple[Counter[str], Counter[str]]:
        """Per team: GPUs its live attempts hold now, and its pending jobs."""
        with self.reading() as s:
            using: Counter[str] = Counter()
            for team, _ in s.execute(
                select(JobRow.team, PlacementRow.id)
                .join(JobRow, JobRow.id == PlacementRow.job_id)
                .where(PlacementRow.held_until.is_(None))
            ):
                using[team] += 1
            pending: Counter[str] = Counter(
                team for (team,) in s.execute(select(JobRow.team).where(JobRow.state == JobState.PENDING.value))
            )
        return using, pending
