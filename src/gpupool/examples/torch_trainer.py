"""A PyTorch training job made preemption-safe with `gpupool.job` (needs `pip install gpupool[torch]`).

    gpupool submit --gpus 1 -- python -m gpupool.examples.torch_trainer --steps 200

A small network with dropout, SGD with momentum, a step LR schedule, and shuffled batches from
`gpupool.job.Batches`. Each step prints its loss as exact bits and the end prints a SHA-256 of
every model and optimizer tensor: a run preempted and resumed any number of times prints the
same as one that was not. It uses the GPU when there is one (`CUDA_VISIBLE_DEVICES` from gpupool).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpupool.job import Batches, Job, mark


def state_hash(*objects: Any) -> str:
    """SHA-256 over every tensor of the objects' state, in a fixed order."""
    sha = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            sha.update(value.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                sha.update(str(key).encode())
                feed(value[key])
        elif isinstance(value, list | tuple):
            for item in value:
                feed(item)
        else:
            sha.update(repr(value).encode())

    for obj in objects:
        feed(obj.state_dict())
    return sha.hexdigest()


def deterministic() -> None:
    """The same results from the same inputs, run after run, on a CPU or a GPU: PyTorch's
    deterministic algorithms, and cuBLAS's workspace set as CUDA needs for them (else a matrix
    product on a GPU raises; PyTorch's reproducibility notes). Before the first CUDA work."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def arguments(description: str | None) -> argparse.ArgumentParser:
    """The options every example trainer takes."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step, to watch it")
    parser.add_argument("--save-every", default="auto", help="steps, a duration like 30s, or auto")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument(
        "--save-in-line",
        dest="background",
        action="store_false",
        help="periodic saves block training (not in the background)",
    )
    args = parser.parse_args()
    mark("imports")
    torch.manual_seed(args.seed)
    deterministic()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.empty(1, device=device)  # CUDA's context, made now, so that its time has its own name
        mark("CUDA context")
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(512, 16, generator=data)
    targets = inputs @ torch.randn(16, 1, generator=data) + 0.1 * torch.randn(512, 1, generator=data)
    batches = Batches(len(inputs), batch_size=32, seed=args.seed)
    loader = DataLoader(TensorDataset(inputs, targets), batch_sampler=batches)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
    forward = torch.compile(model) if args.compile else model  # compiles at the first step
    mark("model build")
    save_every = int(args.save_every) if args.save_every.isdigit() else args.save_every
    job = Job(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        data=batches,
        save_every=save_every,
        save_in_background=args.background,
    )
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    print(f"attempt {job.link.attempt} on {device} [{gpus}]: from step {job.step}", flush=True)
    stream = iter(loader)
    for step in job.steps(args.steps):
        x, y = (t.to(device) for t in next(stream))
        loss = nn.functional.mse_loss(forward(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        scheduler.step()
        print(f"step {step} epoch {batches.epoch} loss {float(loss.item()).hex()}", flush=True)
        time.sleep(args.step_seconds)
    job.finish()
    print(f"done: {args.steps} steps, state {state_hash(model, optimizer, scheduler)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
