"""Where a restart's time goes: the PyTorch example and a `torch.compile`d one, a first attempt
against a resumed one, phase by phase as the job reports them to gpupool; and a resume of the
134 MB model with Adam, reading its checkpoint into memory against mapping it.

Before and after, in one run:
- compile caches: a resumed attempt on a fresh machine (or a cleaned /tmp) compiles again;
  under gpupool `TORCHINDUCTOR_CACHE_DIR` is in the job's folder, kept across attempts;
- restore: `torch.load` reading the file then `load_state_dict`, against what `gpupool.job`
  does: `torch.load(mmap=True)`, the model copying the mapped tensors into its own, anything
  else (the optimizer) given a copy in memory, so that nothing keeps the file mapped.

The jobs report to a recorder on loopback that speaks gpupool's job protocol (heartbeats).
Run: .venv/bin/python -m benchmarks.restart_time
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

from benchmarks.checkpoint_overhead import model_and_optimizer
from gpupool.job import Job, state
from gpupool.job.checkpoints import CheckpointDir
from gpupool.job.resume import Loader

TRAINER = [sys.executable, "-m", "gpupool.examples.torch_trainer", "--save-every", "1000"]
PHASES = ("set-up", "imports", "model build", "restore", "data position")


class Recorder(ThreadingHTTPServer):
    """Keeps what each attempt said in its heartbeats, merged."""

    def __init__(self) -> None:
        self.said: dict[str, dict[str, Any]] = {}
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        attempt = self.path.split("/")[4]
        self.server.said.setdefault(attempt, {}).update(body)
        reply = b'{"notice": null}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *_: object) -> None:
        pass


def attempt(recorder: Recorder, folder: Path, number: int, steps: int, cache: Path, *options: str) -> dict[str, Any]:
    """One attempt of the example, to `steps` (it resumes from what the previous one saved)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env |= {
        "GPUPOOL_API": f"http://127.0.0.1:{recorder.server_port}",
        "GPUPOOL_JOB_ID": "1",
        "GPUPOOL_ATTEMPT": str(number),
        "GPUPOOL_CHECKPOINT_DIR": str(folder / "checkpoints"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
    }
    launched = time.time()
    subprocess.run([*TRAINER, "--steps", str(steps), *options], env=env, check=True, capture_output=True)
    said = recorder.said.pop(str(number))
    said["launch"] = said["process_started_at"] - launched
    return said


def row(name: str, said: dict[str, Any]) -> str:
    phases = said["restart_phases"]
    parts = [f"{p} {phases.get(p, 0.0):6.2f}" for p in PHASES if p in phases]
    until = said["launch"] + sum(phases.values())
    first, steady = said.get("first_step_seconds", float("nan")), said.get("steady_step_seconds", float("nan"))
    return (
        f"{name:<40} start {said['launch']:5.2f}  " + "  ".join(parts) + f"  | to first step {until:6.2f} s,"
        f" first step {first:6.2f} s (then {steady * 1000:.1f} ms)"
    )


def restarts() -> None:
    recorder = Recorder()
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp)
        print("seconds; each attempt trains 20 steps, the resumed one from the first one's checkpoint", flush=True)
        eager = top / "eager"
        print(row("example, first attempt", attempt(recorder, eager, 0, 20, top / "cache-eager")), flush=True)
        print(row("example, resumed", attempt(recorder, eager, 1, 40, top / "cache-eager")), flush=True)
        for kept in (False, True):
            folder = top / f"compiled-{kept}"
            first = attempt(recorder, folder, 0, 20, top / f"cache-{kept}-0", "--compile")
            again = attempt(recorder, folder, 1, 40, top / f"cache-{kept}-{int(kept) ^ 1}", "--compile")
            label = "cache kept (gpupool)" if kept else "cache lost (before)"
            print(row("compiled, first attempt", first), flush=True)
            print(row(f"compiled, resumed, {label}", again), flush=True)
    recorder.shutdown()


def restores() -> None:
    model, optimizer = model_and_optimizer()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(model=model, optimizer=optimizer, save_every=None, directory=tmp)
        job.step = 1
        job.save()
        job.checkpoints.wait_for_digests()
        job.link.restore_signals()
        [checkpoint] = CheckpointDir(Path(tmp)).committed()
        objects = checkpoint.path / "objects.pt"
        times: dict[str, list[float]] = {"verify": [], "read": [], "mmap": []}
        for _ in range(3):
            began = time.perf_counter()
            CheckpointDir.verify(checkpoint)
            times["verify"].append(time.perf_counter() - began)
            began = time.perf_counter()
            loaded = state.read(objects, mmap=False)
            model.load_state_dict(loaded["model"])
            optimizer.load_state_dict(loaded["optimizer"])
            times["read"].append(time.perf_counter() - began)
            del loaded
            began = time.perf_counter()
            Loader(job.ranks, {"model": model, "optimizer": optimizer}, {}, None)(checkpoint)
            times["mmap"].append(time.perf_counter() - began)
        size = objects.stat().st_size
    median = {how: statistics.median(values) for how, values in times.items()}
    print(f"restore of the 134 MB model with Adam ({size / 1e6:.0f} MB), median of 3, page cache warm:")
    print(f"  check sizes and SHA-256: {median['verify'] * 1000:.0f} ms")
    print(f"  torch.load reading the file, then load_state_dict: {median['read'] * 1000:.0f} ms")
    print(f"  gpupool.job (mapped; the optimizer's state copied out): {median['mmap'] * 1000:.0f} ms"
          f" ({100 * (median['mmap'] / median['read'] - 1):+.0f} %)")  # fmt: skip


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    restores()
    restarts()
