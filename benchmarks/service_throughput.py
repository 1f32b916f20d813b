"""The live service: submissions per second through the API (SQLite, PostgreSQL), jobs started
per second on virtual GPUs, and preemption latency with a cooperating victim.

Everything runs as it would on a workstation: `gpupool up` is its own process (store, control
loop, local executor, API), the clients are other processes speaking HTTP on loopback (httpx,
one keep-alive connection each), and their jobs are real processes. SQLite runs as the service
does, WAL with synchronous=FULL (every commit is synced: a 201 survives a power loss); the label
says what the store's connections report. PostgreSQL is a throwaway server with its default
durability (fsync on). Run: .venv/bin/python -m benchmarks.service_throughput
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml
from sqlalchemy import create_engine, text

from gpupool.store import Store
from gpupool.store.engine import connect, sqlite_url
from gpupool.up import free_port
from tests.support.live import wait_for
from tests.support.pgserver import postgres_server

SUBMISSIONS = 2000
SHORT_JOBS = 500
CLASSES = {
    "gate": {"value": 200, "may_preempt": False, "preemptible": False, "grace_period": "10s"},
    "high": {"value": 100, "may_preempt": True, "preemptible": False, "grace_period": "10s"},
    "low": {"value": 0, "may_preempt": False, "preemptible": True, "grace_period": "10s"},
}
VICTIM = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n",
]


@dataclass
class Service:
    url: str
    token: str
    store: Store

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)


@contextmanager
def served(
    store: str | None, gpus: int, more: dict[str, object] | None = None, **settings: object
) -> Iterator[Service]:
    """`gpupool up` in its own process, on a fresh data directory, with these service
    `settings` too (and `more` top-level configuration); stopped at the end."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        data, port = Path(tmp), free_port()
        service = {"data_dir": str(data), "port": port, "virtual_gpus": gpus, "interval": 0.5, "run_as": "service"}
        service |= settings
        if store is not None:
            service["store"] = store
        config = data / "gpupool.yaml"
        config.write_text(yaml.safe_dump({"classes": CLASSES, "service": service, **(more or {})}))
        process = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "up", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: (data / "admin.token").exists() and answers(f"http://127.0.0.1:{port}"))
            url = f"http://127.0.0.1:{port}"
            yield Service(url, (data / "admin.token").read_text().strip(), Store.open(store or sqlite_url(data)))
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)


