"""What seeing the pool costs (metrics and dashboard), on a store the size of a busy lab's year.

A SQLite store with 1,000 nodes × 8 GPUs and 100,000 jobs: 92,000 done (one in ten was
preempted once and resumed; every attempt with a checkpoint), 6,000 running on every GPU, 2,000
pending; about 560,000 events. Prints:

  catch-up   the telemetry reading the whole log once, as `gpupool up` does at start;
  refresh    a read of what is new plus the current state, as every second after;
  scrape     GET /metrics through the app (token check, formatting), p50/p99 of 200: the
             issue's ceiling is 50 ms;
  pages      each dashboard page rendered by the app (server side, signed in as the admin),
             p50/p99 of 20: the issue's ceiling is 300 ms;
  decisions  the control loop's ticks on this store (each one reads the snapshot and decides
             for the 2,000 pending jobs), with metrics on (the telemetry thread refreshing as
             `gpupool up` runs it, told after every tick that the store changed: as often as
             it may) and off, in alternating blocks of the same run: decide's own time and the
             whole tick's, p50 of each, and on / off.

Run: .venv/bin/python -m benchmarks.observability [--jobs 100000] [--nodes 1000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import insert

from gpupool.api import Context, create_app
from gpupool.model import DEFAULT_CLASSES, Config, Node, Plan
from gpupool.policy import PoolState
from gpupool.service.loop import ControlLoop
from gpupool.service.workspace import token_hash
from gpupool.store import Store
from gpupool.store.schema import AttemptRow, CheckpointRow, EventRow, JobRow, PlacementRow
from gpupool.telemetry import Telemetry
from tests.support.fakes import FakeExecutor

TEAMS = [f"team{i}" for i in range(10)]
CLASSES = ["high", "normal", "low"]
SIZES = [1] * 70 + [2] * 10 + [4] * 10 + [8] * 10
ADMIN = "bench-admin"


def populate(store: Store, jobs: int, nodes: int, rng: random.Random) -> None:
    store.sync_config(Config(DEFAULT_CLASSES))
    for team in TEAMS:
        store.set_team(team, guaranteed_gpus=nodes * 8 // 20)
    store.set_nodes([Node(f"node{i:04d}", 8, "a100") for i in range(nodes)], virtual=True)
    running = nodes * 8 // 8 * 6 // 8 * 8  # 6,000 jobs hold every GPU of 1,000 nodes
    running = min(running, jobs)
    pending = min(jobs // 50, jobs - running)
    done = jobs - running - pending
    rows: dict[str, list[dict[str, Any]]] = {"jobs": [], "attempts": [], "placements": [], "events": [], "ckpt": []}
    free = [(f"node{i:04d}", g) for i in range(nodes) for g in range(8)]
    t = time.time() - 30.0 * jobs - 7200  # the newest jobs are of the last hours
    for job_id in range(1, jobs + 1):
        kind = "done" if job_id <= done else ("running" if job_id <= done + running else "pending")
        # The pending are low: they wait for free GPUs, so every tick decides the same again.
        team, priority = rng.choice(TEAMS), "low" if kind == "pending" else rng.choice(CLASSES)
        gpus = rng.choice(SIZES) if kind != "running" else 1
        t += 30.0
        state = {"done": "succeeded", "running": "running", "pending": "pending"}[kind]
        rows["jobs"].append(
            {
                "id": job_id,
                "name": f"job{job_id}",
                "team": team,
                "priority": priority,
                "gpus": gpus,
                "command": ["train"],
                "workdir": "/tmp",
                "env": {},
                "state": state,
                "submit_time": t,
                "attempts": 0 if kind == "pending" else 1,
                "wait_reason": "no_victims" if kind == "pending" else None,
            }
        )
        events: list[tuple[str, int | None, float]] = [("submitted", None, t)]
        if kind != "pending":
            attempts = 2 if kind == "done" and rng.random() < 0.1 else 1
            rows["jobs"][-1]["attempts"] = attempts
            start = t + rng.uniform(0, 600)
            for number in range(attempts):
                last = number == attempts - 1
                live = kind == "running" and last
                end = start + rng.uniform(600, 7200)
                outcome = None if live else ("succeeded" if last else "preempted")
                rows["attempts"].append(
                    {
                        "job_id": job_id,
                        "attempt": number,
                        "started_at": start,
                        "productive_at": start + 20,
                        "last_heartbeat_at": start + 60,
                        "restored_step": 10 if number else None,
                        "notice_at": end - 30 if outcome == "preempted" else None,
                        "ended_at": None if live else end,
                        "outcome": outcome,
                        "priority": priority,
                    }
                )
                rows["ckpt"].append(
                    {"job_id": job_id, "attempt": number, "time": start + 300, "step": 10, "seconds": 2.0}
                )
                events += [("starting", number, start), ("running", number, start + 1)]
                if outcome == "preempted":
                    events += [("preempting", number, end - 30), ("pending", number, end)]
                    start = end + 60
                elif outcome == "succeeded":
                    events.append(("succeeded", number, end))
                else:
                    node, gpu = free.pop()
                    rows["placements"].append(
                        {"job_id": job_id, "attempt": number, "node": node, "gpu": gpu, "held_from": start}
                    )
        for kind_, attempt, when in events:
            data = {"reason": "priority"} if kind_ == "preempting" else {}
            rows["events"].append(
                {"time": when, "kind": kind_, "job_id": job_id, "attempt": attempt, "message": "", "data": data}
            )
    with store.transaction() as s:
        for table, batch in (
            (JobRow, rows["jobs"]),
            (AttemptRow, rows["attempts"]),
            (PlacementRow, rows["placements"]),
            (CheckpointRow, rows["ckpt"]),
            (EventRow, rows["events"]),
        ):
            for i in range(0, len(batch), 20_000):
                s.execute(insert(table), batch[i : i + 20_000])
    print(f"store: {jobs:,} jobs ({done:,} done, {running:,} running, {pending:,} pending), {nodes:,} nodes, "
          f"{len(rows['events']):,} events")  # fmt: skip


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q * 100) - 1] if len(values) > 1 else values[0]


class Timing:
    """The loop's observer that keeps decide's time, and passes everything on."""

    def __init__(self, inner: Telemetry | None) -> None:
        self.inner = inner
        self.decide: list[float] = []

    def on_decision(self, now: float, state: PoolState, plan: Plan, seconds: float) -> None:
        self.decide.append(seconds)
        if self.inner is not None:
            self.inner.on_decision(now, state, plan, seconds)

    def on_tick(self, now: float, changed: bool) -> None:
        if self.inner is not None:
            # As if every tick changed the store: the telemetry refreshes as often as it may.
            self.inner.on_tick(now, True)


def decisions(store: Store, folder: Path, telemetry: Telemetry, blocks: int, ticks: int) -> None:
    loop = ControlLoop(store, Config(DEFAULT_CLASSES), FakeExecutor(store), folder / "data")
    loop.tick(time.time())  # the waits are recorded once; later ticks decide and change nothing
    results: dict[str, tuple[list[float], list[float]]] = {"off": ([], []), "on": ([], [])}
    for block in range(2 * blocks):
        mode = "on" if block % 2 else "off"
        timing = Timing(telemetry if mode == "on" else None)
        loop.observer = timing
        stop = threading.Event()
        thread = threading.Thread(target=telemetry.run, args=(stop,), daemon=True)
        if mode == "on":
            thread.start()
        tick_times = results[mode][1]
        for _ in range(ticks):
            began = time.perf_counter()
            loop.tick(time.time())
            tick_times.append(time.perf_counter() - began)
        stop.set()
        telemetry.poke.set()
        if mode == "on":
            thread.join()
        results[mode][0].extend(timing.decide)
    (decide_off, tick_off), (decide_on, tick_on) = results["off"], results["on"]
    for name, off, on in (("decide", decide_off, decide_on), ("tick", tick_off, tick_on)):
        a, b = statistics.median(off) * 1000, statistics.median(on) * 1000
        print(f"{name:>9}  p50 off {a:7.1f} ms   on {b:7.1f} ms   on/off {b / a:5.3f}   ({len(on)} ticks each)")


def pages(client: TestClient, jobs: int) -> None:
    signed = client.post("/ui/signin", data={"token": ADMIN}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    for page in ("/ui/pool", "/ui/queue", "/ui/teams", "/ui/interruptions", f"/ui/jobs/{jobs}", "/ui/pool?fragment=1"):
        times = []
        for _ in range(20):
            time.sleep(0.3)  # a fragment is drawn again after 0.25 s: measure the drawing
            began = time.perf_counter()
            answer = client.get(page)
            times.append(time.perf_counter() - began)
            assert answer.status_code == 200, (page, answer.status_code)
        print(
            f"{page:>22}  p50 {statistics.median(times) * 1000:7.1f} ms   p99 {quantile(times, 0.99) * 1000:7.1f} ms"
            f"   ({len(answer.content) / 1024:.0f} KiB)   ceiling 300 ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--blocks", type=int, default=4, help="blocks of ticks with metrics on, and as many off")
    parser.add_argument("--ticks", type=int, default=10, help="ticks per block")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store = Store.open(f"sqlite:///{folder / 'gpupool.db'}")
        populate(store, args.jobs, args.nodes, random.Random(7))
        telemetry = Telemetry(store)
        began = time.perf_counter()
        telemetry.refresh(time.time())
        print(f" catch-up  {time.perf_counter() - began:7.2f} s for the whole log")
        refreshes = []
        for _ in range(10):
            began = time.perf_counter()
            telemetry.refresh(time.time())
            refreshes.append(time.perf_counter() - began)
        print(f"  refresh  p50 {statistics.median(refreshes) * 1000:7.1f} ms")
        loop = ControlLoop(store, Config(DEFAULT_CLASSES), FakeExecutor(store), folder / "data")
        client = TestClient(create_app(Context(store, loop, token_hash(ADMIN), telemetry=telemetry)))
        headers = {"Authorization": f"Bearer {ADMIN}"}
        size = len(client.get("/metrics", headers=headers).content)
        scrapes = []
        for _ in range(200):
            began = time.perf_counter()
            answer = client.get("/metrics", headers=headers)
            scrapes.append(time.perf_counter() - began)
            assert answer.status_code == 200
        print(
            f"   scrape  p50 {statistics.median(scrapes) * 1000:7.1f} ms   p99 {quantile(scrapes, 0.99) * 1000:7.1f} ms"
            f"   ({size / 1024:.0f} KiB)   ceiling 50 ms"
        )
        pages(client, args.jobs)
        decisions(store, folder, telemetry, args.blocks, args.ticks)
        store.close()


if __name__ == "__main__":
    main()
