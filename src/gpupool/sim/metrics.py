"""What a replay measured: waits, completion times, utilization, lost work, goodput, fairness."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gpupool.sim.records import JobRecord, Outcome

Stats = dict[str, float]


def stats(values: Sequence[float]) -> Stats:
    """Mean and p50/p95/p99 (linear interpolation), in seconds; zeros for no values."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    array = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(array, [50, 95, 99])
    return {"mean": _r(array.mean()), "p50": _r(p50), "p95": _r(p95), "p99": _r(p99)}


def _r(value: float) -> float:
    """Round for stable, readable JSON."""
    return round(float(value), 6)


def jct(record: JobRecord) -> float:
    assert record.finish is not None
    return record.finish - record.job.submit


def slowdown(record: JobRecord) -> float:
    return jct(record) / max(record.job.work, 1.0)


def useful_of(record: JobRecord) -> float:
    """GPU-seconds of a finished job's work: its trace's size times its run time, or, for an
    elastic job, what its attempts took at their sizes (at another size, the same work costs
    other GPU-seconds: `sim.elastic.pace`)."""
    return record.useful if record.job.sizes else record.job.gpus * record.job.work


def jain(values: Iterable[float]) -> float:
    """Jain's index: 1 when all equal, 1/n when one takes everything."""
    xs = list(values)
    if not xs:
        return 1.0
    total = sum(xs)
    squares = sum(x * x for x in xs)
    return _r(total * total / (len(xs) * squares)) if squares else 1.0


def young_daly(save_cost: float, records: Sequence[JobRecord]) -> float | None:
    """The checkpoint interval √(2·δ·M) for the observed mean time M between interruptions
    (preemptions, lost nodes and resizes) of a running job, or None when nothing was interrupted."""
    interruptions = sum(r.preemptions + r.node_losses + r.resizes for r in records)
    if not interruptions:
        return None
    running_seconds = sum(r.allocated / r.job.gpus for r in records)
    return _r(math.sqrt(2 * save_cost * running_seconds / interruptions))


def group(
    records: Sequence[JobRecord], capacity: int, span: float, *, failures: bool = False, trace_failures: bool = False
) -> dict[str, Any]:
    """The measures of a set of ended jobs (a class, a team or all of them) on a pool of
    `capacity` GPUs busy for `span` seconds. With node `failures`, lost nodes and the lost work
    split by cause (preemption, node_lost); with `trace_failures` (jobs the trace says failed),
    the part their failures cost too (failure). A job that lost too many nodes counts in the
    GPU-time allocated and lost, not in the jobs, waits, completion times or useful work (it
    never reached its end); one the trace says failed counts everywhere, and its useful work is
    what it had committed when it failed."""
    allocated = sum(r.allocated for r in records)
    done = [r for r in records if r.finish is not None]
    useful = sum(useful_of(r) - r.lost_to_failure for r in done)
    wasted, drain, restart = (sum(getattr(r, f) for r in records) / 3600 for f in ("wasted", "drain", "restart"))
    split: dict[str, Any] = {}
    elastic = any(r.job.sizes for r in records)
    to_resizes = sum(r.lost_to_resizes for r in records) / 3600
    if failures or trace_failures:
        to_nodes = sum(r.lost_to_nodes for r in records) / 3600
        to_failures = sum(r.lost_to_failure for r in records) / 3600
        by_cause = {"preemption": _r(wasted + drain + restart - to_nodes - to_failures - to_resizes)}
        if elastic:
            by_cause["resize"] = _r(to_resizes)
        if failures:
            split["node_losses"] = sum(r.node_losses for r in records)
            by_cause["node_lost"] = _r(to_nodes)
        if trace_failures:
            by_cause["failure"] = _r(to_failures)
        split["lost_gpu_hours_by_cause"] = by_cause
    if elastic:
        split["resizes"] = sum(r.resizes for r in records)
        split["lost_gpu_hours_to_resizes"] = _r(to_resizes)
    return {
        "jobs": len(done),
        "utilization": _r(allocated / (capacity * span)) if span > 0 else 0.0,
        "wait": stats([r.wait for r in done]),
        "jct": stats([jct(r) for r in done]),
        "preemptions": sum(r.preemptions for r in records),
        "gpu_hours": _r(useful / 3600),
        "lost_gpu_hours": {
            "wasted": _r(wasted),
            "drain": _r(drain),
            "restart": _r(restart),
            "total": _r(wasted + drain + restart),
        },
        "goodput": _r(useful / allocated) if allocated else 1.0,
        **split,
    }


def summarize(policy: str, outcome: Outcome, save_cost: float, *, failures: bool = False) -> dict[str, Any]:
    """The report of one policy's replay, in the shape of `gpupool simulate --json`: the measures
    of `group` for all jobs, per priority class and per team, and fairness across teams; with
    `failures`, how many nodes failed and the GPU-hours they were out; where the trace says jobs
    failed, how many (`trace_failed_jobs`)."""
    done = [r for r in outcome.records if r.finish is not None]
    trace_failed = sum(r.job.fails for r in outcome.records)
    causes = {"failures": failures, "trace_failures": trace_failed > 0}
    ended = [r for r in outcome.records if r.finish is not None or r.failed]
    by_priority: dict[str, list[JobRecord]] = defaultdict(list)
    by_team: dict[str, list[JobRecord]] = defaultdict(list)
    for r in ended:
        by_priority[r.job.priority].append(r)
        by_team[r.job.team].append(r)
    span = max(r.finish or 0.0 for r in done) - min(r.job.submit for r in done) if done else 0.0
    overall = group(ended, outcome.capacity, span, **causes)
    del overall["gpu_hours"]  # all the jobs' work, failed ones' too, is the trace's:
    trace_gpu_hours = _r(sum(r.job.gpus * r.job.work for r in done) / 3600)
    return {
        "policy": policy,
        "gpus": outcome.capacity,
        **overall,
        "by_priority": {name: group(rs, outcome.capacity, span, **causes) for name, rs in sorted(by_priority.items())},
        "by_team": {name: group(rs, outcome.capacity, span, **causes) for name, rs in sorted(by_team.items())},
        "trace_gpu_hours": trace_gpu_hours,
        # Over the teams with a finished job: one whose jobs all failed has no slowdown to weigh.
        "fairness": jain(
            float(np.mean(slowdowns))
            for rs in by_team.values()
            if (slowdowns := [slowdown(r) for r in rs if r.finish is not None])
        ),
        "young_daly_interval": young_daly(save_cost, ended),
        "decisions": outcome.decisions,
        **(
            {
                "node_failures": outcome.node_failures,
                "node_down_gpu_hours": _r(outcome.node_down / 3600),
                "failed_jobs": sum(r.failed for r in outcome.records),
            }
            if failures
            else {}
        ),
        **({"trace_failed_jobs": trace_failed} if trace_failed else {}),
    }