def fresh_database(server: str, name: str) -> str:
    """The URL of a new, empty database `name` on the PostgreSQL server of `server` (a URL)."""
    engine = create_engine(server.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return server.rsplit("/", 1)[0] + f"/{name}"


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/docs").is_success
    except httpx.TransportError:
        return False


def submitter(url: str, token: str, count: int, ready: multiprocessing.synchronize.Barrier) -> None:
    """One client: `count` submissions, one after the other, on one keep-alive connection. The
    standard library's HTTP client, so that the load generator takes little of the CPU it shares
    with the service."""
    body = json.dumps({"command": ["true"], "priority": "low", "gpus": 1})
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connection = http.client.HTTPConnection(urlsplit(url).netloc, timeout=60)
    ready.wait()
    for _ in range(count):
        connection.request("POST", "/jobs", body, headers)
        response = connection.getresponse()
        response.read()
        if response.status != 201:
            raise RuntimeError(f"submission refused: {response.status}")
    connection.close()


def submissions_per_second(store: str | None, clients: int) -> float:
    """`clients` processes submit SUBMISSIONS jobs in all into a pool too small to start them:
    submissions per second, from the first to the last."""
    with served(store, gpus=1) as service:
        with service.client() as client:
            holder = client.post("/jobs", json={"command": ["sleep", "600"], "priority": "low"}).json()["id"]
            spawn = multiprocessing.get_context("spawn")
            ready = spawn.Barrier(clients + 1)
            each = SUBMISSIONS // clients
            workers = [
                spawn.Process(target=submitter, args=(service.url, service.token, each, ready)) for _ in range(clients)
            ]
            for worker in workers:
                worker.start()
            ready.wait()
            began = time.perf_counter()
            for worker in workers:
                worker.join()
            elapsed = time.perf_counter() - began
            assert all(w.exitcode == 0 for w in workers), "a client failed"
            client.post(f"/jobs/{holder}/cancel").raise_for_status()
            assert len(service.store.jobs(limit=SUBMISSIONS + 10)) == each * clients + 1
        return each * clients / elapsed


def sqlite_synchronous() -> str:
    """What SQLite's `synchronous` is on the store's connections: FULL, NORMAL or OFF."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = connect(sqlite_url(Path(tmp)))
        with engine.connect() as connection:
            level = connection.execute(text("PRAGMA synchronous")).scalar()
        engine.dispose()
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(int(level or 0), str(level))


def all_succeeded(service: Service, count: int) -> bool:
    return sum(j.state == "succeeded" for j in service.store.jobs(limit=count + 10)) >= count


def starts_per_second(gpus: int = 64, containment: str = "auto") -> float:
    """SHORT_JOBS jobs (`true`) queue behind a job holding all the GPUs; when it is cancelled
    they drain: attempts started per second, from the first start to the last. `containment`:
    the service's `containment.mode`."""
    with (
        served(None, gpus=gpus, containment={"mode": containment}) as service,
        service.client() as client,
    ):
        gate = client.post("/jobs", json={"command": ["sleep", "600"], "priority": "gate", "gpus": gpus}).json()["id"]
        for _ in range(SHORT_JOBS):
            client.post("/jobs", json={"command": ["true"], "priority": "low"}).raise_for_status()
        client.post(f"/jobs/{gate}/cancel").raise_for_status()
        wait_for(partial(all_succeeded, service, SHORT_JOBS), timeout=120)
        jobs = [j for j in service.store.jobs(limit=SHORT_JOBS + 10) if j.id != gate]
        starts = sorted(a.started_at for j in jobs for a in service.store.attempts(j.id))
        return (len(starts) - 1) / (starts[-1] - starts[0])


def says_ready(client: httpx.Client, job: int) -> bool:
    return "ready" in client.get(f"/jobs/{job}/logs").text


def in_state(service: Service, job: int, states: tuple[str, ...]) -> bool:
    return service.store.job(job).state in states


def preemption_latency(rounds: int = 10, containment: str = "auto") -> list[float]:
    """Seconds from a high-priority submission into a full pool to the preemptor running, with
    a victim that exits on SIGTERM."""
    latencies = []
    with served(None, gpus=1, containment={"mode": containment}) as service, service.client() as client:
        for _ in range(rounds):
            victim = client.post("/jobs", json={"command": VICTIM, "priority": "low"}).json()["id"]
            wait_for(partial(says_ready, client, victim))
            began = time.time()
            urgent = client.post("/jobs", json={"command": ["sleep", "0.2"], "priority": "high"}).json()["id"]
            wait_for(partial(in_state, service, urgent, ("running", "succeeded")))
            running_at = next(e.time for e in service.store.events(job_id=urgent) if e.kind == "running")
            latencies.append(running_at - began)
            wait_for(partial(in_state, service, urgent, ("succeeded",)))
            client.post(f"/jobs/{victim}/cancel")
            wait_for(partial(in_state, service, victim, ("cancelled",)))
    return latencies


def main() -> None:
    print(f"on {os.cpu_count()} CPUs; {SUBMISSIONS} submissions, each client one keep-alive connection", flush=True)
    sqlite = f"SQLite (WAL, synchronous={sqlite_synchronous()})"
    for clients in (1, 4, 8):
        rate = submissions_per_second(None, clients)
        print(f"{f'submissions/s through the API, {sqlite}, {clients} client(s):':72} {rate:6.0f}", flush=True)
    with postgres_server(durable=True) as server:
        for clients in (1, 4, 8):
            rate = submissions_per_second(fresh_database(server, f"bench{clients}"), clients)
            label = f"submissions/s through the API, PostgreSQL (fsync on), {clients} client(s):"
            print(f"{label:72} {rate:6.0f}", flush=True)
    for mode in containment_modes():
        rate = starts_per_second(containment=mode)
        print(f"{f'attempts started/s, {SHORT_JOBS} short jobs onto 64 GPUs, containment {mode}:':72} {rate:6.0f}")
    for mode in containment_modes():
        latency = preemption_latency(containment=mode)
        print(
            f"preemption latency (arrival → preemptor started), cooperating victim, containment {mode}: "
            f"median {statistics.median(latency) * 1000:.0f} ms, max {max(latency) * 1000:.0f} ms over {len(latency)}",
            flush=True,
        )


def containment_modes() -> list[str]:
    """`cgroups` where this host allows them, and `off` (process groups), in one run."""
    from gpupool.executors.cgroups import Layout
    from gpupool.executors.containment import unavailable

    return ["cgroups", "off"] if unavailable(Layout.read()) is None else ["off"]


if __name__ == "__main__":
    main()
