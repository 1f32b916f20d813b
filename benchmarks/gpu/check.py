"""What gpupool claims for GPUs, checked on one (issue 37): the script one device call runs.

    python3 -m benchmarks.gpu.check --out "$OUT"                       # there, after wheels.INSTALL
    .venv/bin/python -m benchmarks.gpu.check --out out/gpu --device cpu  # here: what runs on a CPU

Each step runs on its own: one that fails says why in the summary, and the others go on. The
figures go to `figures.json` and a few lines for people to `summary.txt`, both under `--out`.
Steps that need a GPU (discovery) say so on a CPU instead of pretending; the others run the same
code on either, at `--scale small` on a CPU (a model of ~25 M parameters) and `full` on a GPU
(~1 B parameters with Adam: about 16 GB of state).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STEPS_IN_ORDER = ("discovery", "resume", "checkpoint-cost", "restart", "sharded", "containment")


@dataclass(frozen=True)
class Setting:
    """What every step is given."""

    device: str
    """`cuda` or `cpu`."""
    scale: str
    """`full` (a model that fills a real share of a GPU) or `small`."""
    work: Path
    """A folder of the step's own for checkpoints."""


@dataclass
class Outcome:
    step: str
    ok: bool
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    """What went wrong, or why it did not run here."""


class NotHere(Exception):
    """The step cannot run on this machine (no GPU): said, not failed."""


