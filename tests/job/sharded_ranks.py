"""An FSDP2 job (`gpupool.examples.fsdp_trainer`) on N ranks over gloo, for the tests.

    python sharded_ranks.py --world 2 --steps 24 --port 29555 [--save-every 8]
        [--notice-at 10] [--failpoint-rank 1] [--resumed-hash]

--notice-at K: rank 0 sends itself SIGTERM after step K. --resumed-hash: print the SHA-256 of
the whole state right after the resume, before any step.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

from gpupool.examples.ddp_trainer import say, train
from gpupool.examples.fsdp_trainer import build, full_state_hash
from gpupool.job import Job


def worker(rank: int, args: argparse.Namespace) -> None:
    if rank != args.failpoint_rank:
        os.environ.pop("GPUPOOL_FAILPOINT", None)
    init = f"tcp://127.0.0.1:{args.port}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world)
    model, optimizer, batches, loader = build(rank, args.world)
    save_every = int(args.save_every) if args.save_every else None
    job = Job(model=model, optimizer=optimizer, data=batches, save_every=save_every, agree_every=0.05)
    say(f"rank {rank} from step {job.step}")
    if args.resumed_hash:
        digest = full_state_hash(model, optimizer)
        if rank == 0:
            say(f"resumed at step {job.step}: state {digest}")

    def notice(step: int) -> None:
        if rank == 0 and step == args.notice_at:
            os.kill(os.getpid(), signal.SIGTERM)

    train(job, model, optimizer, loader, args.steps, rank, 0.01, notice)
    job.finish()
    digest = full_state_hash(model, optimizer)
    if rank == 0:
        say(f"done at step {job.step}: state {digest}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--save-every", default="")
    parser.add_argument("--notice-at", type=int, default=-1)
    parser.add_argument("--failpoint-rank", type=int, default=-1)
    parser.add_argument("--resumed-hash", action="store_true")
    arguments = parser.parse_args()
    try:
        mp.spawn(worker, args=(arguments,), nprocs=arguments.world)  # type: ignore[attr-defined,no-untyped-call]
    except mp.ProcessExitedException as exc:  # type: ignore[attr-defined]
        sys.exit(exc.exit_code if exc.exit_code >= 0 else 128 - exc.exit_code)
