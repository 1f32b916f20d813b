"""The live loop on a large pool, PostgreSQL as its store: time from an event to its decision
recorded.

By default 1,000 nodes x 8 virtual GPUs (`--nodes`), 10 pending jobs per node with Philly's
GPU-count mix, 10 teams with guarantees, waits explained as `gpupool up` explains them (the
first `policy.explain_depth` jobs in line). The pool is filled through the control loop
itself (its ticks record every start), then high-priority jobs arrive one at a time
(`--arrivals`), each submitted through the store as the API submits it, with the loop woken
as the API wakes it. The loop runs in its own thread as in `gpupool up`; victims save and leave
at once (their executor ends them at their notice). For each arrival: the time from its
submission's commit to the commit of the plan that preempts or starts for it.

Both ways, in one run, on one server: the loop reading the whole store at every decision (as
before the change journal), then reading what changed since its last decision. Per way: the
latency p50/p99 and where a tick's time goes.
Run: .venv/bin/python -m benchmarks.live_decisions [--nodes 10000 --arrivals 100]
"""

from __future__ import annotations

import argparse
import bisect
import random
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.progress import Progress

import gpupool.service.loop as service_module
from benchmarks.decision_throughput import CLASSES, GPUS, TEAMS, percentile, workload
from gpupool.model import Config, Node, Plan, Team
from gpupool.service.loop import ControlLoop
from gpupool.store import JobSpec, Store
from tests.support.fakes import FakeExecutor
from tests.support.pgserver import postgres_server


class Cooperating(FakeExecutor):
    """Victims that save and leave as soon as they get their notice."""

    def notify(self, job_id: int, attempt: int, deadline: float) -> None:
        super().notify(job_id, attempt, deadline)
        self.finish(job_id, attempt, 0)


class Phases:
    """Seconds spent in each part of the loop's ticks."""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = defaultdict(list)

    def wrap(self, owner: Any, name: str, label: str | None = None) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.spent[label or name].append(time.perf_counter() - began)

        setattr(owner, name, timed)

    def line(self) -> str:
        parts = [f"{name} {statistics.median(s) * 1e3:.1f}/{max(s) * 1e3:.0f}" for name, s in self.spent.items()]
        return "median/max ms: " + ", ".join(parts)


def seed(store: Store, nodes: int, pending: int, progress: Progress) -> None:
    rng = random.Random(42)
    jobs = workload(rng, pending)
    task = progress.add_task("submitting the backlog", total=len(jobs))
    for i in range(0, len(jobs), 2000):
        specs = [
            JobSpec(["train"], team=j.team, priority=j.priority, gpus=j.gpus, gpus_per_node=j.gpus_per_node)
            for j in jobs[i : i + 2000]
        ]
        store.submit_many(specs, now=1000.0 + i)
        progress.advance(task, len(specs))


@contextmanager
def running_loop(loop: ControlLoop) -> Iterator[None]:
    """The loop in its thread, once it has reconciled the live attempts and ticked once (a
    start-up cost, not an event's)."""
    stop = threading.Event()
    ticked = threading.Event()
    tick = loop.tick

    def first(now: float) -> bool:
        try:
            return tick(now)
        finally:
            ticked.set()

    loop.tick = first  # type: ignore[method-assign]
    thread = threading.Thread(target=loop.run, args=(stop,), name="control-loop", daemon=True)
    thread.start()
    ticked.wait()
    loop.tick = tick  # type: ignore[method-assign]
    try:
        yield
    finally:
        stop.set()
        loop.wakeup.set()
        thread.join(timeout=120)


