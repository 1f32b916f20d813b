"""The library a training job imports to survive preemption (PyTorch support: `gpupool[torch]`).

    from gpupool.job import Batches, Job

    job = Job(model=model, optimizer=optimizer, data=batches)
    for step in job.steps(total):
        ...
    job.finish()

It speaks gpupool's job protocol (docs/job-protocol.md); run outside gpupool, it checkpoints to
./checkpoints and simply trains.
"""

from gpupool.job.checkpoints import Checkpoint, CheckpointDir, CheckpointError, Restored
from gpupool.job.data import Batches
from gpupool.job.link import Notice, SchedulerLink
from gpupool.job.restart import mark
from gpupool.job.session import Job

__all__ = [
    "Batches",
    "Checkpoint",
    "CheckpointDir",
    "CheckpointError",
    "Job",
    "Notice",
    "Restored",
    "SchedulerLink",
    "mark",
]
