"""An attempt's member as a cgroup: born inside it, limited by it, killed whole with it, and
measured by it. Standard library only: the launcher (`launcher.py`, run as `python -I -S`)
imports it, and so do the executors that kill and adopt attempts.

Where each controller is comes from the mount table (`Layout.read`): cgroup v2's unified
hierarchy where it offers the controller, else the v1 hierarchy that has it. Pure v2 hosts, the
hybrid layout (v1 controllers beside a v2 hierarchy without them) and pure v1 are one code path:
a member's cgroup is one folder per hierarchy, at the same relative path in each.

- Killing: `cgroup.kill` where there is a v2 folder (one write, atomic against forks); else
  the v1 freezer: freeze, SIGKILL every process, thaw; else SIGKILL until empty.
- Empty: `cgroup.events` (`populated 0`) in v2, else no process left in any folder.
- Limits: memory (`memory.max`, or `memory.limit_in_bytes` and the same with swap), CPU (a
  weight, or a quota), processes (`pids.max`); GPUs not given are denied by the v1 devices
  controller (`devices.deny`), or, where there is none, hidden by the launcher in a mount
  namespace of the member's own (`hidden`).
- Use: peak memory, CPU time, and how many processes the kernel killed for memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "devices", "freezer")
"""What a member's cgroup may use; `cpuacct` and `freezer` exist only in v1 (v2 has their
work in every cgroup)."""

NEEDED = ("memory", "cpu", "pids")
"""Without these, jobs run as plain process groups (`Layout.missing`)."""

EMPTY_WITHIN = 30.0
"""How long a kill tries to empty a cgroup before it says so (and is tried again later)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the cgroup hierarchies are mounted, and which controllers each has."""

    unified: str | None = None
    """The cgroup2 mount point, if there is one."""
    unified_controllers: frozenset[str] = frozenset()
    v1: dict[str, str] = field(default_factory=dict)
    """v1 controller → its hierarchy's mount point (co-mounted controllers share one)."""

    @classmethod
    def read(cls, mountinfo: str = "/proc/self/mountinfo") -> Layout:
        unified: str | None = None
        v1: dict[str, str] = {}
        try:
            with open(mountinfo) as lines:
                for line in lines:
                    before, _, after = line.partition(" - ")
                    point = before.split()[4].replace("\\040", " ")
                    fstype, _source, options = [*after.split(), "", "", ""][:3]
                    if fstype == "cgroup2" and unified is None:
                        unified = point
                    elif fstype == "cgroup":
                        for name in options.split(","):
                            if name in CONTROLLERS:
                                v1.setdefault(name, point)
        except OSError:
            return cls()
        controllers: frozenset[str] = frozenset()
        if unified is not None:
            with contextlib.suppress(OSError):
                controllers = frozenset(_read(os.path.join(unified, "cgroup.controllers")).split())
        return cls(unified, controllers, v1)

    def where(self, controller: str) -> str | None:
        """The mount point that gives `controller`: v2 where it offers it, else v1."""
        if controller in self.unified_controllers and controller not in self.v1:
            return self.unified
        return self.v1.get(controller)

    def missing(self) -> list[str]:
        """The needed controllers this host offers in no hierarchy (v1's `cpuacct` work is
        part of v2's `cpu`)."""
        return [name for name in NEEDED if self.where(name) is None]

    def fences_devices(self) -> bool:
        """Whether the devices controller can deny GPUs (else they are hidden in a mount
        namespace: v2 has no devices file, only eBPF programs)."""
        return "devices" in self.v1

    def home(self, cgroups: str = "/proc/self/cgroup") -> dict[str, str]:
        """Each hierarchy's mount point → the cgroup this process is in there."""
        found: dict[str, str] = {}
        for line in _read(cgroups).splitlines():
            _number, names, path = line.split(":", 2)
            if not names and self.unified is not None:
                found[self.unified] = path
            for name in names.split(","):
                if name in self.v1:
                    found[self.v1[name]] = path
        return found

    def describe(self) -> str:
        """In a few words, for `gpupool up`'s start and the pool's view."""
        v2 = sorted(c for c in CONTROLLERS if c in self.unified_controllers and self.where(c) == self.unified)
        v1 = sorted(c for c in self.v1 if self.where(c) != self.unified)
        parts = []
        if v2:
            parts.append(f"cgroup v2 ({', '.join(v2)})")
        if v1:
            parts.append(f"cgroup v1 ({', '.join(v1)})")
        if self.unified is not None and not v2:
            parts.append("cgroup v2 for kills")
        return " + ".join(parts) or "no cgroup filesystem"