def discovery(setting: Setting) -> dict[str, Any]:
    """gpupool finds the GPU with NVML (`executors.local.gpus.discover`, as `gpupool up` does,
    with no virtual GPUs), and NVML gives its memory and driver."""
    from gpupool.executors.local.gpus import discover

    try:
        found = discover(socket.gethostname(), 0)
    except ValueError as exc:
        raise NotHere(str(exc)) from None
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        driver = str(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()
    return {"gpus": found.node.gpus, "gpu_type": found.node.gpu_type, "memory_bytes": memory, "driver": driver}


def resume(setting: Setting) -> dict[str, Any]:
    """Through `gpupool up` on this machine's GPU: a low-priority PyTorch job (the plain job
    library's example, then Lightning's) is preempted by a high-priority one, resumes from its
    checkpoint, and every step's loss bits equal those of a run nobody interrupted."""
    import sys

    figures: dict[str, Any] = {}
    examples = {"plain": "gpupool.examples.torch_trainer", "lightning": "gpupool.examples.lightning_trainer"}
    for kind, module in examples.items():
        command = [sys.executable, "-m", module, "--steps", "60", "--save-every", "1000"]
        figures[kind] = preempted_once(command, setting.work / kind, setting.device)
    return figures


def preempted_once(command: list[str], work: Path, device: str) -> dict[str, Any]:
    """`command` (printing `step N ... loss BITS` lines) as a low job through a service of its
    own, given notice by a high job at its step 20: its attempts' losses against a run alone."""
    import os
    import re

    import httpx

    from tests.support.live import Service, running, state, uninterrupted, wait_for

    ENDED = ("succeeded", "failed", "cancelled", "timeout")

    def losses(output: str) -> dict[str, str]:
        return dict(re.findall(r"^(step \d+)(?: [^\n]*)? loss (\S+)$", output, re.MULTILINE))

    alone = losses(uninterrupted(command, work / "alone", timeout=300))
    work.mkdir(parents=True, exist_ok=True)
    lifetime = running(Service(work, grace="60s"))
    service = next(lifetime)
    try:
        token = (service.data / "admin.token").read_text().strip()
        api = httpx.Client(base_url=f"http://127.0.0.1:{service.port}", headers={"Authorization": f"Bearer {token}"})

        def log(attempt: int) -> str:
            answer = api.get("/jobs/1/logs", params={"attempt": attempt})
            return answer.text if answer.is_success else ""

        # The job gets this Python's environment: the wheels' folder on its path among it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        low = {"command": [*command, "--step-seconds", "0.05"], "priority": "low", "env": env}
        api.post("/jobs", json=low).raise_for_status()
        wait_for(lambda: "step 20 " in log(0) or state(service, 1) in ENDED, timeout=180)
        if state(service, 1) in ENDED:
            raise AssertionError(f"the job ended before its notice: {state(service, 1)}: {log(0)[-1500:]}")
        # The high job asks for every GPU (on a CPU, the service's 2 virtual ones), so that it
        # must preempt the low one.
        gpus = api.get("/pool").json()["gpus"]
        api.post("/jobs", json={"command": ["sleep", "1"], "priority": "high", "gpus": gpus}).raise_for_status()
        wait_for(lambda: state(service, 1) in ENDED, timeout=240)
        job = api.get("/jobs/1").json()
        attempts = [log(attempt) for attempt in range(job["attempts"])]
        if job["state"] != "succeeded":
            raise AssertionError(f"the job ended {job['state']}: {attempts[-1][-1500:]}")
    finally:
        next(lifetime, None)  # the service stopped, and what it left running
    merged: dict[str, str] = {}
    for output in attempts:
        for step, bits in losses(output).items():
            if merged.setdefault(step, bits) != bits:
                raise AssertionError(f"{step} differs between attempts")
    if job["preemptions"] < 1:
        raise AssertionError("the job was not preempted (it ended before its notice)")
    if device == "cuda" and not all(" on cuda" in output for output in attempts if "attempt " in output):
        raise AssertionError("an attempt did not run on the GPU")
    differ = [step for step in alone if merged.get(step) != alone[step]]
    if differ or set(merged) != set(alone):
        raise AssertionError(f"{len(differ)} steps' losses differ from the run alone, first {differ[:3]}")
    return {"attempts": job["attempts"], "steps": len(merged), "bit_identical": True}


def restart(setting: Setting) -> dict[str, Any]:
    """Where a resumed attempt of the PyTorch example's time goes on this device, as it reports
    it to gpupool (launch, imports, CUDA context, model build, restore, data position, then its
    first step against the steady ones): eager, and `torch.compile`d with the compile cache kept
    across attempts (as gpupool keeps it) and lost."""
    import threading

    from benchmarks.restart_time import Recorder, attempt

    recorder = Recorder()
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    work = setting.work
    try:
        attempt(recorder, work / "eager", 0, 20, work / "cache-eager")
        figures = {"eager": phases(attempt(recorder, work / "eager", 1, 40, work / "cache-eager"))}
        for kept in (True, False):
            folder = work / f"compiled-{kept}"
            attempt(recorder, folder, 0, 20, work / f"cache-{kept}-0", "--compile")
            cache = work / f"cache-{kept}-{0 if kept else 1}"
            label = "compiled, cache kept" if kept else "compiled, cache lost"
            figures[label] = phases(attempt(recorder, folder, 1, 40, cache, "--compile"))
    finally:
        recorder.shutdown()
    return figures


def phases(said: dict[str, Any]) -> dict[str, float]:
    """Seconds of each phase of an attempt's start, in order, then its first and steady step."""
    # The process's start is read from /proc to a hundredth of a second: a launch a little shorter
    # than that can come out below 0.
    found = {"launch": max(0.0, float(said["launch"])), **{k: float(v) for k, v in said["restart_phases"].items()}}
    found["first step"] = float(said.get("first_step_seconds", float("nan")))
    found["steady step"] = float(said.get("steady_step_seconds", float("nan")))
    return {name: round(seconds, 4) for name, seconds in found.items()}


HOLD_GPU = (
    "import time, torch\n"
    "held = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')\n"
    "print('holding', flush=True)\n"
    "time.sleep(600)\n"
)
"""A process that holds GPU memory and does nothing: what a job's leftover looks like."""

BUSY_GPU = (
    "import time, torch\n"
    "a = torch.randn(4096, 4096, device='cuda')\n"
    "(a @ a).sum().item()\n"
    "print('busy', flush=True)\n"
    "end = time.time() + 600\n"
    "while time.time() < end:\n"
    "    a = (a @ a).tanh()\n"
)
"""A process that keeps the GPU computing."""


def containment(setting: Setting) -> dict[str, Any]:
    """A CUDA process of no attempt makes its GPU dirty to `gpupool up` (an event says so, and
    no job is given it), and the GPU is clean again once the process ends; NVML reads an idle
    GPU's utilization as 0 and a busy one's above `nvml.BUSY` (what the idle rule of sessions
    reads)."""
    import subprocess
    import sys

    from gpupool.executors.local.nvml import BUSY, gpu_processes, gpu_utilization
    from tests.support.live import Service, running, wait_for

    if gpu_processes() is None or setting.device != "cuda":
        raise NotHere("NVML cannot be read, or no GPU")
    idle = (gpu_utilization() or {}).get(0)
    lifetime = running(Service(setting.work, grace="10s"))
    service = next(lifetime)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_GPU], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"

        def events(kind: str) -> list[str]:
            answer = service.get(f"/events?kind={kind}")
            return [e["message"] for e in answer.json()] if answer is not None and answer.is_success else []

        holder_pid = f"pid {holder.pid}"
        dirty = wait_for(lambda: any("is dirty" in m and holder_pid in m for m in events("gpu_dirty")), timeout=60)
        holder.kill()
        holder.wait(timeout=30)
        clean = wait_for(lambda: any("clean again" in m for m in events("gpu_dirty")), timeout=60)
    finally:
        holder.kill()
        next(lifetime, None)
    busy_process = subprocess.Popen([sys.executable, "-c", BUSY_GPU], stdout=subprocess.PIPE, text=True)
    try:
        assert busy_process.stdout is not None and busy_process.stdout.readline().strip() == "busy"
        time.sleep(2)  # NVML's sample period is about a second
        busy = (gpu_utilization() or {}).get(0)
    finally:
        busy_process.kill()
        busy_process.wait(timeout=30)
    if idle is None or busy is None or idle >= BUSY or busy < BUSY:
        raise AssertionError(f"utilization idle {idle} %, busy {busy} %: not told apart at {BUSY} %")
    return {"dirty_after_seconds": dirty, "clean_after_seconds": clean, "idle_percent": idle, "busy_percent": busy}


