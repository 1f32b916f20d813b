"""What the tests' rank scripts (`two_ranks.py`, `sharded_ranks.py`) share: each rank's job, its
training with a notice that one rank alone sends itself, and the ranks spawned, ending as the
scheduler sees a job end."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from gpupool.examples.ddp_trainer import say, train
from gpupool.job import Batches, Job
from gpupool.job.session import LEAVE_CODE


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


def train_to_the_end(
    job: Job,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader[Any],
    args: argparse.Namespace,
    rank: int,
    step_seconds: float,
    notice_at: int | None,
) -> None:
    """Train to `--steps` (`ddp_trainer.train`), this rank sending itself SIGTERM after step
    `notice_at` (None: never), a notice that it alone sees; then finish the job."""

    def notice(step: int) -> None:
        if step == notice_at:
            os.kill(os.getpid(), signal.SIGTERM)

    train(job, model, optimizer, loader, args.steps, rank, step_seconds, notice)
    job.finish()


def spawn(worker: Callable[[int, argparse.Namespace], None], args: argparse.Namespace, ranks: int) -> None:
    """`worker(rank, args)` on `ranks` processes; exits as they ended: 75 when they left on
    notice, 128 + N when a rank was killed by signal N.

    A rank killed outright (SIGKILL: a failpoint, the OOM killer), or one that left on notice
    before the others were out of their last collective, breaks theirs, which then fail too (an
    error, or gloo's abort) and torch terminates the ranks left (SIGTERM), reporting whichever
    failure it noticed first: the killed rank, else the rank that left on notice, is what the
    job ended of, whatever came first (CI runs and loaded machines saw the others' first)."""
    context = mp.spawn(worker, args=(args,), nprocs=ranks, join=False)  # type: ignore[attr-defined,no-untyped-call]
    try:
        while not context.join():
            pass
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as exc:  # type: ignore[attr-defined]
        for process in context.processes:
            process.join()
        codes = [process.exitcode for process in context.processes]
        if -signal.SIGKILL in codes:
            sys.exit(128 + signal.SIGKILL)
        if LEAVE_CODE in codes:
            sys.exit(LEAVE_CODE)
        if isinstance(exc, mp.ProcessExitedException):  # type: ignore[attr-defined]
            sys.exit(exc.exit_code if exc.exit_code >= 0 else 128 - exc.exit_code)
        raise
