"""PyTorch Lightning under gpupool (`pip install gpupool[lightning]`).

    gpupool = GpupoolCallback(data=batches)            # batches: gpupool.job.Batches, optional
    trainer = lightning.pytorch.Trainer(max_steps=1000, callbacks=[gpupool])
    trainer.fit(model, DataLoader(dataset, batch_sampler=batches), ckpt_path=gpupool.ckpt_path)

On notice the callback saves through Lightning's own `trainer.save_checkpoint` (the model,
optimizers, schedulers, loop counters, every callback's state) into a folder gpupool commits,
acknowledges and ends the process with exit code 75; `ckpt_path` is the newest whole checkpoint
(None on a first attempt), so the next attempt resumes where this one left off. It saves
periodically too (`save_every`), heartbeats, and tells gpupool the restart's phases.

What Lightning leaves out of its checkpoints, the callback's own state carries: the random
number generators (restored when the first step begins) and the position in the data (`data`,
anything with state_dict/load_state_dict/advance, such as `gpupool.job.Batches`; a DataLoader
Lightning already saves, such as torchdata's StatefulDataLoader, needs none). Saves happen at
optimizer-step boundaries only (never in the middle of gradient accumulation).

While fitting, gpupool takes SIGTERM back from Lightning: Lightning's own handler would end the
step with an exception and the process with code 1, without a checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from gpupool.integrations.checkpointing import Checkpointing
from gpupool.job import state
from gpupool.job.link import SchedulerLink

CHECKPOINT = "lightning.ckpt"


class GpupoolCallback(Callback):
    def __init__(
        self,
        *,
        data: Any = None,
        save_every: int | str | None = "auto",
        keep: int = 2,
        heartbeat_every: float = 2.0,
        directory: str | Path | None = None,
        link: SchedulerLink | None = None,
    ) -> None:
        """`save_every`: optimizer steps, a duration ("10m"), "auto" or None (see `gpupool.job.Job`)."""
        self.gpupool = Checkpointing(
            save_every=save_every, keep=keep, heartbeat_every=heartbeat_every, directory=directory, link=link
        )
        self.data = data
        self._rng: dict[str, Any] | None = None
        self._last_step: int | None = None

    @property
    def ckpt_path(self) -> str | None:
        """For `trainer.fit(..., ckpt_path=...)`: the newest whole checkpoint, None if none."""
        path = self.gpupool.resume_from(CHECKPOINT)
        return None if path is None else str(path)

    # --- Lightning's hooks ----------------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.gpupool.training_started()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._last_step is None:
            self._last_step = trainer.global_step
            if self._rng is not None:  # after the DataLoader's iterator took its seed
                state.restore_rng(_native(self._rng))
                self._rng = None
            self.gpupool.first_step(trainer.global_step)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.data is not None:
            self.data.advance()
        step = trainer.global_step
        if step == self._last_step:  # accumulating gradients: not a step boundary
            return
        self._last_step = step
        stop, save = self.gpupool.step_done(step)
        if stop:
            if self.gpupool.time_to_save(step):
                self._save(trainer, step)
            self.gpupool.leave()
        if save:
            self._save(trainer, step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.gpupool.complete()

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": _portable(state.capture_rng()),
            "data": self.data.state_dict() if self.data is not None else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._rng = state_dict["rng"]
        if self.data is not None and state_dict.get("data") is not None:
            self.data.load_state_dict(state_dict["data"])

    # --- saving ---------------------------------------------------------------------------------

    def _save(self, trainer: pl.Trainer, step: int) -> None:
        began = time.monotonic()
        folder = self.gpupool.begin(step)
        trainer.save_checkpoint(folder / CHECKPOINT)  # a collective: every rank takes part
        self.gpupool.commit(folder, step, began, framework="lightning")


def _portable(rng: dict[str, Any]) -> dict[str, Any]:
    """The generators' state in what `torch.load(weights_only=True)` (Lightning's default for a
    local checkpoint) reads back: numpy's key array as plain integers."""
    name, keys, position, has_gauss, cached = rng["numpy"]
    return {**rng, "numpy": (name, keys.tolist(), position, has_gauss, cached)}


def _native(rng: dict[str, Any]) -> dict[str, Any]:
    import numpy

    name, keys, position, has_gauss, cached = rng["numpy"]
    return {**rng, "numpy": (name, numpy.asarray(keys, dtype=numpy.uint32), position, has_gauss, cached)}