@dataclass(frozen=True, slots=True)
class Limits:
    """What one member may use; None is no limit."""

    memory: int | None = None
    """Bytes of memory, swap included."""
    cpus: float | None = None
    """CPUs, as a weight (a share of the node when it is busy) or, with `cpu_quota`, a cap."""
    cpu_quota: bool = False
    pids: int | None = None
    denied: tuple[tuple[int, int], ...] = ()
    """Character devices (major, minor) it may not open: the node's GPUs it was not given."""
    hidden: tuple[str, ...] = ()
    """Their paths, for hosts without a devices controller (`hide`)."""


@dataclass(frozen=True, slots=True)
class Request:
    """What the scheduler asks for one member (Slurm's `--mem`, `--mem-per-gpu`,
    `--cpus-per-gpu`), made into `Limits` on the member's node, where its memory, CPUs and GPU
    device nodes are known. Plain JSON values: it travels to the node's launcher."""

    cgroup: str
    gpus: tuple[int, ...] = ()
    """The GPUs of the node it was given (their indexes)."""
    node_gpus: int = 0
    mem: int | None = None
    """Bytes for the member; else `mem_per_gpu` for each of its GPUs."""
    mem_per_gpu: int | None = None
    """None: the node's memory divided by its GPUs."""
    cpus_per_gpu: float | None = None
    """None: the node's CPUs divided by its GPUs."""
    cpu_quota: bool = False
    pids: int | None = None
    devices: str = "/dev/nvidia{index}"
    """Each GPU's device node, by its index."""

    def as_json(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Request:
        given = dict(data)
        given["gpus"] = tuple(given.get("gpus") or ())  # type: ignore[arg-type]
        return cls(**given)  # type: ignore[arg-type]

    def limits(self) -> Limits:
        gpus = max(1, len(self.gpus))
        per_gpu = max(1, self.node_gpus)
        memory = self.mem if self.mem is not None else (self.mem_per_gpu or node_memory() // per_gpu) * gpus
        cpus = (self.cpus_per_gpu or node_cpus() / per_gpu) * gpus
        denied = self.denied()
        return Limits(memory, cpus, self.cpu_quota, self.pids, tuple(denied.values()), tuple(denied))

    def denied(self) -> dict[str, tuple[int, int]]:
        """The device nodes of the node's GPUs it was not given, those that exist: path →
        (major, minor)."""
        found = {}
        for index in range(self.node_gpus):
            if index in self.gpus:
                continue
            path = self.devices.format(index=index)
            try:
                status = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(status.st_mode):
                found[path] = (os.major(status.st_rdev), os.minor(status.st_rdev))
        return found


def node_memory() -> int:
    """This machine's memory, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def node_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def _read(path: str) -> str:
    with open(path) as stream:
        return stream.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as stream:
        stream.write(value)


def _keyed(path: str, key: str) -> int | None:
    """The number after `key` in a flat-keyed file (`memory.events`, `cpu.stat`...)."""
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


@dataclass(frozen=True, slots=True)
class Cgroup:
    """One member's cgroup: `path` (relative, such as `gpupool/ab12cd34ef56/7.0.0`: see
    `cgroup_path`) in every hierarchy of `layout`."""

    layout: Layout
    path: str

    def folders(self) -> list[str]:
        """One folder per hierarchy: the v2 one first, then each v1 mount once."""
        points = [self.layout.unified] if self.layout.unified is not None else []
        for point in self.layout.v1.values():
            if point not in points:
                points.append(point)
        return [os.path.join(point, self.path) for point in points]

    def folder(self, controller: str) -> str | None:
        point = self.layout.where(controller)
        return os.path.join(point, self.path) if point is not None else None

    def create(self, limits: Limits) -> None:
        """Make its folders (and, in v2, let its parents hand the controllers down), then
        apply the limits but memory's (`limit_memory`, once its first process is in). Owned by
        root, as its parents are: a job cannot write to them."""
        if self.layout.unified is not None and self.layout.unified_controllers:
            self._delegate()
        for folder in self.folders():
            os.makedirs(folder, exist_ok=True)
        self._limit_cpu_and_pids(limits)

    def _delegate(self) -> None:
        """Enable the v2 controllers it uses in each parent's `cgroup.subtree_control`: a v2
        cgroup has a controller only where its parent hands it down."""
        assert self.layout.unified is not None
        wanted = [c for c in NEEDED if self.layout.where(c) == self.layout.unified]
        parent = self.layout.unified
        for part in ["", *self.path.split("/")[:-1]]:  # the mount point, then each parent
            parent = os.path.join(parent, part) if part else parent
            os.makedirs(parent, exist_ok=True)
            control = os.path.join(parent, "cgroup.subtree_control")
            enabled = set(_read(control).split())
            for name in wanted:
                if name not in enabled:
                    _write(control, f"+{name}")

    def limit_memory(self, limits: Limits) -> None:
        """Apply the memory limit: after the launcher has left (it forks from inside, and at a
        small limit the kernel would kill the launcher, the largest process in the cgroup)."""
        v2 = self.layout.unified
        memory = self.folder("memory")
        if memory is None or limits.memory is None:
            return
        if self.layout.where("memory") == v2:
            _write(os.path.join(memory, "memory.max"), str(limits.memory))
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to cap
                _write(os.path.join(memory, "memory.swap.max"), "0")
        else:
            _write(os.path.join(memory, "memory.limit_in_bytes"), str(limits.memory))
            with contextlib.suppress(FileNotFoundError):
                _write(os.path.join(memory, "memory.memsw.limit_in_bytes"), str(limits.memory))

    def _limit_cpu_and_pids(self, limits: Limits) -> None:
        v2 = self.layout.unified
        cpu = self.folder("cpu")
        if cpu is not None and limits.cpus is not None:
            period = 100_000
            quota = max(1000, round(limits.cpus * period))
            if self.layout.where("cpu") == v2:
                if limits.cpu_quota:
                    _write(os.path.join(cpu, "cpu.max"), f"{quota} {period}")
                else:
                    _write(os.path.join(cpu, "cpu.weight"), str(min(10_000, max(1, round(limits.cpus * 100)))))
            elif limits.cpu_quota:
                _write(os.path.join(cpu, "cpu.cfs_period_us"), str(period))
                _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(quota))
            else:
                _write(os.path.join(cpu, "cpu.shares"), str(max(2, round(limits.cpus * 1024))))
        pids = self.folder("pids")
        if pids is not None and limits.pids is not None:
            _write(os.path.join(pids, "pids.max"), str(limits.pids))
        devices = self.layout.v1.get("devices")
        if devices is not None and self.layout.where("devices") == devices:
            for major, minor in limits.denied:
                _write(os.path.join(devices, self.path, "devices.deny"), f"c {major}:{minor} rwm")

    def join(self, pid: int) -> None:
        """Move process `pid` (all its threads) into every folder."""
        for folder in self.folders():
            _write(os.path.join(folder, "cgroup.procs"), str(pid))

    def started(self, start: Callable[[], T]) -> T:
        """Call `start` from inside the cgroup, then go back: a process it forks is born in the
        cgroup, before it can run anything (and so before it could fork one that is not)."""
        home = self.layout.home()
        self.join(os.getpid())
        try:
            return start()
        finally:
            for point, path in home.items():
                _write(os.path.join(point, path.lstrip("/"), "cgroup.procs"), str(os.getpid()))

    def pids(self) -> set[int]:
        """Every process in it, in any folder (nested cgroups a root job made included)."""
        found: set[int] = set()
        for folder in self.folders():
            for root, _dirs, _files in os.walk(folder):
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(pid) for pid in _read(os.path.join(root, "cgroup.procs")).split())
        return found

    def exists(self) -> bool:
        return any(os.path.isdir(folder) for folder in self.folders())

    def populated(self) -> bool:
        """Whether any process is left in it."""
        if self.layout.unified is not None:
            populated = _keyed(os.path.join(self.layout.unified, self.path, "cgroup.events"), "populated")
            if populated is not None:
                return populated == 1
        return bool(self.pids())

    def kill(self, within: float | None = EMPTY_WITHIN) -> bool:
        """SIGKILL every process in it, forks racing the kill included, until it is empty or
        `within` seconds have passed (None: until it is empty); whether it is empty. A process
        the kernel holds (uninterruptible sleep in a driver) can keep it populated for long."""
        deadline = None if within is None else time.monotonic() + within
        while self.populated():
            if not self._kill_v2() and not self._kill_frozen():
                for pid in self.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            pass_ends = time.monotonic() + 0.5
            if deadline is not None:
                pass_ends = min(pass_ends, deadline)
            while time.monotonic() < pass_ends:
                if not self.populated():
                    return True
                time.sleep(0.01)
            if deadline is not None and time.monotonic() >= deadline:
                return not self.populated()
        return True

    def _kill_v2(self) -> bool:
        if self.layout.unified is None:
            return False
        try:
            _write(os.path.join(self.layout.unified, self.path, "cgroup.kill"), "1")
        except OSError:  # before Linux 5.14, or no v2 folder
            return False
        return True

    def _kill_frozen(self) -> bool:
        """v1: freeze (no process can fork while frozen), SIGKILL them all, thaw."""
        freezer = self.layout.v1.get("freezer")
        if freezer is None:
            return False
        state = os.path.join(freezer, self.path, "freezer.state")
        try:
            _write(state, "FROZEN")
            for _ in range(200):
                if _read(state).strip() == "FROZEN":
                    break
                time.sleep(0.005)
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                _write(state, "THAWED")
        return True

    def usage(self) -> dict[str, int | float | None]:
        """What it counted, as JSON (`settle.Usage` reads it): peak memory in bytes, CPU
        seconds, processes the kernel killed for memory; None where this host does not count."""
        v2 = self.layout.unified
        memory, cpu = self.folder("memory"), self.folder("cpu")
        peak: int | None = None
        oom = 0
        if memory is not None and self.layout.where("memory") == v2:
            with contextlib.suppress(OSError, ValueError):
                peak = int(_read(os.path.join(memory, "memory.peak")))
            oom = _keyed(os.path.join(memory, "memory.events"), "oom_kill") or 0
        elif memory is not None:
            with contextlib.suppress(OSError, ValueError):
                peak = int(_read(os.path.join(memory, "memory.max_usage_in_bytes")))
            oom = _keyed(os.path.join(memory, "memory.oom_control"), "oom_kill") or 0
        cpu_seconds: float | None = None
        if cpu is not None and self.layout.where("cpu") == v2:
            usec = _keyed(os.path.join(cpu, "cpu.stat"), "usage_usec")
            cpu_seconds = usec / 1e6 if usec is not None else None
        else:
            cpuacct = self.folder("cpuacct")
            if cpuacct is not None:
                with contextlib.suppress(OSError, ValueError):
                    cpu_seconds = int(_read(os.path.join(cpuacct, "cpuacct.usage"))) / 1e9
        return {"peak_memory": peak, "cpu_seconds": cpu_seconds, "oom_kills": oom}

    def remove(self) -> None:
        """Remove its folders, nested ones first, once it is empty: what cannot be removed (a
        folder still busy) is left, as an empty cgroup costs nothing."""
        for folder in self.folders():
            for root, _dirs, _files in sorted(os.walk(folder), key=lambda entry: -len(entry[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(root)


def hide(paths: tuple[str, ...]) -> None:
    """Hide device nodes from this process and what it starts: a mount namespace of its own
    (changes to it never reach the host's), with /dev/null bound over each path. The fence of
    hosts without the v1 devices controller (cgroup v2 has none; its eBPF device programs need
    a loader this standard-library module does not have). A job cannot undo it without
    CAP_SYS_ADMIN, nor make a device node without CAP_MKNOD; docs/containment.md says what it
    does not cover."""
    if not paths:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, ms_rec, ms_private, ms_bind = 0x00020000, 0x4000, 0x40000, 0x1000

    def check(result: int, what: str) -> None:
        if result != 0:
            number = ctypes.get_errno()
            raise OSError(number, f"{what}: {os.strerror(number)}")

    check(libc.unshare(clone_newns), "unshare(CLONE_NEWNS)")
    check(libc.mount(b"none", b"/", None, ms_rec | ms_private, None), "making mounts private")
    for path in paths:
        check(libc.mount(b"/dev/null", path.encode(), None, ms_bind, None), f"hiding {path}")


def cgroup_path(root: str, store_id: str, job_id: int, attempt: int, rank: int = 0) -> str:
    """A member's cgroup, relative to each hierarchy's mount point: one folder per store, so
    that stores sharing a machine never touch each other's attempts."""
    return f"{root}/{store_id[:12]}/{job_id}.{attempt}.{rank}"


def root_of(path: str) -> str:
    """The root a member's cgroup (`cgroup_path`) is under (the configured `cgroup_root`)."""
    return path.rsplit("/", 2)[0]
