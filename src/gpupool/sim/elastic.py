"""Elastic jobs in a replay (`--elastic-share`): which of a trace's jobs are elastic, their
sizes, and how fast one runs at a size other than the trace's.

A trace gives each job one size and how long it ran at it. A share of its multi-GPU jobs,
drawn per job from a hash of its id (as `workload.assign_priority` draws classes), is made
elastic: it may run on as few as a quarter of its GPUs (at least one, or one gang member), in
steps of a gang member, by powers of two where its size is one (16: 4, 8, 16), else one GPU.

Speed-up: Amdahl's law with a parallel fraction `p` (`DEFAULT_PARALLEL`). On n GPUs a job runs
at S(n) = 1 / ((1 - p) + p / n); at n GPUs rather than its trace's N it progresses at
S(n) / S(N) of the trace's pace. Not Pollux's model: Pollux fits each job's throughput and
statistical efficiency as its batch size changes, online, from the job's own gradients, which
a trace does not have; Amdahl's law needs one number, says plainly what it assumes (the job's
per-GPU batch is kept, its serial part does not shrink), and p = 1 is linear scaling, the
most a resize could ever gain.
"""

from __future__ import annotations

import hashlib

from gpupool.shapes import POWERS_OF_TWO, elastic_problem, elastic_sizes

DEFAULT_PARALLEL = 0.95
"""The parallel fraction of an elastic job's work: a 16-GPU job shrunk to 4 runs at 38 % of
its pace (linear scaling would say 25 %), and one grown from 4 to 16 gains 2.6 times, not 4."""


def is_drawn(job_id: str, share: float) -> bool:
    """Whether `job_id` is among `share` of jobs: the same in every process and Python version
    (the big-endian blake2b-64 of a salted id, over 2**64, below `share`)."""
    digest = hashlib.blake2b(b"elastic:" + job_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < share


def sizes_of(gpus: int, gpus_per_node: int | None) -> tuple[int, ...]:
    """The sizes of a job of `gpus` GPUs made elastic, smallest first; () for one that cannot
    be (a single GPU, or a single gang member)."""
    unit = gpus_per_node or 1
    if gpus <= unit:
        return ()
    if gpus & (gpus - 1) == 0 and unit & (unit - 1) == 0:
        smallest = max(unit, gpus // 4)
        step: int | str = POWERS_OF_TWO
    else:
        smallest = max(unit, -(-gpus // 4 // unit) * unit)
        step = unit
        smallest += (gpus - smallest) % unit
    if elastic_problem(smallest, gpus, step, gpus_per_node) is not None:
        return ()
    return elastic_sizes(smallest, gpus, step, gpus_per_node)


def pace(size: int, largest: int, parallel: float) -> float:
    """How fast a job runs on `size` of the `largest` GPUs its trace ran it on, as a share of
    the trace's pace (Amdahl's law); exactly 1.0 at its trace's size."""
    if size == largest:
        return 1.0
    return speedup(size, parallel) / speedup(largest, parallel)


def speedup(gpus: int, parallel: float) -> float:
    """Amdahl's speed-up on `gpus` GPUs of work whose `parallel` fraction divides among them."""
    return 1.0 / ((1.0 - parallel) + parallel / gpus)