def model_and_optimizer(setting: Setting) -> tuple[Any, Any]:
    """An MLP with Adam, its moments made: ~1 B parameters at `full`, ~25 M at `small`."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    width, depth = (8192, 15) if setting.scale == "full" else (2048, 6)
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]
    model = nn.Sequential(*layers).to(setting.device)
    optimizer = torch.optim.Adam(model.parameters())
    step(model, optimizer, setting.device, width)()
    return model, optimizer


def step(model: Any, optimizer: Any, device: str, width: int) -> Callable[[], None]:
    """One training step on a batch of 32, waited for to its end (a GPU's kernels included)."""
    import torch

    batch = torch.randn(32, width, device=device)

    def run() -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    return run


def checkpoint_cost(setting: Setting) -> dict[str, Any]:
    """A training step's time with no save, while a background save is written, and with a save
    in line; the in-line save against `torch.save` to a new file, both to the disk."""
    import os

    import torch

    from gpupool.job import Job

    model, optimizer = model_and_optimizer(setting)
    width = next(model.parameters()).shape[0]
    train = step(model, optimizer, setting.device, width)
    import shutil

    free = shutil.disk_usage(setting.work).free
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3  # and Adam's 2
    if free < 3 * state_bytes:
        raise NotHere(f"{free / 2**30:.0f} GiB free where it saves, for 3 saves of {state_bytes / 2**30:.1f} GiB")
    job = Job(model=model, optimizer=optimizer, save_every=None, keep=1, directory=setting.work / "library")
    quiet = timed(train, 5)
    writing: list[float] = []
    job.step += 1
    began = time.perf_counter()
    job._save_in_background()
    while not job.saves.wait(0):
        writing.append(timed(train, 1)[0])
    background = time.perf_counter() - began
    job._collect(wait=True)
    job.checkpoints.wait_for_digests()  # its hashing reads the files: not beside the next timing
    job.step += 1
    began = time.perf_counter()
    job.save()
    in_line = time.perf_counter() - began
    job.checkpoints.wait_for_digests()
    shutil.rmtree(setting.work / "library")  # room for the plain save
    plain = setting.work / "plain.pt"
    began = time.perf_counter()
    with plain.open("wb") as file:  # to the disk, as the library's saves are
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, file)
        file.flush()
        os.fsync(file.fileno())
    torch_save = time.perf_counter() - began
    parameters = sum(p.numel() for p in model.parameters())
    median_quiet = statistics.median(quiet)
    median_writing = statistics.median(writing) if writing else median_quiet
    return {
        "parameters": parameters,
        "state_bytes": plain.stat().st_size,
        "step_seconds": median_quiet,
        "step_seconds_during_background_save": median_writing,
        "slowdown_during_background_save": median_writing / median_quiet - 1,
        "steps_during_background_save": len(writing),
        "background_save_seconds": background,
        "in_line_save_seconds": in_line,
        "torch_save_new_file_seconds": torch_save,
        "free_disk_bytes": free,
    }


