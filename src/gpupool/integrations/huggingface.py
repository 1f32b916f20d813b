"""Hugging Face `transformers.Trainer` under gpupool (`pip install gpupool[huggingface]`).

    gpupool = GpupoolTrainerCallback()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[gpupool])
    trainer.train(resume_from_checkpoint=gpupool.resume_from)

On notice the callback has the Trainer save (its own `checkpoint-N` folder: model, optimizer,
scheduler, RNG states, trainer state), moves that folder into one gpupool commits, acknowledges
and ends the process with exit code 75; `resume_from` is the newest whole checkpoint (None on a
first attempt), and the Trainer resumes from it, skipping the batches already trained on
(accelerate's `skip_first_batches`). It saves periodically too (`save_every`), and every save the
Trainer makes by its own `save_strategy` is committed the same way; heartbeats and the restart's
phases go to gpupool.

Checkpoints move out of `args.output_dir` into gpupool's folder (a rename when both are on one
filesystem), so the Trainer's `load_best_model_at_end`, which looks for them there, is refused,
and so is `save_strategy="best"` (the Trainer would drop a save on notice). On notice at a step
where the Trainer evaluates, the evaluation runs before the save, as it would have: the save
keeps the random state it left.
Multi-process training on one node works through the same rank agreement as `gpupool.job`
(tested here in one process only).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from gpupool.integrations.checkpointing import Checkpointing
from gpupool.job.checkpoints import CheckpointError
from gpupool.job.link import SchedulerLink

FOLDER = "trainer"
"""The Trainer's checkpoint folder, inside gpupool's."""


class GpupoolTrainerCallback(TrainerCallback):
    def __init__(
        self,
        *,
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
        self._save_began = time.monotonic()
        self._leaving = False
        self._save_at_epoch_end = False

    @property
    def resume_from(self) -> str | None:
        """For `trainer.train(resume_from_checkpoint=...)`: the newest whole checkpoint, or None."""
        path = self.gpupool.resume_from(FOLDER)
        return None if path is None else str(path)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        if args.load_best_model_at_end:
            raise ValueError(
                "load_best_model_at_end: the Trainer looks for its best checkpoint in output_dir, and"
                " GpupoolTrainerCallback moves every checkpoint into gpupool's folder; leave it False"
            )
        if getattr(args.save_strategy, "value", args.save_strategy) == "best":
            raise ValueError(
                'save_strategy="best": the Trainer would drop the save gpupool asks for on notice whenever'
                ' the metric did not improve; use "steps", "epoch" or "no"'
            )
        self.gpupool.training_started()

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        if self._leaving:  # the save asked for on notice did not happen: leave from the last one
            self.gpupool.leave()
        self.gpupool.first_step(state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        step = state.global_step
        self._save_began = time.monotonic()
        stop, save = self.gpupool.step_done(step)
        if stop and step >= state.max_steps:
            stop = False  # the last step: training ends now, the job completes
        if stop:
            if not self.gpupool.time_to_save(step):
                self.gpupool.leave()
            self._leaving = True
        if stop or save:
            if _ends_an_epoch(state):
                self._save_at_epoch_end = True  # after the epoch's evaluation, which a resume skips
            else:
                control.should_save = True

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        if self._save_at_epoch_end:
            self._save_at_epoch_end = False
            control.should_save = True

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        # The Trainer evaluates before it saves (the save keeps the random state the evaluation
        # left, as the next attempt needs it): the save's own time begins here.
        self._save_began = time.monotonic()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        step = state.global_step
        folder = self.gpupool.begin(step)
        self.gpupool.ranks.agree([0.0])  # every rank has written its part of checkpoint-N
        written = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        failed = ""
        if self.gpupool.ranks.first:
            try:
                shutil.move(written, folder / FOLDER)
            except OSError as exc:
                failed = str(exc)
        (bad,) = self.gpupool.ranks.agree([float(bool(failed))])  # every rank raises, or none
        if bad:
            raise CheckpointError(f"{written} did not move into gpupool's {folder}: {failed or 'on rank 0'}")
        self.gpupool.commit(folder, step, self._save_began, framework="transformers")
        if self._leaving:
            self.gpupool.leave()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        self.gpupool.complete(state.global_step)
        self.gpupool.link.restore_signals()


def _ends_an_epoch(state: TrainerState) -> bool:
    """Whether the step just done is an epoch's last (the Trainer's epoch is then whole)."""
    return state.epoch is not None and float(state.epoch).is_integer()
