"""A two-rank torch.distributed (gloo, CPU) training job with `gpupool.job`, for the tests.

    python two_ranks.py --steps 30 --port 29555 [--notice-rank1-at 5] [--save-every 10 --failpoint-rank 1]

With --notice-rank1-at K, rank 1 alone sends itself SIGTERM after step K: both ranks must still
stop at the same step and save one checkpoint together.
"""

from __future__ import annotations

import argparse

import torch.distributed as dist
from ranks import rank_job, spawn, train_to_the_end

from gpupool.examples.ddp_trainer import build, say
from gpupool.examples.torch_trainer import state_hash


def worker(rank: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=2)
    model, optimizer, batches, loader = build(rank, 2, samples=256)
    # Steps of about 20 ms, ranks agreeing about every 0.1 s: every 5 steps or so.
    job = rank_job(rank, args, model, optimizer, batches, agree_every=0.1)
    train_to_the_end(job, model, optimizer, loader, args, rank, 0.02, args.notice_rank1_at if rank == 1 else None)
    if rank == 0:
        say(f"done: state {state_hash(model, optimizer)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--notice-rank1-at", type=int, default=-1)
    parser.add_argument("--save-every", default="", help="steps between periodic saves (none by default)")
    parser.add_argument("--failpoint-rank", type=int, default=-1, help="the rank GPUPOOL_FAILPOINT applies to")
    spawn(worker, parser.parse_args(), ranks=2)
