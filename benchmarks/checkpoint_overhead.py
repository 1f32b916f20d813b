"""What `gpupool.job` costs a training job: blocking time of its checkpoint saves, in line and
in the background, against a plain `torch.save` loop on the same model; training step time while
a background save is written, against no save; and the time from notice to release of a small
PyTorch job.

Step time is taken for two kinds of step: a CPU-bound one (forward, backward and Adam on this
very model, on this machine's cores: the worst case, since the write competes for them) and a
GPU-like one, where the training thread mostly waits (as it does on a GPU while kernels run):
a 30 ms wait plus a little Python.

The plain loop saves to a new file each time and keeps the last two, as a loop must that wants
to survive a crash during a save; overwriting one file in place is faster here (the page cache
reuses its pages) but a crash mid-save loses the only checkpoint: it is shown for reference.

Run: .venv/bin/python -m benchmarks.checkpoint_overhead
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from gpupool.job import Job
from gpupool.job.session import LEAVE_CODE

ROUNDS = 8
TRAINING = 3.0
"""Seconds between two saves, as training would take (the CPU idle, as on a GPU machine): the
library's hashing happens then, after the commit."""


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    """About 25 M parameters: with Adam's two moments, ~300 MB of state."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 2048))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 2048)).sum().backward()
    optimizer.step()  # the moments exist
    return model, optimizer


def plain(model: nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> float:
    began = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    return time.perf_counter() - began


def plain_new_file(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, step: int) -> float:
    elapsed = plain(model, optimizer, folder / f"checkpoint-{step}.pt")
    (folder / f"checkpoint-{step - 2}.pt").unlink(missing_ok=True)
    return elapsed


def with_library(job: Job) -> float:
    began = time.perf_counter()
    job.step += 1
    job.save()
    return time.perf_counter() - began


def in_background(job: Job) -> tuple[float, float]:
    """(seconds the save blocked, seconds from its start to its commit)."""
    began = time.perf_counter()
    job.step += 1
    job._save_in_background()
    blocked = time.perf_counter() - began
    job.saves.wait()
    whole = time.perf_counter() - began
    job._collect()
    return blocked, whole


def cpu_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    batch = torch.randn(8, 2048)

    def step() -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    return step


def gpu_like_step() -> None:
    time.sleep(0.03)
    sum(range(20_000))


def step_times(job: Job, step: Callable[[], None], rounds: int) -> tuple[float, float, float]:
    """Median step time with no save in flight and while a background save is written (and
    its files hashed, after the commit), and the median time of that write and hash."""
    quiet: list[float] = []
    writing: list[float] = []
    wrote: list[float] = []
    for _ in range(rounds):
        job.step += 1
        started = time.perf_counter()
        job._save_in_background()
        while not job.saves.wait(0) or any(h.is_alive() for h in job.checkpoints._hashers):
            began = time.perf_counter()
            step()
            writing.append(time.perf_counter() - began)
        wrote.append(time.perf_counter() - started)
        job._collect(wait=True)
        for _ in range(max(3, len(writing) // rounds)):
            began = time.perf_counter()
            step()
            quiet.append(time.perf_counter() - began)
    return statistics.median(quiet), statistics.median(writing), statistics.median(wrote)


def notice_to_release(folder: Path) -> float:
    """A PyTorch job gets notice (notice file, then SIGTERM, as gpupool gives it): seconds until
    its process has saved and exited."""
    notice = folder / "notice"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env |= {"GPUPOOL_CHECKPOINT_DIR": str(folder / "checkpoints"), "GPUPOOL_NOTICE_FILE": str(notice)}
    command = [sys.executable, "-m", "gpupool.examples.torch_trainer", "--steps", "100000", "--save-every", "1000"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("step 50 "):
            break
    began = time.perf_counter()
    notice.write_text(f'{{"deadline": {time.time() + 30}}}')
    process.send_signal(signal.SIGTERM)
    process.stdout.read()
    process.wait(timeout=60)
    elapsed = time.perf_counter() - began
    assert process.returncode == LEAVE_CODE, process.returncode
    return elapsed


def main() -> None:
    model, optimizer = model_and_optimizer()
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    print(
        f"model {size / 1e6:.0f} MB of parameters, Adam state twice that; {ROUNDS} saves each, {TRAINING:.0f} s apart",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        in_place, new_file, ours, staged, whole = [], [], [], [], []
        job = Job(model=model, optimizer=optimizer, save_every=None, directory=folder / "job")
        for step in range(ROUNDS):  # interleaved, so that the machine's drift hits them all alike
            in_place.append(plain(model, optimizer, folder / "checkpoint.pt"))
            time.sleep(TRAINING)
            new_file.append(plain_new_file(model, optimizer, folder, step))
            time.sleep(TRAINING)
            ours.append(with_library(job))
            time.sleep(TRAINING)
            blocked, written = in_background(job)
            staged.append(blocked)
            whole.append(written)
            time.sleep(TRAINING)
        first_staging = staged.pop(0)  # allocates the buffers the next ones reuse
        overwrite, base, library, background, commit = (
            statistics.median(x) for x in (in_place, new_file, ours, staged, whole)
        )
        print(f"plain torch.save, a new file each time:     median {base * 1000:6.0f} ms")
        print(f"gpupool.job save in line (commit, fsync):   median {library * 1000:6.0f} ms"
              f"  ({100 * (library / base - 1):+.1f} % of plain)")  # fmt: skip
        share = 100 * background / library
        print(f"gpupool.job background save, blocking:      median {background * 1000:6.0f} ms"
              f"  ({share:.1f} % of in line; the first, allocating: {first_staging * 1000:.0f} ms)")  # fmt: skip
        print(f"  its write and commit, training going on:  median {commit * 1000:6.0f} ms from its start")
        print(f"(torch.save overwriting one file in place: median {overwrite * 1000:.0f} ms; a crash loses it)")
        for name, train in (("CPU-bound", cpu_step(model, optimizer)), ("GPU-like", gpu_like_step)):
            quiet, writing, wrote = step_times(job, train, 3)
            slower = 100 * (writing / quiet - 1)
            print(f"{name} training step: median {quiet * 1000:.1f} ms with no save, "
                  f"{writing * 1000:.1f} ms during a background save ({slower:+.1f} %; "
                  f"written and hashed in {wrote:.1f} s)")  # fmt: skip
        job.link.restore_signals()
    with tempfile.TemporaryDirectory() as tmp:
        drains = [notice_to_release(Path(tmp) / str(i)) for i in range(5)]
    print(f"notice to release, small PyTorch job (save + exit): median {statistics.median(drains) * 1000:.0f} ms, "
          f"max {max(drains) * 1000:.0f} ms over {len(drains)}")  # fmt: skip


if __name__ == "__main__":
    main()
