"""A lab's own history as a trace: each ended job of the live store as one row of the normalised
`jobs.csv` format, with what the simulator needs to replay it as it ran (its class, GPU type,
gang shape, and the save and restart costs it was seen to pay) and what happened to it (its
wait, preemptions and lost nodes), so that a replay can be held against it. Pure: the store
hands it the jobs and their attempt records.

A row's `duration` is the work the job did: its productive GPU time over its attempts divided
by its GPUs (start-ups, saves, drains and work done again left out, as the simulator adds its
own), with, for a failed job, the work its failure lost (the replay fails it at the end of
it); of a job that never reports its progress, its attempts' whole time. `submit_time` counts
seconds from the first exported job's submission; `submit_datetime` is UTC.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

from gpupool.accounting import AttemptRecord, account, used
from gpupool.settle import Usage

COLUMNS: tuple[str, ...] = (
    "job_id",
    "submit_time",
    "submit_datetime",
    "num_gpus",
    "duration",
    "vc",
    "user",
    "status",
    "class",
    "team",
    "gpu_type",
    "gpus_per_node",
    "save_cost",
    "restart_cost",
    "wait",
    "preemptions",
    "node_losses",
    "max_rss",
    "cpu_time",
    "max_gpu_memory",
)
"""`vc` and `team` both hold the team: `vc` is the normalised format's name for it. `max_rss`
(bytes, its attempts' largest peak), `cpu_time` (seconds, all attempts) and `max_gpu_memory`
(bytes) are what its cgroups and NVML counted, as `sacct`'s MaxRSS and TotalCPU; empty where
nothing counted."""


@dataclass(frozen=True, slots=True)
class EndedJob:
    """What the store knows of an ended job besides its attempts."""

    id: int
    team: str
    priority: str
    gpus: int
    gpus_per_node: int | None
    gpu_type: str | None
    user: str | None
    state: str
    submit_time: float
    preemptions: int
    node_losses: int


@dataclass(frozen=True, slots=True)
class HistoryJob:
    """One exported job; times in seconds, None where nothing was seen."""

    job: EndedJob
    duration: float | None
    """None: it never held GPUs (cancelled while it waited)."""
    wait: float | None
    """Seconds pending before each of its attempts, requeues included."""
    save_cost: float | None
    """Mean time its checkpoint saves blocked training."""
    restart_cost: float | None
    """Mean time its resumed attempts took from allocation to their first productive step."""
    usage: Usage | None = None
    """What its attempts used, together."""


def history_job(job: EndedJob, attempts: Sequence[AttemptRecord]) -> HistoryJob:
    """The exported view of `job` from its attempts (in any order)."""
    ordered = sorted(attempts, key=lambda a: a.attempt)
    if not ordered:
        return HistoryJob(job, None, None, None, None)
    end = max(a.released_at or a.allocated_at for a in ordered)
    costs = account(job.id, job.team, job.priority, ordered, end).attempts
    duration = sum(c.productive + c.unreported for c in costs) / job.gpus
    if job.state == "failed":
        # The work since its last commit is lost, but it ran: the replay fails it at the end.
        duration += costs[-1].wasted / job.gpus
    wait, since = 0.0, job.submit_time
    for a in ordered:
        wait += max(0.0, a.allocated_at - since)
        since = a.released_at if a.released_at is not None else a.allocated_at
    saves = [c.seconds for a in ordered for c in a.commits if c.seconds > 0]
    restarts = [a.productive_at - a.allocated_at for a in ordered[1:] if a.productive_at is not None]
    return HistoryJob(
        job,
        duration,
        wait,
        sum(saves) / len(saves) if saves else None,
        sum(restarts) / len(restarts) if restarts else None,
        used(ordered),
    )


def write_history(jobs: Iterable[HistoryJob], stream: TextIO) -> int:
    """Write `jobs` as CSV (the header, then a row each, by submission); the number of rows."""
    ordered = sorted(jobs, key=lambda h: (h.job.submit_time, h.job.id))
    origin = ordered[0].job.submit_time if ordered else 0.0
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(COLUMNS)
    for h in ordered:
        job = h.job
        submitted = datetime.fromtimestamp(job.submit_time, UTC).strftime("%Y-%m-%d %H:%M:%S")
        writer.writerow(
            [
                job.id,
                _seconds(job.submit_time - origin),
                submitted,
                job.gpus,
                _seconds(h.duration),
                job.team,
                job.user or "",
                job.state,
                job.priority,
                job.team,
                job.gpu_type or "",
                job.gpus_per_node or "",
                _seconds(h.save_cost),
                _seconds(h.restart_cost),
                _seconds(h.wait),
                job.preemptions,
                job.node_losses,
                *_used(h.usage),
            ]
        )
    return len(ordered)


def _used(usage: Usage | None) -> list[str]:
    if usage is None:
        return ["", "", ""]
    return [
        "" if usage.peak_memory is None else str(usage.peak_memory),
        _seconds(usage.cpu_seconds),
        "" if usage.peak_gpu_memory is None else str(usage.peak_gpu_memory),
    ]


def _seconds(value: float | None) -> str:
    """Milliseconds are enough for a replay, and keep the file readable."""
    return "" if value is None else f"{value:.3f}"
