"""`gpupool demo --cluster`: one pool over a three-node Ray cluster that the demo starts on
loopback (four virtual GPUs a node), and a multi-node PyTorch job through preemption and the
loss of a node.

Team vision trains a 2-node × 2-GPU `torch.distributed` job (`gpupool.examples.ddp_trainer`,
gloo, made preemption-safe by `gpupool.job`), next to a normal-priority job of team nlp that
takes a whole node. Then nlp submits a high-priority job that needs a whole node: the gang gets
notice on both of its nodes, saves one checkpoint, leaves and goes back in line. When it runs
again, the demo kills the raylet of one of its nodes: the job loses that node, is requeued, and
resumes on the nodes left. Its losses, bit for bit, and its final state are those of a run
nobody interrupted (the demo makes one first, on this machine). Everything it started stops.
Needs `gpupool[ray,torch]`.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape

from gpupool.config import parse_spec
from gpupool.demo.live import Narrator, costs, wait
from gpupool.demo.loopback import LoopbackCluster, unused_k
from gpupool.executors.proc import kill_attempts
from gpupool.settle import ENDED, JobState
from gpupool.store import JobSpec
from gpupool.up import Running, free_port, shut_down, start

CONFIG = """
classes:
  high:   {value: 100, may_preempt: true,  preemptible: false, grace_period: 20s}
  normal: {value: 10,  may_preempt: true,  preemptible: true,  grace_period: 20s, min_runtime: 60s}
  low:    {value: 0,   may_preempt: false, preemptible: true,  grace_period: 20s, min_runtime: 2s}
teams:
  vision: {}
  nlp: {}
"""
STEPS = 60


def ddp(steps: int = STEPS, step_seconds: float = 0.15) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gpupool.examples.ddp_trainer",
        "--steps",
        str(steps),
        "--step-seconds",
        str(step_seconds),
    ]


def run_cluster_demo(console: Console) -> int:
    """The demo; 0 when the resumed job matched the run nobody interrupted, else 1."""
    with tempfile.TemporaryDirectory(prefix="gpupool-cluster-demo-", ignore_cleanup_errors=True) as tmp:
        folder = Path(tmp)
        console.rule("[bold]gpupool demo --cluster[/]: one pool over three Ray nodes on loopback")
        with console.status("a run of the job nobody interrupts, for comparison (two ranks here)"):
            golden = uninterrupted(folder / "golden")
        cluster = LoopbackCluster(folder / "ray", k=unused_k())
        console.file = console.file  # pinned: Ray's own messages (a raylet's last words) go to a file
        try:
            with console.status(f"starting a Ray cluster: 3 nodes on {cluster.ip(0)}-4, 4 virtual GPUs each"):
                cluster.start()
            with (folder / "ray-messages.log").open("w") as messages, contextlib.redirect_stdout(messages):
                return narrate(console, folder, cluster, golden)
        finally:
            with console.status("stopping the Ray cluster"):
                cluster.stop()
            console.print("stopped everything the demo started")


def uninterrupted(folder: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env |= {"GPUPOOL_CHECKPOINT_DIR": str(folder), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    ranks = [
        subprocess.Popen(
            ddp(step_seconds=0), env={**env, "WORLD_SIZE": "2", "RANK": str(r)}, stdout=subprocess.PIPE, text=True
        )
        for r in range(2)
    ]
    return [rank.communicate(timeout=300)[0] for rank in ranks]


def narrate(console: Console, folder: Path, cluster: LoopbackCluster, golden: list[str]) -> int:
    data = folder / "data"
    service = {
        "data_dir": str(data),
        "port": free_port(),
        "interval": 0.2,
        "run_as": "service",
        "executor": "ray",
        "ray_address": cluster.address,
        "start_timeout": "30s",
    }
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    running = start(parse_spec({**yaml.safe_load(CONFIG), "service": service}, "demo"))
    server = threading.Thread(target=running.serve, daemon=True)
    server.start()
    try:
        return story(console, running, cluster, golden)
    finally:
        running.server.should_exit = True
        server.join(timeout=10)
        shut_down(running)
        kill_attempts(data)


def story(console: Console, running: Running, cluster: LoopbackCluster, golden: list[str]) -> int:
    store, loop = running.store, running.loop
    narrator = Narrator(store, console, time.time())
    workdir = str(loop.data_dir)

    def submit(spec: JobSpec) -> int:
        job = store.submit(spec, time.time())
        loop.wakeup.set()
        return job.id

    def log(job: int, rank: int, attempt: int | None = None) -> str:
        row = store.job(job)
        reader = loop.open_log(row, attempt if attempt is not None else row.attempts - 1, "stdout", rank)
        if reader is None:
            return ""
        with reader:
            return reader.read().decode(errors="replace")

    def until(done: Callable[[], bool], timeout: float = 120) -> None:
        wait(narrator, done, timeout)

    gang = submit(JobSpec(ddp(), "vision", "low", 4, "ddp", gpus_per_node=2, workdir=workdir))
    until(lambda: store.job(gang).state == "running")
    submit(JobSpec(["sleep", "25"], "nlp", "normal", 4, "eval", gpus_per_node=4, workdir=workdir))
    until(lambda: " step 10 " in log(gang, 1))
    console.print("[bold]nlp submits a high-priority job that needs a whole node[/]")
    submit(JobSpec(["sleep", "5"], "nlp", "high", 4, "urgent", gpus_per_node=4, workdir=workdir))
    until(lambda: store.job(gang).attempts >= 2 and store.job(gang).state == "running", 150)
    until(lambda: f"rank 1 step {resumed_at(log(gang, 1)) + 5} " in log(gang, 1))
    placement = {p.node for p in store.held() if p.job_id == gang}
    workers = [n for n in sorted(placement) if n != cluster.ip(0)]  # the head carries the scheduler
    if not workers:
        console.print("[red]the job is not running on a worker node: nothing to kill[/]")
        return 1
    victim = workers[0]
    console.print(f"[bold]the demo kills the raylet of node {victim}[/], one of the two the job runs on")
    cluster.kill_node(cluster.names.index(victim))
    until(lambda: JobState(store.job(gang).state) in ENDED, 180)
    console.print(escape(costs(store, loop)))
    return verdict(console, store.job(gang).attempts, lambda a, r: log(gang, r, a), golden)


def resumed_at(output: str) -> int:
    found = re.search(r"from step (\d+)", output)
    return int(found.group(1)) if found else 0


def losses(output: str) -> dict[int, str]:
    return {int(s): bits for s, bits in re.findall(r"^rank \d+ step (\d+) loss (\S+)$", output, re.MULTILINE)}


def verdict(console: Console, attempts: int, log: Callable[[int, int], str], golden: list[str]) -> int:
    same = True
    for rank in range(2):
        merged: dict[int, str] = {}
        for attempt in range(attempts):
            output = log(attempt, rank)
            first = output.splitlines()[0] if output else "(no output)"
            console.print(f"attempt {attempt}, {first}", markup=False, highlight=False)
            for step, bits in losses(output).items():
                same &= merged.setdefault(step, bits) == bits
        same &= merged == losses(golden[rank])
    final = log(attempts - 1, 0).strip().splitlines()[-1:]
    same &= final == golden[0].strip().splitlines()[-1:]
    if same:
        console.print(
            f"[green]bit-identical[/]: every rank's {STEPS} losses and the final state ({final[0][-64:]}) "
            "are those of the run nobody interrupted"
        )
        return 0
    console.print("[red]not identical[/] to the run nobody interrupted")
    return 1
