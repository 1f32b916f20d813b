"""An FSDP2 job (`gpupool.examples.fsdp_trainer`) on N ranks over gloo, for the tests.

    python sharded_ranks.py --world 2 --steps 24 --port 29555 [--save-every 8]
        [--notice-at 10] [--failpoint-rank 1] [--resumed-hash]

--notice-at K: rank 0 sends itself SIGTERM after step K. --resumed-hash: print the SHA-256 of
the whole state right after the resume, before any step.
"""

from __future__ import annotations

import argparse

import torch.distributed as dist
from ranks import rank_job, spawn, train_to_the_end

from gpupool.examples.ddp_trainer import say
from gpupool.examples.fsdp_trainer import build, full_state_hash


def worker(rank: int, args: argparse.Namespace) -> None:
    init = f"tcp://127.0.0.1:{args.port}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world)
    model, optimizer, batches, loader = build(rank, args.world)
    job = rank_job(rank, args, model, optimizer, batches, agree_every=0.05)
    if args.resumed_hash:
        digest = full_state_hash(model, optimizer)
        if rank == 0:
            say(f"resumed at step {job.step}: state {digest}")
    train_to_the_end(job, model, optimizer, loader, args, rank, 0.01, args.notice_at if rank == 0 else None)
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
    spawn(worker, arguments, ranks=arguments.world)
