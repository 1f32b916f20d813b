"""What the tests' rank scripts (`two_ranks.py`, `sharded_ranks.py`) share: each rank's job, a
notice that one rank alone sends itself, and the ranks spawned, ending as the scheduler sees
a job end."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable

import torch
import torch.multiprocessing as mp

from gpupool.examples.ddp_trainer import say
from gpupool.job import Batches, Job


def rank_job(
    rank: int,
    args: argparse.Namespace,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Batches,
    agree_every: float,
) -> Job:
    """This rank's job, resumed from the newest checkpoint: `GPUPOOL_FAILPOINT` applies on
    `--failpoint-rank` alone, periodic saves come every `--save-every` steps (none without)."""
    if rank != args.failpoint_rank:
        os.environ.pop("GPUPOOL_FAILPOINT", None)
    save_every = int(args.save_every) if args.save_every else None
    job = Job(model=model, optimizer=optimizer, data=batches, save_every=save_every, agree_every=agree_every)
    say(f"rank {rank} from step {job.step}")
    return job


def notice_after(step: int | None) -> Callable[[int], None]:
    """What runs after each training step: SIGTERM to this rank after `step` (None: never), a
    notice that it alone sees."""

    def notice(done: int) -> None:
        if done == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return notice


def spawn(worker: Callable[[int, argparse.Namespace], None], args: argparse.Namespace, ranks: int) -> None:
    """`worker(rank, args)` on `ranks` processes; exits as they ended: 75 when they left on
    notice, 128 + N when a rank was killed by signal N."""
    try:
        mp.spawn(worker, args=(args,), nprocs=ranks)  # type: ignore[attr-defined,no-untyped-call]
    except mp.ProcessExitedException as exc:  # type: ignore[attr-defined]
        sys.exit(exc.exit_code if exc.exit_code >= 0 else 128 - exc.exit_code)
