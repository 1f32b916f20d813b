"""Driving a live service: `gpupool up` as a real process with its command line (`Service`),
waiting for what it does (`wait_for`), and a job preempted through it (`preempted`). For the
live tests and the benchmarks."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from gpupool.executors.proc import kill_attempts
from gpupool.store import Store
from gpupool.store.engine import sqlite_url
from gpupool.store.schema import PlacementRow
from gpupool.up import free_port


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, every: float = 0.02) -> float:
    """Poll `condition` until it holds; return the seconds it took, or fail after `timeout`."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout} s")
        time.sleep(every)
    return time.monotonic() - began


class Service:
    def __init__(self, tmp: Path, grace: str = "2s", more: str = "") -> None:
        """`more`: configuration appended (YAML, top-level keys other than these)."""
        self.config = tmp / "gpupool.yaml"
        self.data = tmp / "data"
        self.port = free_port()
        self.config.write_text(
            f"service: {{data_dir: {self.data}, port: {self.port}, virtual_gpus: 2, interval: 0.2, run_as: service}}\n"
            "classes:\n"
            f"  high: {{value: 100, may_preempt: true, preemptible: false, grace_period: {grace}}}\n"
            f"  low: {{value: 0, may_preempt: false, preemptible: true, grace_period: {grace}}}\n"
            f"{more}"
        )
        self.process: subprocess.Popen[str] | None = None
        self.output_file = tmp / "up.log"
        self.env = {**os.environ, "COLUMNS": "200"}
        self.env.pop("GPUPOOL_TOKEN", None)

    def up(self) -> None:
        command = [sys.executable, "-m", "gpupool", "up", "--config", str(self.config)]
        # A file, not a pipe: nobody reads a pipe while the service runs, and a full one would
        # block its logging.
        with self.output_file.open("a") as output:
            self.process = subprocess.Popen(command, env=self.env, stdout=output, stderr=subprocess.STDOUT, text=True)
        process = self.process
        # A generous ceiling for a loaded machine; a service that exited says why at once.
        wait_for(lambda: self.ready() or process.poll() is not None, timeout=90)
        if process.poll() is not None:
            raise AssertionError(f"gpupool up exited with {process.returncode}: {self.output()[-2000:]}")

    def output(self) -> str:
        """What `gpupool up` has printed so far (every run of it in this test)."""
        return self.output_file.read_text(errors="replace") if self.output_file.exists() else ""

    def get(self, path: str) -> httpx.Response | None:
        """GET on the API with the admin token; None while the service does not answer."""
        try:
            token = (self.data / "admin.token").read_text().strip()
            return httpx.get(f"http://127.0.0.1:{self.port}{path}", headers={"Authorization": f"Bearer {token}"})
        except (OSError, httpx.TransportError):
            return None

    def ready(self) -> bool:
        response = self.get("/pool")
        return response is not None and response.is_success

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run_cli(self.env, *args)

    def submit(self, *args: str, env: dict[str, str] | None = None) -> int:
        """`gpupool submit --parsable --priority low ARGS`, which must succeed: the job's id."""
        done = self.run_cli(env or self.env, "submit", "--parsable", "--priority", "low", *args)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    def run_cli(self, env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """The command line with this configuration, in the environment `env` (and folder `cwd`)."""
        command = [sys.executable, "-m", "gpupool", *args]
        if args[0] != "submit" or "--" not in args:
            command += ["--config", str(self.config)]
        else:
            split = command.index("--")
            command[split:split] = ["--config", str(self.config)]
        return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def state(service: Service, job: int) -> str:
    response = service.get(f"/jobs/{job}")
    return str(response.json()["state"]) if response is not None and response.is_success else ""


def given_notice(service: Service, job: int) -> bool:
    """Whether the store has recorded a notice to `job` (it went to preempting)."""
    response = service.get(f"/events?job={job}")
    return response is not None and response.is_success and any(e["kind"] == "preempting" for e in response.json())


def assert_no_gpu_held_twice(service: Service) -> None:
    """From the recorded placements: no GPU was held by two attempts over overlapping times."""
    store = Store.open(sqlite_url(service.data))
    with store.transaction() as s:
        rows = s.scalars(select(PlacementRow)).all()
        placements = sorted((p.node, p.gpu, p.held_from, p.held_until or float("inf")) for p in rows)
    store.close()
    for (node, gpu, _, end), (node2, gpu2, start2, _) in itertools.pairwise(placements):
        if (node, gpu) == (node2, gpu2):
            assert start2 >= end, f"GPU {node}:{gpu} held by two attempts at once"


def running(service: Service) -> Iterator[Service]:
    """A fixture's body: `gpupool up`, then stop it and whatever it left running."""
    service.up()
    yield service
    process = service.process
    if process is not None and process.poll() is None:
        process.terminate()
        process.wait(timeout=10)
        output = service.output()
        print(f"--- gpupool up's output, last lines ---\n{output[-6000:]}")  # shown when a test fails
        assert "SnapshotDrift" not in output, output[-3000:]
    kill_attempts(service.data)


def uninterrupted(command: list[str], checkpoints: Path, timeout: float) -> str:
    """What `command` prints run outside gpupool (no `GPUPOOL_` variable but its checkpoint
    folder): the output of a run that nobody interrupts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_CHECKPOINT_DIR"] = str(checkpoints)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=True).stdout


def preempted(
    service: Service, command: list[str], notices: Sequence[str], timeout: float
) -> tuple[dict[str, Any], list[str]]:
    """Job 1, `command` at class low on 2 GPUs, given notice by a high job once the log of its
    attempt N shows `notices[N]`, each awaited up to `timeout` seconds; once it has succeeded
    (within twice that), its record and the logs of its attempts."""
    token = (service.data / "admin.token").read_text().strip()
    api = httpx.Client(base_url=f"http://127.0.0.1:{service.port}", headers={"Authorization": f"Bearer {token}"})

    def log(attempt: int) -> str:
        response = api.get("/jobs/1/logs", params={"attempt": attempt})
        return response.text if response.is_success else ""

    api.post("/jobs", json={"command": command, "priority": "low", "gpus": 2}).raise_for_status()
    urgent = {"command": ["sleep", "0.3"], "priority": "high", "gpus": 2}
    for attempt, after in enumerate(notices):
        wait_for(lambda a=attempt, s=after: s in log(a), timeout=timeout)  # type: ignore[misc]
        api.post("/jobs", json=urgent).raise_for_status()
    wait_for(lambda: state(service, 1) == "succeeded", timeout=2 * timeout)
    return api.get("/jobs/1").json(), [log(a) for a in range(len(notices) + 1)]
