"""Containment on the loopback Ray cluster: each rank in a cgroup on its node, made by that
node's launcher; what a rank leaves behind dies with its attempt, whether the attempt is
cancelled or its node is lost, and what the ranks used is the attempt's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.demo.loopback import LoopbackCluster
from gpupool.executors.cgroups import Layout
from gpupool.executors.containment import unavailable
from gpupool.executors.proc import process_started
from tests.support.live import running, state, wait_for
from tests.support.ray import RayService, job

pytestmark = pytest.mark.skipif(unavailable(Layout.read()) is not None, reason="no cgroups here")

LEAVER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    left = subprocess.Popen(["sleep", "4747"], start_new_session=True, **quiet)
    x = bytearray(24 << 20)
    print(os.environ["RANK"], left.pid, flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.1)
    """
)


@pytest.fixture
def service(cluster: LoopbackCluster, tmp_path: Path) -> Iterator[RayService]:
    made = RayService(tmp_path, cluster.address)
    made.script.write_text(LEAVER)
    devices = tmp_path / "dev"
    devices.mkdir()
    for index in range(4):  # each node's GPUs, as device nodes of NVIDIA's major number
        subprocess.run(["mknod", "-m", "666", str(devices / f"nvidia{index}"), "c", "195", str(index)], check=True)
    mode = os.environ.get("GPUPOOL_TEST_CONTAINMENT", "cgroups")  # off: each test here fails
    contain = f'containment: {{mode: {mode}, gpu_devices: "{devices}/nvidia{{index}}"}}'
    made.config.write_text(made.config.read_text().replace("start_timeout: 20s}", f"start_timeout: 20s, {contain}}}"))
    made.devices = devices  # type: ignore[attr-defined]
    yield from running(made)  # type: ignore[misc]


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if process_started(pid) is not None]


def leftovers(service: RayService, job_id: int) -> list[int]:
    wait_for(lambda: state(service, job_id) == "running", timeout=60)
    pids = [int(service.first_line(job_id, rank, None).split()[1]) for rank in range(2)]
    assert len(alive(pids)) == 2
    return pids


def test_a_cancelled_gang_leaves_nothing_on_any_node_and_counts_what_its_ranks_used(service: RayService) -> None:
    job_id = service.gang()
    pids = leftovers(service, job_id)
    assert service.cli("cancel", str(job_id)).returncode == 0
    wait_for(lambda: state(service, job_id) == "cancelled", timeout=60)
    assert alive(pids) == []
    history: Any = job(service, job_id)["history"]
    [attempt] = history
    assert attempt["peak_memory"] >= 24 << 20 and attempt["cpu_seconds"] > 0, attempt


def test_a_gang_that_ends_leaves_nothing_behind(service: RayService) -> None:
    job_id = service.gang()
    pids = leftovers(service, job_id)
    service.done.touch()
    wait_for(lambda: state(service, job_id) == "succeeded", timeout=60)
    assert alive(pids) == []


def test_a_lost_nodes_ranks_leave_nothing_behind(service: RayService, cluster: LoopbackCluster) -> None:
    job_id = service.gang()
    pids = leftovers(service, job_id)
    placement = job(service, job_id)["placement"]
    assert isinstance(placement, dict)
    victim = next(n for n in sorted(placement) if n != cluster.ip(0))
    cluster.kill_node(cluster.names.index(victim))
    wait_for(lambda: int(str(job(service, job_id)["attempts"])) == 2, timeout=120)
    wait_for(lambda: len(alive(pids)) == 0, timeout=30)


def test_a_gang_adopted_after_a_kill_9_of_gpupool_up_is_cancelled_whole(service: RayService) -> None:
    job_id = service.gang()
    pids = leftovers(service, job_id)
    service.kill()
    service.up()
    wait_for(lambda: state(service, job_id) == "running", timeout=60)
    assert len(alive(pids)) == 2, "the gang runs on while no scheduler watches, and is adopted"
    assert service.cli("cancel", str(job_id)).returncode == 0
    wait_for(lambda: state(service, job_id) == "cancelled", timeout=60)
    assert alive(pids) == []


OPENS = """
import errno, os, sys
mine = {int(g) for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",")}
seen = []
for index in range(4):
    try:
        os.close(os.open(f"%s/nvidia{index}", os.O_RDWR))
        how = "opened"
    except OSError as exc:
        how = errno.errorcode[exc.errno]
    seen.append(("mine" if index in mine else "other") + ":" + how)
print(" ".join(seen))
"""


def test_a_rank_is_limited_and_fenced_on_its_node_as_on_one_machine(service: RayService) -> None:
    devices = service.devices  # type: ignore[attr-defined]
    opener = service.submit("--gpus", "2", "--", sys.executable, "-c", OPENS % devices)
    wait_for(lambda: state(service, opener) == "succeeded", timeout=60)
    seen = sorted(service.first_line(opener, 0, None).split())
    assert seen == ["mine:ENXIO", "mine:ENXIO", "other:EPERM", "other:EPERM"], seen
    hog = service.submit("--gpus", "2", "--mem", "16M", "--", sys.executable, "-c", "x = bytearray(256 << 20)")
    wait_for(lambda: state(service, hog) == "failed", timeout=60)
    history: Any = job(service, hog)["history"]
    assert history[0]["outcome"] == "out_of_memory", history
