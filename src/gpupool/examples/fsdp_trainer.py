"""A sharded PyTorch job: FSDP2 (`fully_shard`) over gloo, made preemption-safe with
`gpupool.job`, whose checkpoints are then sharded (`torch.distributed.checkpoint`: every rank
writes its own shards). Needs `pip install gpupool[torch]`; runs on CPUs, and on GPUs (NCCL; untested here).

    gpupool submit --gpus 4 --gpus-per-node 2 -- python -m gpupool.examples.fsdp_trainer --steps 60
    torchrun --nproc-per-node 2 -m gpupool.examples.fsdp_trainer --steps 60    # outside gpupool

Every step prints each rank's loss as exact bits, and the end prints (on rank 0) a SHA-256 of
the whole model and optimizer state, gathered: a run preempted and resumed at the same world
size prints the same as one that was not; resumed at another world size (the shards are laid
out anew) the state it resumes from is the same, the steps after it are not bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from gpupool.examples.ddp_trainer import say, train_and_finish
from gpupool.examples.torch_trainer import deterministic
from gpupool.job import Batches, Job


def build(rank: int, world: int) -> tuple[nn.Module, torch.optim.Optimizer, Batches, DataLoader[Any]]:
    """The model, sharded over the ranks layer by layer, its Adam, and this rank's batches."""
    torch.manual_seed(0)
    deterministic()
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(512, 8, generator=data)
    targets = inputs.sum(dim=1, keepdim=True)
    batches = Batches(len(inputs), batch_size=8, seed=3, rank=rank, world=world)
    loader = DataLoader(TensorDataset(inputs, targets), batch_sampler=batches)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mesh = init_device_mesh(device, (world,))
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, optimizer, batches, loader


def full_state_hash(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 of the whole (unsharded) model and optimizer state: a collective, on every rank."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, said = get_state_dict(model, optimizer, options=options)
    optimizer_state: dict[str, Any] = dict(said)  # one optimizer: one mapping
    sha = hashlib.sha256()
    for key, tensor in sorted(model_state.items()):
        sha.update(key.encode() + torch.as_tensor(tensor).contiguous().numpy().tobytes())
    for key, moments in sorted(optimizer_state.get("state", {}).items()):  # rank 0 alone has them
        for name, value in sorted(moments.items()):
            sha.update(f"{key}.{name}".encode() + torch.as_tensor(value).contiguous().numpy().tobytes())
    return sha.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step, to watch it")
    parser.add_argument("--save-every", default="auto", help="steps, a duration like 30s, or auto")
    args = parser.parse_args()
    backend = "gloo"
    if torch.cuda.is_available():  # a CPU build has no NCCL to name
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer, batches, loader = build(rank, world)
    save_every = int(args.save_every) if args.save_every.isdigit() else args.save_every
    job = Job(model=model, optimizer=optimizer, data=batches, save_every=save_every, agree_every=0.1)
    say(f"rank {rank} of {world} on {os.environ.get('GPUPOOL_NODE', 'here')}: from step {job.step}")
    return train_and_finish(job, model, optimizer, loader, rank, args, full_state_hash)


if __name__ == "__main__":
    sys.exit(main())
