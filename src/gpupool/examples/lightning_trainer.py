"""A PyTorch Lightning job under gpupool (needs `pip install gpupool[lightning]`).

    gpupool submit --gpus 1 -- python -m gpupool.examples.lightning_trainer --steps 200

The Lightning version of `gpupool.examples.torch_trainer`: the same small network with
dropout, SGD with momentum, a step LR schedule, shuffled batches from `gpupool.job.Batches`,
and `GpupoolCallback` for preemption. Each batch prints its loss as exact bits and the end a
SHA-256 of the model and optimizer state: preempted and resumed, it prints the same as a run
that was not.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpupool.examples.torch_trainer import state_hash
from gpupool.integrations.lightning import GpupoolCallback
from gpupool.job import Batches, mark


class Regression(pl.LightningModule):
    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
        self.step_seconds = step_seconds

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        print(f"step {self.global_step} batch {batch_idx} loss {float(loss.item()).hex()}", flush=True)
        time.sleep(self.step_seconds)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step, to watch it")
    parser.add_argument("--save-every", default="auto", help="steps, a duration like 30s, or auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=1, help="batches of gradient accumulation per step")
    args = parser.parse_args()
    mark("imports")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(512, 16, generator=data)
    targets = inputs @ torch.randn(16, 1, generator=data) + 0.1 * torch.randn(512, 1, generator=data)
    batches = Batches(len(inputs), batch_size=32, seed=args.seed)
    loader = DataLoader(TensorDataset(inputs, targets), batch_sampler=batches)
    model = Regression(args.step_seconds)
    mark("model build")
    save_every = int(args.save_every) if args.save_every.isdigit() else args.save_every
    gpupool = GpupoolCallback(data=batches, save_every=save_every)
    trainer = pl.Trainer(
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        callbacks=[gpupool],
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    ckpt_path = gpupool.ckpt_path
    print(f"attempt {gpupool.gpupool.link.attempt}: from {ckpt_path or 'the start'}", flush=True)
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    print(f"done: {args.steps} steps, state {state_hash(model, trainer.optimizers[0])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
