"""A multi-node PyTorch job: `DistributedDataParallel` over gloo, one process per node, made
preemption-safe with `gpupool.job` (needs `pip install gpupool[torch]`).

    gpupool submit --gpus 4 --gpus-per-node 2 -- python -m gpupool.examples.ddp_trainer --steps 60

Each member joins the gang from the rendezvous gpupool gives it (`MASTER_ADDR`, `MASTER_PORT`,
`WORLD_SIZE`, `RANK`: `init_process_group("env://")`) and trains on its shard of the batches.
On notice the ranks agree on a step, save one checkpoint together and leave; the next attempt,
on whatever nodes it gets, resumes from it. Every step prints each rank's loss as exact bits,
and the end prints (on rank 0) a SHA-256 of the model and optimizer: a run preempted and resumed
on other nodes prints the same as one that was not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from gpupool.examples.torch_trainer import deterministic, state_hash
from gpupool.job import Batches, Job


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def build(
    rank: int, world: int, samples: int = 512, global_batch: int | None = None, dropout: float = 0.2
) -> tuple[nn.Module, torch.optim.Optimizer, Batches, DataLoader[Any]]:
    """The model (DDP over the process group), its optimizer, and this rank's batches: the same
    on every rank and in every attempt (seeded). `global_batch`: items a step takes whatever
    the world size (`Batches`; `train` accumulates each rank's batches of a step)."""
    torch.manual_seed(0)
    deterministic()
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(samples, 8, generator=data)
    targets = inputs.sum(dim=1, keepdim=True)
    batches = Batches(len(inputs), batch_size=8, seed=3, rank=rank, world=world, global_batch=global_batch)
    loader = DataLoader(TensorDataset(inputs, targets), batch_sampler=batches)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    return model, optimizer, batches, loader


def train(
    job: Job,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader[Any],
    steps: int,
    rank: int,
    step_seconds: float = 0.0,
    after_step: Callable[[int], None] = lambda _step: None,
    accumulation: int = 1,
) -> None:
    """The job's steps from where it resumed, each rank's loss printed as exact bits. Each step
    accumulates the gradients of `accumulation` batches (`Batches.accumulation`), averaged
    over the ranks once, at the last."""
    stream = iter(loader)
    for step in job.steps(steps):
        optimizer.zero_grad()
        loss = torch.zeros(())
        for k in range(accumulation):
            x, y = next(stream)
            last = k == accumulation - 1
            with (
                contextlib.nullcontext() if last or not isinstance(model, DistributedDataParallel) else model.no_sync()
            ):
                part = nn.functional.mse_loss(model(x), y)
                (part / accumulation if accumulation > 1 else part).backward()  # type: ignore[no-untyped-call]
            loss = part.detach() if accumulation == 1 else loss + part.detach() / accumulation
        optimizer.step()
        say(f"rank {rank} step {step} loss {float(loss.item()).hex()}")
        time.sleep(step_seconds)
        after_step(step)


def train_and_finish(
    job: Job,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader[Any],
    rank: int,
    args: argparse.Namespace,
    digest_of: Callable[[nn.Module, torch.optim.Optimizer], str],
) -> int:
    """Train to `--steps`, tell gpupool the job is done, print on rank 0 the hash of the final
    state, and leave the process group; the exit code. `digest_of` runs on every rank (a
    sharded state is gathered by all of them)."""
    train(job, model, optimizer, loader, args.steps, rank, args.step_seconds)
    job.finish()
    digest = digest_of(model, optimizer)
    if rank == 0:
        say(f"done: {args.steps} steps, state {digest}")
    dist.destroy_process_group()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step, to watch it")
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer, batches, loader = build(rank, world)
    job = Job(model=model, optimizer=optimizer, data=batches, save_every="auto", agree_every=0.1)
    node = os.environ.get("GPUPOOL_NODE", "here")
    say(f"rank {rank} of {world} on {node} [{os.environ.get('CUDA_VISIBLE_DEVICES', '')}]: from step {job.step}")
    return train_and_finish(job, model, optimizer, loader, rank, args, state_hash)


if __name__ == "__main__":
    sys.exit(main())
