"""The cgroup layer on its own (`executors/cgroups.py`): reading the host's layout, a member's
limits from its request, a kill that forks cannot outrun, and the mount-namespace fence of hosts
without a devices controller."""

from __future__ import annotations

import errno
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.executors import Launch, Member, NodeState
from gpupool.executors import spawn as spawning
from gpupool.executors.cgroups import Cgroup, Layout, Limits, Request, hide
from gpupool.executors.containment import Containment, unavailable
from gpupool.executors.local import LocalExecutor
from gpupool.model import Node

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


def test_a_member_whose_cgroup_will_not_empty_is_not_reported_ended_and_the_others_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process the kernel holds (uninterruptible sleep in a driver) keeps an ended attempt's
    cgroup populated: that attempt stays live, its GPUs held, and is tried again at the next
    poll; the other attempts that ended are reported all the same."""
    if unavailable(HERE) is not None:
        pytest.skip(str(unavailable(HERE)))
    containment = Containment("s1", root=f"gpupool-test-{uuid.uuid4().hex[:8]}")
    executor = LocalExecutor(NodeState(Node("local", 2)), store_id="s1", containment=containment)
    for job in (1, 2):
        launch = Launch(job, 0, ["sleep", "30"], tmp_path, {}, tmp_path / f"a{job}", (Member(0, "local", (job - 1,)),))
        executor.start(launch)
    stuck = executor._contain((1, 0))
    assert stuck is not None
    real_kill = Cgroup.kill

    def held(self: Cgroup, within: float | None = 30.0) -> bool:
        real_kill(self, within)
        return self.path != stuck.cgroup  # as if a process of job 1 could not die

    monkeypatch.setattr(Cgroup, "kill", held)
    for job in (1, 2):
        spawning.kill(executor.watched[(job, 0)][0], executor._contain((job, 0)))
    ended: list[int] = []
    for _ in range(200):
        ended += [e.job_id for e in executor.poll().ended]
        if 2 in ended:
            break
        time.sleep(0.05)
    assert ended == [2] and (1, 0) in executor.watched, "job 1's cgroup is not empty: it has not ended"
    monkeypatch.setattr(Cgroup, "kill", real_kill)
    for _ in range(200):
        ended += [e.job_id for e in executor.poll().ended]
        if 1 in ended:
            break
        time.sleep(0.05)
    assert ended == [2, 1]
    executor.close()


@needs_cgroups
def test_auto_keeps_process_groups_where_no_cgroup_can_be_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container's root may see the controllers on a read-only cgroup filesystem: `auto`
    finds out by making one, and says why it runs process groups."""
    from gpupool.executors.containment import detect

    def read_only(self: Cgroup, limits: Limits) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(Cgroup, "create", read_only)
    chosen, said = detect("auto", Containment("s1"))
    assert chosen is None and "no cgroup can be made under gpupool (Read-only file system)" in said, said
    with pytest.raises(RuntimeError, match=r"containment\.mode is cgroups, but no cgroup can be made"):
        detect("cgroups", Containment("s1"))


