"""A stand-in training job that speaks gpupool's job protocol with nothing but the standard library.

    python -m gpupool.examples.trainer --steps 40 --step-seconds 0.2 --checkpoint-every 5

Each step "trains" (sleeps), heartbeats with its step, and every few steps writes a checkpoint
atomically to $GPUPOOL_CHECKPOINT_DIR and reports the commit. On notice (the heartbeat reply,
the notice file or SIGTERM: the handler only sets a flag) it saves at the next step boundary,
acknowledges and exits 0: gpupool requeues it, and the next attempt resumes from the checkpoint.
Run outside gpupool it simply trains.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

# The handler only sets the flag: the loop acts at the next step boundary.
STOP = threading.Event()


def report(kind: str, body: dict[str, object]) -> dict[str, object]:
    """POST to the job protocol; {} when not running under gpupool or when it is unreachable."""
    api, token = os.environ.get("GPUPOOL_API"), os.environ.get("GPUPOOL_TOKEN")
    if not api or not token:
        return {}
    job, attempt = os.environ["GPUPOOL_JOB_ID"], os.environ["GPUPOOL_ATTEMPT"]
    request = urllib.request.Request(
        f"{api}/jobs/{job}/attempts/{attempt}/{kind}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            text = response.read()
    except OSError as exc:
        print(f"gpupool unreachable ({exc}); going on", file=sys.stderr, flush=True)
        return {}
    return json.loads(text) if text else {}


def save(directory: Path, step: int) -> None:
    tmp = directory / f".step-{step}.tmp"
    tmp.write_text(json.dumps({"step": step}))
    with tmp.open() as stream:
        os.fsync(stream.fileno())
    os.replace(tmp, directory / "latest.json")
    report("checkpoint", {"step": step, "path": str(directory / "latest.json")})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: STOP.set())
    directory = Path(os.environ.get("GPUPOOL_CHECKPOINT_DIR", "checkpoints"))
    directory.mkdir(parents=True, exist_ok=True)
    notice_file = Path(os.environ.get("GPUPOOL_NOTICE_FILE", "/nonexistent/notice"))
    latest = directory / "latest.json"
    report("heartbeat", {"phase": "restore"})
    step = json.loads(latest.read_text())["step"] if latest.exists() else 0
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    print(f"attempt {os.environ.get('GPUPOOL_ATTEMPT', '0')} on GPUs [{gpus}]: from step {step}", flush=True)
    while step < args.steps:
        time.sleep(args.step_seconds)
        step += 1
        reply = report("heartbeat", {"step": step, "phase": "train"})
        if step % args.checkpoint_every == 0:
            save(directory, step)
        if STOP.is_set() or reply.get("notice") or notice_file.exists():
            save(directory, step)
            report("ack", {})
            print(f"notice: saved step {step}, leaving", flush=True)
            return 0
    report("complete", {})
    print(f"done: {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
