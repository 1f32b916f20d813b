"""An elastic torch.distributed job (gloo, CPU) with `gpupool.job`, for the tests: one rank per
GPU it was given, so that a resize changes its world size.

    python elastic_ranks.py --steps 60 [--ranks N] [--until K] [--step-seconds S] [--global-batch G]

Under gpupool it runs `GPUPOOL_GPUS_ON_NODE` ranks (`--ranks` for a run by hand). With
--until K the ranks save a checkpoint together after step K and exit 0 without finishing: a run
by hand that stops where a resize stopped the job, to compare the steps after it with.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch.distributed as dist
from ranks import spawn

from gpupool.examples.ddp_trainer import build, say, train
from gpupool.examples.torch_trainer import state_hash
from gpupool.job import Job
from gpupool.up import free_port


def worker(rank: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.ranks)
    # A constant global batch (--global-batch): no dropout, whose masks would follow the ranks.
    dropout = 0.0 if args.global_batch else 0.2
    model, optimizer, batches, loader = build(rank, args.ranks, 256, args.global_batch, dropout)
    job = Job(model=model, optimizer=optimizer, data=batches, agree_every=0.05)
    say(f"rank {rank} of {args.ranks} from step {job.step}")
    accumulation = batches.accumulation

    if args.until >= 0:
        train(job, model, optimizer, loader, args.until + 1, rank, args.step_seconds, accumulation=accumulation)
        job.save()
        dist.destroy_process_group()
        return
    train(job, model, optimizer, loader, args.steps, rank, args.step_seconds, accumulation=accumulation)
    job.finish()
    if rank == 0:
        say(f"done: state {state_hash(model, optimizer)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ranks", type=int, default=int(os.environ.get("GPUPOOL_GPUS_ON_NODE", "1")))
    parser.add_argument("--until", type=int, default=-1)
    parser.add_argument("--global-batch", type=int, default=None, help="items a step takes at any world size")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    arguments = parser.parse_args()
    arguments.port = free_port()
    # gpupool's notice (SIGTERM) reaches the whole process group: the ranks save and leave on
    # it, and this parent, which has nothing to save, waits for them (as torchrun does).
    signal.signal(signal.SIGTERM, lambda *_: None)
    spawn(worker, arguments, ranks=arguments.ranks)
