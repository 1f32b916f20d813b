"""A PyTorch Lightning job under gpupool (needs `pip install gpupool[lightning]`).

    gpupool submit --gpus 1 -- python -m gpupool.examples.lightning_trainer --steps 200
    gpupool submit --gpus 2 -- python -m gpupool.examples.lightning_trainer --devices 2 --val-every 8

The Lightning version of `gpupool.examples.torch_trainer`: the same small network with
dropout, SGD with momentum, a step LR schedule, shuffled batches from `gpupool.job.Batches`,
and `GpupoolCallback` for preemption. Each batch prints its loss as exact bits and the end a
SHA-256 of the model and optimizer state: preempted and resumed, it prints the same as a run
that was not.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpupool.examples.torch_trainer import arguments, deterministic, state_hash
from gpupool.integrations.lightning import GpupoolCallback
from gpupool.job import Batches, mark


class Regression(pl.LightningModule):
    def __init__(self, step_seconds: float, said: str = "", validation_seconds: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
        self.step_seconds = step_seconds
        self.said = said
        self.validation_seconds = validation_seconds

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        # One write a line: the processes of a DDP run share the output.
        print(
            f"{self.said}step {self.global_step} batch {batch_idx} loss {float(loss.item()).hex()}\n",
            end="",
            flush=True,
        )
        time.sleep(self.step_seconds)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.validation_seconds)
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--accumulate", type=int, default=1, help="batches of gradient accumulation per step")
    parser.add_argument("--val-every", type=int, default=0, help="validate every this many batches (0: never)")
    parser.add_argument("--validation-seconds", type=float, default=0.0, help="extra time per validation batch")
    parser.add_argument("--devices", type=int, default=1, help="more than 1: that many DDP processes on the CPU")
    args = parser.parse_args()
    mark("imports")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # Lightning's DDP sets it in the processes it starts
    said = f"rank {rank} " if args.devices > 1 else ""
    torch.manual_seed(args.seed + rank)  # each rank its own dropout; DDP makes the weights rank 0's
    deterministic()
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(512, 16, generator=data)
    targets = inputs @ torch.randn(16, 1, generator=data) + 0.1 * torch.randn(512, 1, generator=data)
    batches = Batches(len(inputs), batch_size=32, seed=args.seed, rank=rank, world=args.devices)
    loader = DataLoader(TensorDataset(inputs, targets), batch_sampler=batches)
    validation = DataLoader(TensorDataset(inputs[:64], targets[:64]), batch_size=32) if args.val_every else None
    model = Regression(args.step_seconds, said, args.validation_seconds)
    mark("model build")
    save_every = int(args.save_every) if args.save_every.isdigit() else args.save_every
    gpupool = GpupoolCallback(data=batches, save_every=save_every)
    several = {"accelerator": "cpu", "strategy": "ddp", "use_distributed_sampler": False} if args.devices > 1 else {}
    trainer = pl.Trainer(
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        callbacks=[gpupool],
        devices=args.devices,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        val_check_interval=args.val_every or None,
        check_val_every_n_epoch=None if args.val_every else 1,
        num_sanity_val_steps=0,
        **several,  # type: ignore[arg-type]
    )
    ckpt_path = gpupool.ckpt_path
    print(f"{said}attempt {gpupool.gpupool.link.attempt}: from {ckpt_path or 'the start'}\n", end="", flush=True)
    trainer.fit(model, loader, validation, ckpt_path=ckpt_path)
    print(f"{said}done: {args.steps} steps, state {state_hash(model, trainer.optimizers[0])}\n", end="", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
