"""A plain-Python training job (no PyTorch) made preemption-safe with `gpupool.job`.

    gpupool submit -- python -m gpupool.examples.trainer --steps 40 --step-seconds 0.2 --save-every 5

A toy model fits a line by stochastic gradient descent on samples it draws from `random` and
NumPy, so that an exact resume matters: each step prints its loss as exact bits, and a run that
was preempted and resumed prints the same ones as a run that was not. `gpupool.job` does the
rest: resume from the newest whole checkpoint, heartbeats, periodic saves, and on notice a save,
an acknowledgement and exit. Run outside gpupool it simply trains (checkpoints in ./checkpoints).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

import numpy

from gpupool.job import Job


class Line:
    """y = w·x + b, fitted to y = 3x + 1 with noise."""

    def __init__(self) -> None:
        self.w, self.b = 0.0, 0.0

    def step(self, rate: float) -> float:
        x = random.uniform(-1, 1)
        y = 3 * x + 1 + float(numpy.random.normal(0, 0.1))
        error = self.w * x + self.b - y
        self.w -= rate * error * x
        self.b -= rate * error
        return error * error

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.w, "b": self.b}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.w, self.b = state["w"], state["b"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--save-every", default="5", help="steps, a duration like 30s, or auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--save-in-line",
        dest="background",
        action="store_false",
        help="periodic saves block training (not in the background)",
    )
    args = parser.parse_args()
    random.seed(args.seed)
    numpy.random.seed(args.seed)
    model = Line()
    save_every = int(args.save_every) if args.save_every.isdigit() else args.save_every
    heartbeat_every = min(2.0, args.step_seconds * 5)
    job = Job(model=model, save_every=save_every, heartbeat_every=heartbeat_every, save_in_background=args.background)
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    print(f"attempt {job.link.attempt} on GPUs [{gpus}]: from step {job.step}", flush=True)
    for step in job.steps(args.steps):
        time.sleep(args.step_seconds)
        loss = model.step(rate=0.1)
        print(f"step {step} loss {loss.hex()}", flush=True)
    job.finish()
    print(f"done: {args.steps} steps, w={model.w:.3f} b={model.b:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
