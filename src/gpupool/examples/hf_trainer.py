"""A Hugging Face `transformers.Trainer` job under gpupool (needs `pip install gpupool[huggingface]`).

    gpupool submit --gpus 1 -- python -m gpupool.examples.hf_trainer --steps 200

A tiny GPT-2 built from a config (nothing is downloaded), trained as a language model on random
token sequences with dropout, AdamW and a linear schedule, with `GpupoolTrainerCallback` for
preemption. Each step prints its loss as exact bits and the end a SHA-256 of the model's state:
preempted and resumed, it prints the same as a run that was not.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from gpupool.examples.torch_trainer import arguments, state_hash
from gpupool.integrations.huggingface import GpupoolTrainerCallback
from gpupool.job import mark


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, count: int, length: int, vocabulary: int) -> None:
        self.ids = torch.randint(0, vocabulary, (count, length), generator=torch.Generator().manual_seed(1234))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class PrintingTrainer(transformers.Trainer):
    step_seconds = 0.0

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if not model.training:
            return loss  # evaluating
        value = loss[0] if isinstance(loss, tuple) else loss
        print(f"step {self.state.global_step} loss {float(value.item()).hex()}", flush=True)
        time.sleep(self.step_seconds)
        return loss

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        metrics = super().evaluate(*args, **kwargs)
        print(f"evaluated at step {self.state.global_step}: loss {metrics['eval_loss'].hex()}", flush=True)
        return metrics


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--eval-epoch", action="store_true", help="evaluate at the end of every epoch")
    args = parser.parse_args()
    mark("imports")
    logging.getLogger("transformers").setLevel(logging.WARNING)
    save_every = int(args.save_every) if args.save_every.isdigit() else args.save_every
    gpupool = GpupoolTrainerCallback(save_every=save_every)
    shape = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 16, "vocab_size": 64}
    config = transformers.GPT2Config(**shape)  # type: ignore[no-untyped-call]
    transformers.set_seed(args.seed)
    model = transformers.GPT2LMHeadModel(config)  # type: ignore[no-untyped-call]
    mark("model build")
    training = transformers.TrainingArguments(
        output_dir=str(Path(os.environ.get("GPUPOOL_CHECKPOINT_DIR", "checkpoints")) / "trainer-output"),
        max_steps=args.steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        save_strategy="no",
        eval_strategy="epoch" if args.eval_epoch else "no",
        per_device_eval_batch_size=8,
        logging_strategy="no",
        report_to=[],
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = PrintingTrainer(
        model=model,
        args=training,
        train_dataset=Tokens(256, 16, 64),
        eval_dataset=Tokens(32, 16, 64) if args.eval_epoch else None,
        callbacks=[gpupool],
    )
    PrintingTrainer.step_seconds = args.step_seconds
    resume_from = gpupool.resume_from
    print(f"attempt {gpupool.gpupool.link.attempt}: from {resume_from or 'the start'}", flush=True)
    trainer.train(resume_from_checkpoint=resume_from)
    print(f"done: {args.steps} steps, state {state_hash(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