def test_a_member_sees_its_gpus_numbered_as_nvml_and_the_fence_number_them() -> None:
    launch = Launch(1, 0, ["true"], Path("/"), {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, Path("/tmp"))
    env = launch.member_env(Member(0, "n0", (2, 3)), "127.0.0.1", 1234)
    assert (env["CUDA_DEVICE_ORDER"], env["CUDA_VISIBLE_DEVICES"]) == ("PCI_BUS_ID", "2,3")


def test_a_detached_launcher_that_cannot_be_forked_leaks_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork server lives as long as its executor: a fork refused (no process left) must
    not cost it a file descriptor each time."""
    from gpupool.executors import launcher

    def no_fork() -> int:
        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))

    monkeypatch.setattr(os, "fork", no_fork)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(OSError, match="Resource temporarily unavailable"):
            launcher.detached(
                [str(tmp_path), "s:1:0", "-", "/", "/dev/null", "/dev/null", "true"], {}, str(tmp_path), None
            )
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_gpu_watch_starts_with_the_first_poll_and_spares_what_started_while_it_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attempts an earlier scheduler started are adopted before the first poll: until then
    a process in one of this store's cgroups is no leftover. Nor is one of an attempt that
    started while NVML was read."""
    from gpupool.executors.local import nvml

    killed: list[str] = []
    monkeypatch.setattr(nvml, "cgroup_of", lambda pid, root, store: ((7, 0), "gpupool/s1/7.0.0"))

    def kill(self: Cgroup, within: float | None = 30.0) -> bool:
        killed.append(self.path)
        return True

    monkeypatch.setattr(Cgroup, "kill", kill)
    watch = nvml.GpuWatch("gpupool", "s1", every=0.05, read=lambda: [nvml.GpuProcess(0, 4242, 1 << 30)])
    executor = LocalExecutor(NodeState(Node("local", 1)), store_id="s1", containment=Containment("s1"), watch=watch)
    time.sleep(0.3)
    assert killed == [], "no look before the attempts are adopted"
    calls: list[int] = []

    def live() -> dict[tuple[int, int], int]:
        calls.append(1)
        return {} if len(calls) == 1 else {(7, 0): 4242}  # it started during the read

    assert watch.look(live) == [] and killed == []
    executor.poll()
    time.sleep(0.3)
    executor.close()
    assert killed, "after the first poll, a leftover of an attempt that is not live is killed"


def test_a_launcher_known_gone_is_never_signalled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its pid may be another process's by now (a new launcher leads a session of that id)."""
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(Cgroup, "kill", lambda self, within=30.0: False)
    monkeypatch.setattr(Cgroup, "exists", lambda self: True)
    executor = LocalExecutor(NodeState(Node("local", 1)), store_id="s1", containment=Containment("s1"))
    executor.watched[(1, 0)] = (os.getpid(), "1")  # a start time that is not this process's
    executor.dirs[(1, 0)] = tmp_path
    assert executor.poll().ended == []
    executor.kill(1, 0)
    executor.notify(1, 0, time.time() + 10)
    assert sent == []


def test_cgroups_that_will_not_empty_do_not_stall_the_control_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stuck(self: Cgroup, within: float | None = 30.0) -> bool:
        time.sleep(within or 0)
        return False

    monkeypatch.setattr(Cgroup, "kill", stuck)
    monkeypatch.setattr(Cgroup, "exists", lambda self: True)
    executor = LocalExecutor(NodeState(Node("local", 8)), store_id="s1", containment=Containment("s1"))
    for job in range(4):
        executor.watched[(job, 0)] = (0, "")
        executor.dirs[(job, 0)] = tmp_path
    began = time.monotonic()
    assert executor.poll().ended == []
    assert time.monotonic() - began < 1.0


@needs_cgroups
def test_a_command_over_its_memory_before_the_limit_is_written_ends_out_of_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cgroup v1 refuses a limit under what a cgroup holds (EBUSY): the command is killed, as
    v2's kernel would kill it, and ends out of memory, not as a launch to try again."""
    import json

    from gpupool.executors import launcher

    def busy(self: object, limits: object) -> None:
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))

    monkeypatch.setattr(vars(launcher)["cgroups"].Cgroup, "limit_memory", busy)  # the launcher's own import
    request = Request(f"gpupool-test-{uuid.uuid4().hex[:8]}/s1/1.0.0", mem=64 << 20)
    argv = [str(tmp_path), "s1:1:0", "-", "/", "/dev/null", "/dev/null", "sleep", "30"]
    assert launcher.main(argv, {}, request.as_json()) == 137
    ended = json.loads((tmp_path / "exit.json").read_text())
    assert ended["exit_code"] == 137 and ended["usage"]["oom_kills"] >= 1, ended


def test_a_members_cgroup_names_the_root_it_is_under() -> None:
    from gpupool.executors.cgroups import cgroup_path, root_of

    assert root_of(cgroup_path("gpupool", "ab12cd34ef56gh78", 7, 1, 2)) == "gpupool"
    assert root_of(cgroup_path("lab/gpupool", "s1", 3, 0)) == "lab/gpupool"