def timed(run: Callable[[], None], times: int) -> list[float]:
    took = []
    for _ in range(times):
        began = time.perf_counter()
        run()
        took.append(time.perf_counter() - began)
    return took


def sharded(setting: Setting) -> dict[str, Any]:
    """A DCP checkpoint saved and restored through `gpupool.job` (an FSDP2 model of one rank,
    on gloo on a CPU and NCCL on a GPU): the restored parameters and Adam's moments equal the
    saved ones."""
    import os

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from gpupool.job import Job
    from gpupool.up import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl" if setting.device == "cuda" else "gloo")
    try:

        def made() -> tuple[Any, Any]:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)).to(setting.device)
            fully_shard(model)  # its parameters are now DTensors, each rank a shard
            return model, torch.optim.Adam(model.parameters())

        model, optimizer = made()
        model(torch.randn(4, 256, device=setting.device)).sum().backward()
        optimizer.step()
        saved = state_of(model, optimizer)
        job = Job(model=model, optimizer=optimizer, save_every=None, directory=setting.work / "dcp")
        job.step += 1
        began = time.perf_counter()
        job.save()
        save = time.perf_counter() - began
        model, optimizer = made()
        began = time.perf_counter()
        resumed = Job(model=model, optimizer=optimizer, save_every=None, directory=setting.work / "dcp")
        restore = time.perf_counter() - began
        same = resumed.step == 1 and state_of(model, optimizer) == saved
        if not same:
            raise AssertionError("the restored state is not the saved one")
        return {"save_seconds": save, "restore_seconds": restore, "bit_identical": same}
    finally:
        dist.destroy_process_group()


def state_of(model: Any, optimizer: Any) -> dict[str, bytes]:
    """Every parameter's and every Adam moment's full value, as bytes (gathered from shards)."""
    from torch.distributed.tensor import DTensor

    def whole(tensor: Any) -> bytes:
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        return bytes(full.detach().cpu().contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy())

    found = {f"param {name}": whole(p) for name, p in model.named_parameters()}
    for index, moments in enumerate(optimizer.state.values()):
        for key in ("exp_avg", "exp_avg_sq"):
            found[f"{key} {index}"] = whole(moments[key])
    return found


STEPS: dict[str, Callable[[Setting], dict[str, Any]]] = {
    "discovery": discovery,
    "resume": resume,
    "checkpoint-cost": checkpoint_cost,
    "restart": restart,
    "sharded": sharded,
    "containment": containment,
}


def run_step(name: str, device: str, scale: str) -> Outcome:
    """One step, in this process, in a folder of its own: its outcome, whatever became of it."""
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"gpupool-gpu-{name}-") as work:
        try:
            figures = STEPS[name](Setting(device, scale, Path(work)))
            return Outcome(name, True, time.perf_counter() - began, figures)
        except NotHere as exc:
            return Outcome(name, False, time.perf_counter() - began, why=f"not here: {exc}")
        except Exception as exc:
            why = "".join(traceback.format_exception(exc)).strip()
            return Outcome(name, False, time.perf_counter() - began, why=why[-3000:])


def in_own_process(name: str, device: str, scale: str, seconds: float) -> Outcome:
    """The step in a process of its own (no CUDA context of one step seen by the next, nothing it
    leaves behind kept), stopped after `seconds`: its outcome, with its error output's end if it
    died."""
    import subprocess
    import sys

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpupool-gpu-result-") as folder:
        result = Path(folder) / "outcome.json"
        command = [sys.executable, "-m", "benchmarks.gpu.check", "--step", name, "--device", device]
        command += ["--scale", scale, "--out", str(result)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=seconds, check=False)
        except subprocess.TimeoutExpired as exc:
            said = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            return Outcome(
                name, False, time.perf_counter() - began, why=f"{said[-1500:]}\nstopped at its {seconds:.0f} s"
            )
        if not result.exists():
            why = f"{done.stderr[-2500:]}\nits process ended with {done.returncode} and said nothing"
            return Outcome(name, False, time.perf_counter() - began, why=why)
        return Outcome(**json.loads(result.read_text()))


