"""A two-rank torch.distributed (gloo, CPU) training job with `gpupool.job`, for the tests.

    python two_ranks.py --steps 30 --port 29555 [--notice-rank1-at 5] [--save-every 10 --failpoint-rank 1]

With --notice-rank1-at K, rank 1 alone sends itself SIGTERM after step K: both ranks must still
stop at the same step and save one checkpoint together.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

from gpupool.examples.ddp_trainer import build, train
from gpupool.examples.torch_trainer import state_hash
from gpupool.job import Job


def say(line: str) -> None:
    """One write per line: two ranks share the output pipe, and print() may split a line."""
    os.write(1, (line + "\n").encode())


def worker(rank: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=2)
    model, optimizer, batches, loader = build(rank, 2, samples=256)
    # Steps of about 20 ms, ranks agreeing about every 0.1 s: every 5 steps or so.
    if rank != args.failpoint_rank:
        os.environ.pop("GPUPOOL_FAILPOINT", None)
    save_every = int(args.save_every) if args.save_every else None
    job = Job(model=model, optimizer=optimizer, data=batches, save_every=save_every, agree_every=0.1)
    say(f"rank {rank} from step {job.step}")

    def notice_rank1(step: int) -> None:
        if rank == 1 and step == args.notice_rank1_at:
            os.kill(os.getpid(), signal.SIGTERM)

    train(job, model, optimizer, loader, args.steps, rank, 0.02, notice_rank1)
    job.finish()
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
    try:
        mp.spawn(worker, args=(parser.parse_args(),), nprocs=2)  # type: ignore[attr-defined,no-untyped-call]
    except mp.ProcessExitedException as exc:  # type: ignore[attr-defined]
        # 75 when the ranks left on notice; 128 + N when a rank was killed by signal N.
        sys.exit(exc.exit_code if exc.exit_code >= 0 else 128 - exc.exit_code)
