"""Real GPUs as NVML shows them (issue 34), through a stand-in for NVIDIA's `pynvml` that the
test drives (tests/support/fake_nvml): a GPU that a process of no live attempt holds is `dirty`
and given to no job until that process ends; what an ended attempt left on a GPU is killed; and
each attempt's peak GPU memory is counted."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.executors.cgroups import Cgroup, Layout, Limits, cgroup_path
from gpupool.executors.containment import unavailable
from gpupool.executors.proc import process_started
from gpupool.store import Store
from gpupool.store.engine import sqlite_url
from tests.support.live import Service, running, state, wait_for

FAKE_NVML = Path(__file__).resolve().parents[1] / "support" / "fake_nvml"
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory": 85520809984}

pytestmark = pytest.mark.skipif(unavailable(Layout.read()) is not None, reason="no cgroups here")


class Gpus:
    """The fake NVML's file: two GPUs, and the compute processes the test puts on them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.processes: dict[int, list[dict[str, int]]] = {0: [], 1: []}
        self.write()

    def write(self) -> None:
        gpus = [{**H100, "processes": self.processes[i]} for i in range(2)]
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps({"gpus": gpus}))
        os.replace(partial, self.path)

    def put(self, gpu: int, pid: int, memory: int) -> None:
        self.processes[gpu].append({"pid": pid, "memory": memory})
        self.write()

    def clear(self, gpu: int) -> None:
        self.processes[gpu] = []
        self.write()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Service]:
    service = Service(tmp_path)
    gpus = Gpus(tmp_path / "nvml.json")
    service.env.update(PYTHONPATH=str(FAKE_NVML), GPUPOOL_FAKE_NVML=str(gpus.path))
    service.gpus = gpus  # type: ignore[attr-defined]
    yield from running(service)


def pool(lab: Service) -> dict[str, Any]:
    response = lab.get("/pool")
    assert response is not None
    shown: dict[str, Any] = response.json()
    return shown


def test_a_stray_process_makes_its_gpu_dirty_until_it_ends(lab: Service) -> None:
    gpus: Gpus = lab.gpus  # type: ignore[attr-defined]
    [node] = pool(lab)["nodes"]
    assert (node["gpu_type"], node["virtual"], node["gpus"]) == (H100["name"], False, 2)
    stray = subprocess.Popen(["sleep", "600"])
    try:
        gpus.put(1, stray.pid, 3 << 30)
        wait_for(lambda: pool(lab)["nodes"][0]["gpu_states"][1]["state"] == "dirty", timeout=30)
        said = pool(lab)["nodes"][0]["gpu_states"][1]["dirty"]
        assert said == f"pid {stray.pid} (root)", said
        printed = " ".join(lab.cli("pool").stdout.split())
        assert f"dirty: GPU 1 of {node['name']}: pid {stray.pid} (root), of no live attempt" in printed, printed
        both = lab.submit("--gpus", "2", "--", "true")
        one = lab.submit("--", "true")
        wait_for(lambda: state(lab, one) == "succeeded", timeout=30)
        assert state(lab, both) == "pending", "a job was given a dirty GPU"
        events = [e["message"] for e in lab.get("/events").json()]  # type: ignore[union-attr]
        assert any(f"GPU 1 of {node['name']} is dirty: pid {stray.pid}" in m for m in events), events
        listed = lab.cli("events")
        assert listed.returncode == 0 and "gpu_dirty" in listed.stdout, listed.stdout + listed.stderr
    finally:
        stray.kill()
        stray.wait()
    gpus.clear(1)
    wait_for(lambda: state(lab, both) == "succeeded", timeout=30)
    events = [e["message"] for e in lab.get("/events").json()]  # type: ignore[union-attr]
    assert any(f"GPU 1 of {node['name']} is clean again" in m for m in events), events


def test_what_an_ended_attempt_left_on_a_gpu_is_killed(lab: Service) -> None:
    """As if a leftover had outlived its attempt's kill (a process in uninterruptible sleep
    while its cgroup was killed): found on a GPU in the ended attempt's cgroup, it is killed."""
    gpus: Gpus = lab.gpus  # type: ignore[attr-defined]
    job = lab.submit("--", "true")
    wait_for(lambda: state(lab, job) == "succeeded", timeout=30)
    store = Store.open(sqlite_url(lab.data))
    store_id = store.identity().id
    store.close()
    cgroup = Cgroup(Layout.read(), cgroup_path("gpupool", store_id, job, 0))
    cgroup.create(Limits())
    leftover = cgroup.started(lambda: subprocess.Popen(["sleep", "600"]))
    try:
        gpus.put(0, leftover.pid, 1 << 30)
        wait_for(lambda: leftover.poll() is not None, timeout=30)

        def killed_events() -> list[dict[str, Any]]:
            events: list[dict[str, Any]] = lab.get(f"/events?job={job}").json()  # type: ignore[union-attr]
            return [e for e in events if e["kind"] == "leftover_killed"]

        wait_for(lambda: bool(killed_events()), timeout=10)
        killed = killed_events()
        assert f"killed pid {leftover.pid}" in killed[0]["message"], killed
        assert "on GPU 0: left by an attempt that had ended" in killed[0]["message"]
    finally:
        leftover.kill()
        gpus.clear(0)
        cgroup.kill()
        cgroup.remove()


def test_an_attempts_peak_gpu_memory_is_counted(lab: Service) -> None:
    gpus: Gpus = lab.gpus  # type: ignore[attr-defined]
    ready = lab.data.parent / "ready"
    job = lab.submit("--", "sh", "-c", f"echo $$ > {ready}; sleep 4")
    wait_for(ready.exists, timeout=30)
    pid = int(ready.read_text())
    assert process_started(pid) is not None
    gpus.put(0, pid, 5 << 30)
    wait_for(lambda: state(lab, job) == "succeeded", timeout=30)
    gpus.clear(0)
    [attempt] = lab.get(f"/jobs/{job}").json()["history"]  # type: ignore[union-attr]
    assert attempt["peak_gpu_memory"] == 5 << 30, attempt
    report = lab.get("/report").json()  # type: ignore[union-attr]
    assert report["pool"]["peak_gpu_memory"] == 5 << 30, report["pool"]

    def counted() -> bool:
        metrics = lab.get("/metrics")
        return metrics is not None and 'gpupool_attempt_peak_gpu_memory_bytes_count{class="low"} 1.0' in metrics.text

    wait_for(counted, timeout=30)
    assert pool(lab)["nodes"][0]["gpu_states"][0]["state"] == "idle", "a job's own process does not make it dirty"