def storm(store: Store, loop: ControlLoop, arrivals: int, rng: random.Random, progress: Progress, label: str) -> None:
    """High-priority arrivals one at a time: submission commit -> commit of its plan."""
    recorded: dict[int, float] = {}
    seen = threading.Event()
    record_plan: Callable[..., None] = store.record_plan

    def noting(plan: Plan, now: float, tokens: Any = None) -> None:
        record_plan(plan, now, tokens)
        at = time.perf_counter()
        for job in [*(s.job for s in plan.starts), *(p.for_job for p in plan.preemptions)]:
            recorded.setdefault(int(job), at)
        seen.set()

    store.record_plan = noting  # type: ignore[method-assign]
    phases = Phases()
    phases.wrap(loop.snapshots, "read", "read")
    phases.wrap(service_module, "decide", "decide")
    phases.wrap(store, "record_plan", "record")
    phases.wrap(loop, "enforce_deadlines")
    phases.wrap(loop, "reap")
    phases.wrap(loop, "tick")
    tick_starts: list[float] = []
    timed_tick = loop.tick

    def tick(now: float) -> bool:
        tick_starts.append(time.perf_counter())
        return timed_tick(now)

    loop.tick = tick  # type: ignore[method-assign]
    latencies = []
    events: list[tuple[float, float, float]] = []
    """(latency, submitted, recorded) of each arrival decided."""
    task = progress.add_task(f"arrivals, {label}", total=arrivals)
    with running_loop(loop):
        for _ in range(arrivals):
            gpus = rng.choices([1, 2, 4, 8, 16], [40, 15, 15, 25, 5])[0]
            spec = JobSpec(["urgent"], team=rng.choice(TEAMS), priority="high", gpus=gpus)
            if gpus > GPUS:
                spec = JobSpec(["urgent"], team=spec.team, priority="high", gpus=gpus, gpus_per_node=GPUS)
            job = store.submit(spec, now=time.time())
            submitted = time.perf_counter()
            loop.wakeup.set()
            deadline = submitted + 120
            while job.id not in recorded and time.perf_counter() < deadline:
                seen.wait(0.5)
                seen.clear()
            if job.id in recorded:
                latencies.append(recorded[job.id] - submitted)
                events.append((latencies[-1], submitted, recorded[job.id]))
            progress.advance(task)
            time.sleep(rng.uniform(0.2, 0.6))  # the next event comes while the loop works on this one
    store.record_plan = record_plan  # type: ignore[method-assign]
    loop.tick = timed_tick  # type: ignore[method-assign]
    missed = arrivals - len(latencies)
    progress.console.print(
        f"[bold]{label}[/]: event -> decision recorded p50 {statistics.median(latencies) * 1e3:.0f} ms, "
        f"p90 {percentile(latencies, 0.9) * 1e3:.0f} ms, p99 {percentile(latencies, 0.99) * 1e3:.0f} ms, "
        f"max {max(latencies) * 1e3:.0f} ms" + (f" ({missed} arrivals not decided within 120 s)" if missed else ""),
        highlight=False,
    )
    progress.console.print(f"  {phases.line()}", highlight=False)
    # The slowest: how long each waited for the tick that decided it, and that tick's length.
    slowest = []
    for latency, submitted, decided in sorted(events, reverse=True)[:3]:
        began = tick_starts[bisect.bisect_right(tick_starts, decided) - 1]
        slowest.append(
            f"{latency * 1e3:.0f} ms = {(began - submitted) * 1e3:.0f} waiting + {(decided - began) * 1e3:.0f}"
        )
    progress.console.print(f"  slowest (waiting for the tick + in it): {'; '.join(slowest)}", highlight=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of 8 GPUs (default 1000)")
    parser.add_argument("--pending", type=int, default=None, help="pending jobs (default 10 per node)")
    parser.add_argument("--arrivals", type=int, default=50, help="high-priority arrivals (default 50)")
    parser.add_argument(
        "--whole-arrivals", type=int, default=10, help="of them, for the loop reading the whole store (default 10)"
    )
    args = parser.parse_args()
    pending = args.pending if args.pending is not None else 10 * args.nodes
    teams = {t: Team(t, guaranteed_gpus=args.nodes * GPUS // len(TEAMS)) for t in TEAMS}
    config = Config(CLASSES, teams, max_preemptions=None, explain_depth=1000)
    rng = random.Random(7)
    print(f"{args.nodes:,} nodes x {GPUS} GPUs, {pending:,} pending; PostgreSQL")
    with (
        postgres_server(durable=True) as url,
        tempfile.TemporaryDirectory() as tmp,
        Progress(transient=True) as progress,
    ):
        store = Store.open(url)
        store.sync_config(config)
        nodes = [Node(f"n{i:05d}", GPUS, "virtual") for i in range(args.nodes)]
        store.set_nodes(nodes, virtual=True)
        began = time.perf_counter()
        seed(store, args.nodes, pending, progress)
        loop = ControlLoop(store, config, Cooperating(store, pool=nodes), Path(tmp), api_url="http://127.0.0.1:1")
        task = progress.add_task("filling the pool through the loop", total=None)
        now = time.time()
        while loop.tick(now):
            progress.advance(task)
            now = time.time()
        progress.console.print(f"set-up (submit, fill through the loop): {time.perf_counter() - began:.0f} s")
        loop.snapshots.resync = 0.0  # every read takes everything: the loop as it was
        storm(store, loop, args.whole_arrivals, rng, progress, "whole store read at every decision")
        loop.snapshots.resync = 3600.0
        loop.snapshots.forget()
        storm(store, loop, args.arrivals, rng, progress, "changes read since the last decision")
        store.close()


if __name__ == "__main__":
    main()
