"""The live service: submissions per second through the API (SQLite, PostgreSQL), jobs started
per second on virtual GPUs, and preemption latency with a cooperating victim.

Everything runs for real on loopback: `gpupool.up.start` (store, control loop, local executor)
and its API served by uvicorn; the client is httpx over HTTP. PostgreSQL is a throwaway server
started like the test suite's. Run: .venv/bin/python benchmarks/service_throughput.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gpupool.config import parse_spec
from gpupool.testing import wait_for
from gpupool.up import Running, admin_token, free_port, shut_down, start
from pgserver import postgres_server

SUBMISSIONS = 1000
SHORT_JOBS = 300
CONFIG = {
    "classes": {
        "high": {"value": 100, "may_preempt": True, "preemptible": False, "grace_period": "10s"},
        "low": {"value": 0, "may_preempt": False, "preemptible": True, "grace_period": "10s"},
    },
}
VICTIM = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n",
]


@contextmanager
def service(store: str | None, gpus: int) -> Iterator[tuple[Running, httpx.Client]]:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        port = free_port()
        spec = parse_spec(
            {
                **CONFIG,
                "service": {"data_dir": tmp, "port": port, "virtual_gpus": gpus, "store": store, "interval": 0.5},
            }
        )
        running = start(spec)
        server = threading.Thread(target=running.server.run, daemon=True)
        server.start()
        while not running.server.started:
            time.sleep(0.02)
        token = admin_token(Path(tmp))
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"})
        try:
            yield running, client
        finally:
            for attempt in running.store.live_attempts():
                running.loop.executor.kill(attempt.job_id, attempt.attempt)
            running.server.should_exit = True
            server.join(timeout=10)
            shut_down(running)


def submissions_per_second(store: str | None) -> float:
    """Submissions into a pool too small to start them, so the loop does little else."""
    with service(store, gpus=1) as (_, client):
        client.post("/jobs", json={"command": ["sleep", "600"], "priority": "low"})  # holds the only GPU
        body = {"command": ["true"], "priority": "low", "gpus": 1}
        began = time.perf_counter()
        for _ in range(SUBMISSIONS):
            client.post("/jobs", json=body).raise_for_status()
        return SUBMISSIONS / (time.perf_counter() - began)


def starts_per_second() -> float:
    """Short jobs (`true`) submitted at once onto 64 virtual GPUs: attempts started per second,
    from the first start to the last."""
    with service(None, gpus=64) as (running, client):
        store = running.store
        running.loop.wakeup.clear()
        for _ in range(SHORT_JOBS):
            client.post("/jobs", json={"command": ["true"], "priority": "low"}).raise_for_status()
        wait_for(lambda: all(j.state == "succeeded" for j in store.jobs(limit=SHORT_JOBS + 1)))
        starts = sorted(a.started_at for j in store.jobs(limit=SHORT_JOBS + 1) for a in store.attempts(j.id))
        return (len(starts) - 1) / (starts[-1] - starts[0])


def says_ready(client: httpx.Client, job: int) -> bool:
    return "ready" in client.get(f"/jobs/{job}/logs").text


def in_state(running: Running, job: int, states: tuple[str, ...]) -> bool:
    return running.store.job(job).state in states


def preemption_latency(rounds: int = 10) -> list[float]:
    """Seconds from a high-priority submission into a full pool to the preemptor running, with
    a victim that exits on SIGTERM."""
    latencies = []
    with service(None, gpus=1) as (running, client):
        store = running.store
        for _ in range(rounds):
            victim = client.post("/jobs", json={"command": VICTIM, "priority": "low"}).json()["id"]
            wait_for(partial(says_ready, client, victim))
            began = time.time()
            urgent = client.post("/jobs", json={"command": ["sleep", "0.2"], "priority": "high"}).json()["id"]
            wait_for(partial(in_state, running, urgent, ("running", "succeeded")))
            running_at = next(e.time for e in store.events(job_id=urgent) if e.kind == "running")
            latencies.append(running_at - began)
            wait_for(partial(in_state, running, urgent, ("succeeded",)))
            client.post(f"/jobs/{victim}/cancel")
            wait_for(partial(in_state, running, victim, ("cancelled",)))
    return latencies


def main() -> None:
    print(f"submissions/s through the API, SQLite:     {submissions_per_second(None):7.0f}", flush=True)
    with postgres_server() as url:
        print(f"submissions/s through the API, PostgreSQL: {submissions_per_second(url):7.0f}", flush=True)
    print(f"attempts started/s, {SHORT_JOBS} short jobs, 64 GPUs: {starts_per_second():6.0f}", flush=True)
    latency = preemption_latency()
    print(
        f"preemption latency (arrival → preemptor started), cooperating victim: "
        f"median {statistics.median(latency) * 1000:.0f} ms, max {max(latency) * 1000:.0f} ms over {len(latency)}"
    )


if __name__ == "__main__":
    main()
