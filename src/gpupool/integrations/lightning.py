"""PyTorch Lightning under gpupool (`pip install gpupool[lightning]`).

    gpupool = GpupoolCallback(data=batches)            # batches: gpupool.job.Batches, optional
    trainer = lightning.pytorch.Trainer(max_steps=1000, callbacks=[gpupool])
    trainer.fit(model, DataLoader(dataset, batch_sampler=batches), ckpt_path=gpupool.ckpt_path)

On notice the callback saves through Lightning's own `trainer.save_checkpoint` (the model,
optimizers, schedulers, loop counters, every callback's state) into a folder gpupool commits,
acknowledges and ends the process with exit code 75; `ckpt_path` is the newest whole checkpoint
(None on a first attempt), so the next attempt resumes where this one left off. It saves
periodically too (`save_every`), heartbeats, and tells gpupool the restart's phases.

What Lightning leaves out of its checkpoints, the callback writes beside them, one file a rank
(`rank-N.pt`, as `gpupool.job` does): the random number generators and the position in the data
(`data`, anything with state_dict/load_state_dict/advance, such as `gpupool.job.Batches`; a
DataLoader Lightning already saves, such as torchdata's StatefulDataLoader, needs none). Lightning
writes its checkpoint at the end of an optimizer step (never in the middle of gradient
accumulation); the generators are taken, and the checkpoint committed, when the next batch
begins, after what Lightning does in between and does not do again on resume (a validation, an
epoch's end): so a resumed run draws the random numbers the uninterrupted one drew.

Under gpupool, Lightning starts a process for each of its devices itself (`devices=N`, and
`num_nodes` for a job across nodes): the callback, made before the Trainer, takes away the
variables gpupool sets for one process a node, which Lightning would take to mean that someone
else had started them.

While fitting, gpupool takes SIGTERM back from Lightning: Lightning's own handler would end the
step with an exception and the process with code 1, without a checkpoint; after `fit` the
handlers from before the callback are back.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from gpupool.integrations.checkpointing import Checkpointing
from gpupool.job import state
from gpupool.job.checkpoints import CheckpointError
from gpupool.job.link import SchedulerLink

CHECKPOINT = "lightning.ckpt"
log = logging.getLogger("gpupool.job")


def _let_lightning_start_its_processes() -> None:
    """gpupool starts one process a node, with torch.distributed's variables for one process a
    node; Lightning takes a LOCAL_RANK in the environment to mean that someone else started one
    process a device, and waits for the others forever. Without them it starts its own, across
    the nodes of a gang too (MASTER_ADDR, MASTER_PORT and NODE_RANK stay)."""
    env = os.environ
    if env.get("GPUPOOL_JOB_ID") and env.get("LOCAL_WORLD_SIZE") == "1" and "TORCHELASTIC_RUN_ID" not in env:
        for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE"):
            env.pop(name, None)


@dataclass
class _Written:
    """A checkpoint Lightning has written, to commit when the next batch begins."""

    folder: Path
    step: int
    seconds: float
    """How long Lightning's write blocked training."""
    data: Any
    leaving: bool


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
        _let_lightning_start_its_processes()
        self.gpupool = Checkpointing(
            save_every=save_every, keep=keep, heartbeat_every=heartbeat_every, directory=directory, link=link
        )
        self.data = data
        self._rng: dict[str, Any] | None = None
        self._last_step: int | None = None
        self._written: _Written | None = None
        self._completed = False
        self._validation_began = 0.0
        self._validation_batch = 0.0
        """The longest a validation batch took: what waiting for one more may cost on notice."""

    @property
    def ckpt_path(self) -> str | None:
        """For `trainer.fit(..., ckpt_path=...)`: the newest whole checkpoint, None if none."""
        path = self.gpupool.resume_from(CHECKPOINT)
        return None if path is None else str(path)

    # --- Lightning's hooks ----------------------------------------------------------------------

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        restored = self.gpupool.restored
        if restored is None or trainer.ckpt_path is None:
            return
        if Path(trainer.ckpt_path) != restored.checkpoint.path / CHECKPOINT:
            return  # not resuming from what `ckpt_path` found: that start keeps its own state
        # Before the DataLoader's first iterator: the data's position. At another world size (an
        # elastic job resized) a rank takes the random state and position of rank r % old world,
        # the position resharded, as `gpupool.job` does; Lightning's state is DDP's, replicated.
        world = int(restored.checkpoint.manifest.get("world", 1))
        resharded = world != trainer.world_size
        name = restored.checkpoint.path.name
        mine = restored.checkpoint.path / state.rank_file(trainer.global_rank % world)
        if not mine.exists():
            raise CheckpointError(f"{name} has no state for rank {trainer.global_rank} (saved by {world} ranks)")
        saved = state.read(mine, mmap=False)
        self._rng = saved["rng"]
        if self.data is not None and saved["data"] is not None:
            position = saved["data"]
            if resharded:
                if not hasattr(self.data, "resharded"):
                    raise CheckpointError(
                        f"{name} was written by {world} ranks: `data` must say how its position moves to another "
                        "world size (a `resharded` method, as `Batches` has)"
                    )
                position = self.data.resharded(position)
                log.warning("%s resharded from %s ranks to %s: not bit-identical", name, world, trainer.world_size)
            self.data.load_state_dict(position)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.gpupool.training_started()
        connector = getattr(trainer, "_signal_connector", None)
        if connector is not None and hasattr(connector, "received_sigterm"):
            # A SIGTERM before this reached gpupool too (Lightning chains the handler it found):
            # gpupool handles it at the next step boundary, Lightning must not end the run for it.
            connector.received_sigterm = False
        originals = getattr(connector, "_original_handlers", None)
        if isinstance(originals, dict):
            # What Lightning puts back at its teardown, on every path out of fit (an exception
            # too): the handlers from before gpupool's, not gpupool's.
            for signum, handler in self.gpupool.link.previous_handlers().items():
                if signum in originals:
                    originals[signum] = handler

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._last_step is None:
            self._last_step = trainer.global_step
            if self._rng is not None:  # after the DataLoader's iterator took its seed
                state.restore_rng(self._rng)
                self._rng = None
            self.gpupool.first_step(trainer.global_step)
        self._commit_written()

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
        if stop and not self.gpupool.time_to_save(step):
            self.gpupool.leave()
        if stop or save:
            self._write(trainer, step, leaving=stop)

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._validation_began = time.monotonic()
        written = self._written
        if written is None or not written.leaving:
            return
        if self.gpupool.out_of_time(written.seconds + self._validation_batch):
            # The validation that follows the step would run past the deadline: commit now (the
            # next attempt's random numbers may then differ from an uninterrupted run's).
            log.warning("the deadline is near: step %s committed before the validation after it", written.step)
            self._commit_written()

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._validation_batch = max(self._validation_batch, time.monotonic() - self._validation_began)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._commit_written(ending=True)
        self._completed = True
        self.gpupool.complete(trainer.global_step)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and not self._completed and trainer.fit_loop.done:
            # Resumed from the last step: Lightning skips the training and its hooks.
            self._completed = True
            self.gpupool.training_started()
            self.gpupool.complete(trainer.global_step)
        self.gpupool.link.restore_signals()  # after Lightning put back the handlers it found

    # --- saving ---------------------------------------------------------------------------------

    def _write(self, trainer: pl.Trainer, step: int, *, leaving: bool) -> None:
        began = time.monotonic()
        folder = self.gpupool.begin(step)
        trainer.save_checkpoint(folder / CHECKPOINT)  # a collective: every rank takes part
        data = copy.deepcopy(self.data.state_dict()) if self.data is not None else None
        self._written = _Written(folder, step, time.monotonic() - began, data, leaving)

    def _commit_written(self, *, ending: bool = False) -> None:
        written, self._written = self._written, None
        if written is None:
            return
        began = time.monotonic()
        state.write(written.folder / state.rank_file(self.gpupool.ranks.rank), state.rank_state(written.data))
        # What blocked training: Lightning's write and this commit, not what ran between them.
        self.gpupool.commit(written.folder, written.step, began - written.seconds, framework="lightning")
        if written.leaving and not ending:
            self.gpupool.leave()
