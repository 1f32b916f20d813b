"""The cgroup layer on its own (`executors/cgroups.py`): reading the host's layout, a member's
limits from its request, a kill that forks cannot outrun, and the mount-namespace fence of hosts
without a devices controller."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.executors.cgroups import Cgroup, Layout, Limits, Request, hide
from gpupool.executors.containment import unavailable

HERE = Layout.read()
needs_cgroups = pytest.mark.skipif(unavailable(HERE) is not None, reason=f"no cgroups here: {unavailable(HERE)}")


def mountinfo(tmp_path: Path, *mounts: tuple[str, str, str]) -> str:
    """A mount table of (mount point, file system type, super options)."""
    lines = [
        f"{30 + i} 1 0:{i} / {point} rw,relatime - {fstype} cgroup {options}"
        for i, (point, fstype, options) in enumerate(mounts)
    ]
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(["22 1 8:1 / / rw - ext4 /dev/vda rw", *lines]) + "\n")
    return str(path)


def test_a_pure_v2_host_gives_every_controller_from_the_unified_hierarchy(tmp_path: Path) -> None:
    unified = tmp_path / "cgroup"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    layout = Layout.read(mountinfo(tmp_path, (str(unified), "cgroup2", "rw,nsdelegate")))
    assert [layout.where(c) for c in ("memory", "cpu", "pids")] == [str(unified)] * 3
    assert layout.missing() == [] and not layout.fences_devices()
    assert layout.describe() == "cgroup v2 (cpu, memory, pids)"
    assert Cgroup(layout, "gpupool/s/1.0.0").folders() == [str(unified / "gpupool/s/1.0.0")]


def test_a_hybrid_host_takes_the_v1_controllers_and_kills_through_v2(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("")
    table = mountinfo(
        tmp_path,
        ("/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
        ("/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
        ("/sys/fs/cgroup/pids", "cgroup", "rw,pids"),
        ("/sys/fs/cgroup/systemd", "cgroup", "rw,xattr,name=systemd"),
        (str(unified), "cgroup2", "rw"),
    )
    layout = Layout.read(table)
    assert layout.where("cpu") == layout.where("cpuacct") == "/sys/fs/cgroup/cpu,cpuacct"
    assert layout.missing() == [] and not layout.fences_devices()
    folders = Cgroup(layout, "g/s/1.0.0").folders()
    assert folders[0] == str(unified / "g/s/1.0.0") and len(folders) == 4, "cpu and cpuacct share one folder"
    assert "cgroup v2 for kills" in layout.describe()


def test_a_host_without_cgroups_says_so(tmp_path: Path) -> None:
    layout = Layout.read(mountinfo(tmp_path))
    assert layout.missing() == ["memory", "cpu", "pids"]
    assert unavailable(layout) in ("gpupool up does not run as root", "no cgroup filesystem is mounted")


def test_a_request_denies_the_node_gpus_not_given_and_takes_the_defaults(tmp_path: Path) -> None:
    for index in range(3):
        subprocess.run(["mknod", str(tmp_path / f"nvidia{index}"), "c", "195", str(index)], check=True)
    (tmp_path / "nvidia3").write_text("not a device")
    request = Request("g/s/1.0.0", gpus=(1,), node_gpus=4, devices=f"{tmp_path}/nvidia{{index}}")
    limits = request.limits()
    assert limits.denied == ((195, 0), (195, 2)) and limits.hidden == (f"{tmp_path}/nvidia0", f"{tmp_path}/nvidia2")
    node_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert limits.memory == node_memory // 4, "a node's memory divided by its GPUs, for its one GPU"
    assert limits.cpus == pytest.approx(len(os.sched_getaffinity(0)) / 4)
    asked = Request("g/s/1.0.0", gpus=(0, 1), node_gpus=4, mem_per_gpu=1 << 30, cpus_per_gpu=2.0).limits()
    assert (asked.memory, asked.cpus) == (2 << 30, 4.0)
    assert Request("g/s/1.0.0", gpus=(0, 1), node_gpus=4, mem=3 << 30).limits().memory == 3 << 30
    assert Request.from_json(request.as_json()) == request


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    made = Cgroup(HERE, f"gpupool-test/{uuid.uuid4().hex[:12]}/1.0.0")
    yield made
    made.kill()
    made.remove()


@needs_cgroups
def test_a_kill_outruns_a_process_that_forks_without_end(cgroup: Cgroup) -> None:

    cgroup.create(Limits(pids=200))
    forker = cgroup.started(lambda: subprocess.Popen(["sh", "-c", "while :; do sleep 100 & done"]))
    while len(cgroup.pids()) < 20:
        pass
    cgroup.kill()
    assert not cgroup.populated() and cgroup.pids() == set()
    assert forker.wait(timeout=10) == -9
    usage = cgroup.usage()
    assert usage["cpu_seconds"] is not None and usage["peak_memory"] is not None


@needs_cgroups
def test_started_puts_the_child_in_and_the_caller_back(cgroup: Cgroup) -> None:

    cgroup.create(Limits())
    before = Path("/proc/self/cgroup").read_text()
    child = cgroup.started(lambda: subprocess.Popen(["sleep", "30"]))
    assert Path("/proc/self/cgroup").read_text() == before
    assert child.pid in cgroup.pids()


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
def test_hidden_devices_open_as_dev_null_in_the_member_alone(tmp_path: Path) -> None:
    """The v2 fence: in the member's own mount namespace, a GPU not given is /dev/null; outside
    it, nothing changed."""
    for index in range(2):
        subprocess.run(["mknod", str(tmp_path / f"nvidia{index}"), "c", "195", str(index)], check=True)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            hide((str(tmp_path / "nvidia1"),))
            seen = []
            for index in range(2):
                try:
                    fd = os.open(tmp_path / f"nvidia{index}", os.O_RDWR)
                    seen.append(f"{os.major(os.fstat(fd).st_rdev)}:{os.minor(os.fstat(fd).st_rdev)}")
                except OSError as exc:
                    seen.append(errno.errorcode[exc.errno or 0])
            os.write(write, " ".join(seen).encode())
        finally:
            os._exit(0)
    os.close(write)
    told = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    assert told == "ENXIO 1:3", "its own GPU reaches the (absent) driver; the other is /dev/null"
    assert os.stat(tmp_path / "nvidia1").st_rdev == os.makedev(195, 1), "the host's view is unchanged"