def summary(outcomes: list[Outcome], device: str, versions: dict[str, str]) -> str:
    """The summary for people: the machine, then one line a step with its figures, in words."""
    lines = [f"gpupool GPU check on {device}: " + ", ".join(f"{k} {v}" for k, v in versions.items())]
    for outcome in outcomes:
        said = "ok" if outcome.ok else "FAILED" if not outcome.why.startswith("not here") else "skipped"
        line = f"{outcome.step}: {said} in {outcome.seconds:.1f} s"
        if outcome.ok:
            line += "; " + "; ".join(f"{k} {said_value(v)}" for k, v in outcome.figures.items())
        else:
            line += f"; {outcome.why.splitlines()[-1] if outcome.why else 'no reason given'}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def said_value(value: Any) -> str:
    """A figure in a few characters: 4 significant digits, a group of figures in brackets."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k} {said_value(v)}" for k, v in value.items()) + ")"
    return str(value)


def versions(device: str) -> dict[str, str]:
    """The versions the figures are of (what cannot be read is said so, not raised)."""
    import platform
    from importlib.metadata import version

    found = {"python": platform.python_version()}
    for name in ("gpupool", "torch", "lightning", "httpx", "pydantic", "typing-extensions", "nvidia-ml-py"):
        try:
            found[name] = version(name)
        except Exception as exc:
            found[name] = f"unknown ({type(exc).__name__})"
    if device == "cuda":
        try:
            import torch

            found["gpu"] = torch.cuda.get_device_name(0)
            found["cuda"] = str(torch.version.cuda)
        except Exception as exc:
            found["gpu"] = f"unknown ({type(exc).__name__})"
    return found


def stale_install() -> str | None:
    """Why the gpupool this Python imports is not this checkout's (a wheel built before the last
    change), or None when its files are the same as src/gpupool's."""
    import gpupool

    installed = Path(gpupool.__file__).parent
    source = Path(__file__).parents[2] / "src" / "gpupool"
    if not source.is_dir() or installed.resolve() == source.resolve():
        return None
    differ = [
        str(path.relative_to(source))
        for path in sorted(source.rglob("*.py"))
        if not (installed / path.relative_to(source)).is_file()
        or (installed / path.relative_to(source)).read_bytes() != path.read_bytes()
    ]
    if differ:
        return f"the installed gpupool ({installed}) is not this checkout's: {', '.join(differ[:5])} differ"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where figures.json and summary.txt go")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--only", default=",".join(STEPS_IN_ORDER), help="steps, comma-separated")
    parser.add_argument("--scale", choices=("auto", "full", "small"), default="auto")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for all the steps together")
    parser.add_argument("--step", help=argparse.SUPPRESS)  # one step, in this process: --out is its outcome
    args = parser.parse_args(argv)
    names = [n.strip() for n in (args.step or args.only).split(",") if n.strip()]
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        parser.error(f"--only: unknown step(s) {', '.join(unknown)} (known: {', '.join(STEPS_IN_ORDER)})")
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    scale = args.scale if args.scale != "auto" else ("full" if device == "cuda" else "small")
    if args.step:
        args.out.write_text(json.dumps(asdict(run_step(args.step, device, scale))))
        return 0
    stale = stale_install()
    if stale is not None:
        print(f"error: {stale}: build the wheels again (benchmarks.gpu.wheels)", flush=True)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    found = versions(device)
    print(summary([], device, found), end="", flush=True)
    deadline = time.monotonic() + args.budget
    outcomes: list[Outcome] = []
    for name in names:
        left = deadline - time.monotonic()
        if left < 10:
            outcomes.append(Outcome(name, False, 0.0, why=f"not run: the budget of {args.budget:.0f} s was spent"))
        else:
            outcomes.append(in_own_process(name, device, scale, left))
        print(summary(outcomes[-1:], device, found).splitlines()[-1], flush=True)
        # Written after every step: a call stopped at its limit still brings back what was done.
        record = {"device": device, "scale": scale, "versions": found, "steps": [asdict(o) for o in outcomes]}
        (args.out / "figures.json").write_text(json.dumps(record, indent=2) + "\n")
        (args.out / "summary.txt").write_text(summary(outcomes, device, found))
    # On a GPU, a step that cannot run is a failure: the check is for what a GPU shows.
    return 0 if all(o.ok or (device == "cpu" and o.why.startswith("not here")) for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
