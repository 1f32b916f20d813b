"""`gpupool demo`: the live service on this machine with virtual GPUs, and real jobs through it.

Team vision fills 4 virtual GPUs with low-priority trainers (the bundled example trainer, which
checkpoints through the job protocol). Then team nlp submits a high-priority job that needs 2
GPUs: two trainers get notice, save, are requeued, and resume from their checkpoints once the
high-priority job is done. Every event is printed as it happens; a summary ends it.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpupool.config import parse_spec
from gpupool.service.loop import ControlLoop
from gpupool.settle import ENDED, JobState
from gpupool.store import JobSpec, Store
from gpupool.store.schema import AttemptRow, JobRow
from gpupool.units import gpu_time
from gpupool.up import Running, free_port, shut_down, start

DEMO_CONFIG = """
classes:
  urgent: {value: 1000, may_preempt: true,  preemptible: false, grace_period: 10s}
  high:   {value: 100,  may_preempt: true,  preemptible: true,  grace_period: 10s, min_runtime: 5s}
  normal: {value: 10,   may_preempt: true,  preemptible: true,  grace_period: 10s, min_runtime: 5s}
  low:    {value: 0,    may_preempt: false, preemptible: true,  grace_period: 10s, min_runtime: 2s}
teams:
  vision: {guaranteed_gpus: 2}
  nlp:    {guaranteed_gpus: 2}
"""
STYLE = {"preempting": "bold red", "succeeded": "green", "running": "cyan", "pending": "yellow"}


def trainer(steps: int) -> list[str]:
    return [sys.executable, "-m", "gpupool.examples.trainer", "--steps", str(steps), "--step-seconds", "0.25"]


@dataclass
class Narrator:
    """Prints the store's events as they are written."""

    store: Store
    console: Console
    began: float
    seen: int = 0

    def tell(self) -> None:
        for event in self.store.events(after=self.seen):
            self.seen = event.id
            if event.kind in ("checkpoint", "starting"):
                continue
            style = STYLE.get(event.kind, "default")
            clock = f"[dim]{event.time - self.began:6.1f} s[/]"
            self.console.print(f"{clock} job {event.job_id:<2} [{style}]{event.kind:<11}[/] {escape(event.message)}")


def run_live_demo(console: Console) -> None:
    with tempfile.TemporaryDirectory(prefix="gpupool-demo-", ignore_cleanup_errors=True) as tmp:
        data = Path(tmp)
        service = {"data_dir": str(data), "port": free_port(), "interval": 0.2, "virtual_gpus": 4, "run_as": "service"}
        spec = parse_spec({**yaml.safe_load(DEMO_CONFIG), "service": service}, "demo")
        running = start(spec)
        server = threading.Thread(target=running.serve, daemon=True)
        server.start()
        while not running.server.started:
            time.sleep(0.05)
        try:
            narrate(running, console, data)
        finally:
            running.server.should_exit = True
            server.join(timeout=10)
            shut_down(running)


def narrate(running: Running, console: Console, data: Path) -> None:
    store = running.store
    console.rule("[bold]gpupool demo[/]: the live scheduler on 4 virtual GPUs, real processes")
    began = time.time()
    narrator = Narrator(store, console, began)
    for i in range(4):
        store.submit(JobSpec(trainer(40), "vision", "low", 1, f"sweep-{i}", workdir=str(data)), time.time())
    running.loop.wakeup.set()
    wait(narrator, lambda: sum(j.state == "running" for j in store.jobs()) == 4, 30)
    time.sleep(3.0)
    store.submit(JobSpec(trainer(16), "nlp", "high", 2, "pretrain", workdir=str(data)), time.time())
    running.loop.wakeup.set()
    wait(narrator, lambda: all(JobState(j.state) in ENDED for j in store.jobs()), 120)
    console.print(summary(store))
    console.print(escape(costs(store, running.loop)))


def wait(narrator: Narrator, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.time() + timeout
    while not done() and time.time() < deadline:
        narrator.tell()
        time.sleep(0.1)
    narrator.tell()


def summary(store: Store) -> Table:
    table = Table(title="Waits per class (submit to first start, and total time pending)")
    for header in ("class", "jobs", "first start, max", "pending in all, max", "preemptions"):
        table.add_column(header, justify="left" if header == "class" else "right")
    by_class: dict[str, list[tuple[JobRow, list[AttemptRow]]]] = {}
    for job in store.jobs():
        by_class.setdefault(job.priority, []).append((job, store.attempts(job.id)))
    for cls, rows in sorted(by_class.items(), key=lambda item: -len(item[0])):
        first = [attempts[0].started_at - job.submit_time for job, attempts in rows if attempts]
        pending = [pending_time(job, attempts) for job, attempts in rows]
        table.add_row(
            cls,
            str(len(rows)),
            f"{max(first, default=0.0):.1f} s",
            f"{max(pending, default=0.0):.1f} s",
            str(sum(job.preemptions for job, _ in rows)),
        )
    return table


def pending_time(job: JobRow, attempts: list[AttemptRow]) -> float:
    waited, since = 0.0, job.submit_time
    for attempt in attempts:
        waited += attempt.started_at - since
        since = attempt.ended_at or attempt.started_at
    return waited


def costs(store: Store, loop: ControlLoop) -> str:
    """Per interruption, what `gpupool.accounting` charges it: work done again, drain (notice to
    release) and the next attempt's restart, in GPU-seconds; and where the next attempt resumed."""
    lines = []
    names = {job.id: job.name for job in store.jobs()}
    for account in store.accounts(time.time()):
        for cut in account.interruptions:
            log = loop.workspace.attempt_dir(account.job_id, cut.attempt + 1) / "stdout.log"
            said = next(iter(log.read_text().splitlines()), "") if log.exists() else ""  # empty: it said nothing yet
            lines.append(
                f"job {account.job_id} ({names[account.job_id]}) {cut.cause}: wasted {gpu_time(cut.wasted)}, "
                f"drain {gpu_time(cut.drain)}, restart {gpu_time(cut.restart or 0.0)}: {gpu_time(cut.lost)} lost; "
                f"its next attempt said: {said!r}"
            )
    return "\n".join(lines) or "no preemption happened"
