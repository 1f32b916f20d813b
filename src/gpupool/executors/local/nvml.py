"""What NVML says of this machine's GPUs while attempts run: each GPU's compute processes and
the GPU memory each holds, how busy each GPU is, and who a process is. The local executor reads
it every few seconds (`GpuWatch`): to count each attempt's peak GPU memory, to kill what an
ended attempt left on a GPU, to keep from new jobs a GPU that a process of no live attempt holds
(`dirty`), and to tell which attempts' GPUs worked (a session that computes is not idle)."""

from __future__ import annotations

import contextlib
import pwd
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.executors import Key
from gpupool.executors.cgroups import Cgroup, Layout


@dataclass(frozen=True, slots=True)
class GpuProcess:
    gpu: int
    """The GPU's index (NVML's, as `CUDA_VISIBLE_DEVICES` with `CUDA_DEVICE_ORDER=PCI_BUS_ID`)."""
    pid: int
    memory: int | None
    """Bytes of GPU memory it holds; None where NVML does not say (in some containers)."""


def gpu_processes() -> list[GpuProcess] | None:
    """Every compute process on every GPU, or None where NVML cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # NVML raises its own error types, or the library is absent
        return None
    try:
        found = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                memory: Any = getattr(process, "usedGpuMemory", None)
                found.append(GpuProcess(index, int(process.pid), int(memory) if memory is not None else None))
        return found
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


BUSY = 5
"""Percent of time a GPU ran kernels, over NVML's last sample period, from which it worked."""


def gpu_utilization() -> dict[int, int] | None:
    """Each GPU's utilization (percent of time a kernel ran, as nvidia-smi shows it), or None
    where NVML cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # NVML raises its own error types, or the library is absent
        return None
    try:
        return {
            index: int(pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(index)).gpu)
            for index in range(int(pynvml.nvmlDeviceGetCount()))
        }
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def describe(process: GpuProcess) -> str:
    """`pid 4242 (ana)`: the process and its owner, as every token's view of the pool shows
    them (its command line, which may hold what its owner would not show, is left out)."""
    try:
        owner = pwd.getpwuid(Path(f"/proc/{process.pid}").stat().st_uid).pw_name
    except (OSError, KeyError):
        owner = "?"
    return f"pid {process.pid} ({owner})"


def cgroup_of(pid: int, root: str, store_id: str) -> tuple[Key, str] | None:
    """The (job, attempt) of this store whose member's cgroup holds `pid`, and that cgroup's
    path (`cgroups.cgroup_path`); None for a process in none of them."""
    pattern = re.compile(rf"/({re.escape(root)}/{re.escape(store_id[:12])}/(\d+)\.(\d+)\.\d+)$")
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        found = pattern.search(line.split(":", 2)[-1])
        if found is not None:
            return (int(found.group(2)), int(found.group(3))), found.group(1)
    return None


def stat_of(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command's name (state, ppid, pgrp, session, ...)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def attempt_of(pid: int, launchers: Mapping[int, Key]) -> Key | None:
    """The attempt whose launcher's session holds `pid`, or whose launcher is an ancestor of it
    (a shell session's processes lead a session of their own, on their terminal)."""
    for _ in range(64):  # a chain of parents, never a loop
        fields = stat_of(pid)
        if fields is None:
            return None
        found = launchers.get(int(fields[3])) or launchers.get(pid)
        if found is not None:
            return found
        pid = int(fields[1])
        if pid <= 1:
            return None
    return None


@dataclass
class GpuWatch:
    """The local executor's look at its GPUs every `every` seconds: each live attempt's peak
    GPU memory, what ended attempts left (killed, with a note for people), and the GPUs a
    process of no attempt holds (`dirty`: kept from new jobs until it ends). `root` and
    `store_id` name this store's cgroups; None where attempts are not contained (a process is
    then an attempt's by its launcher's session)."""

    root: str | None
    store_id: str
    every: float = 2.0
    read: Callable[[], list[GpuProcess] | None] = gpu_processes
    utilization: Callable[[], dict[int, int] | None] = gpu_utilization
    peaks: dict[Key, int] = field(default_factory=dict)
    """Per live attempt, the most GPU memory its processes held at once (bytes)."""
    dirty: dict[int, str] = field(default_factory=dict)
    """GPU index → the process of no live attempt on it (`describe`)."""
    notes: list[tuple[int, int, str]] = field(default_factory=list)
    """What `look` did that the executor has not passed on yet (`taken`)."""
    busy: set[Key] = field(default_factory=set)
    """Live attempts with a process on a GPU that worked (`BUSY`), since `worked` was last asked."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def watch(self, live: Callable[[], Mapping[Key, int]], stop: threading.Event) -> None:
        """Look every `every` seconds until `stop`, in a thread of its own: NVML may take long
        to answer (idle GPUs without persistence mode), never the control loop's time."""
        while not stop.wait(self.every):
            notes = self.look(live)
            with self.lock:
                self.notes.extend(notes)

    def taken(self) -> list[tuple[int, int, str]]:
        """The notes since the last call."""
        with self.lock:
            notes, self.notes = self.notes, []
        return notes

    def worked(self) -> set[Key]:
        """The attempts whose GPUs worked since the last call."""
        with self.lock:
            busy, self.busy = self.busy, set()
        return busy

    def peak(self, key: Key) -> int | None:
        """The attempt's peak GPU memory, forgotten (it has ended)."""
        with self.lock:
            return self.peaks.pop(key, None)

    def look(self, live_now: Callable[[], Mapping[Key, int]]) -> list[tuple[int, int, str]]:
        """Read NVML, given the live attempts (key → launcher pid, asked before and after the
        read: an attempt that started meanwhile is no leftover); what was done that people
        should see: (job, attempt, message) for each leftover killed."""
        live = dict(live_now())
        processes = self.read()
        if processes is None:
            return []
        busy_gpus = {gpu for gpu, percent in (self.utilization() or {}).items() if percent >= BUSY}
        live.update(live_now())
        sessions = {pid: key for key, pid in live.items()}
        worked: set[Key] = set()
        held: dict[Key, int] = {}
        dirty: dict[int, str] = {}
        notes = []
        for process in processes:
            found = cgroup_of(process.pid, self.root, self.store_id) if self.root is not None else None
            key = found[0] if found is not None else attempt_of(process.pid, sessions)
            if key is not None and key in live:
                held[key] = held.get(key, 0) + (process.memory or 0)
                if process.gpu in busy_gpus:
                    worked.add(key)
            elif found is not None:
                said = describe(process)
                Cgroup(Layout.read(), found[1]).kill()
                notes.append((*found[0], f"killed {said} on GPU {process.gpu}: left by an attempt that had ended"))
            else:
                dirty.setdefault(process.gpu, describe(process))
        with self.lock:
            for key, used in held.items():
                self.peaks[key] = max(self.peaks.get(key, 0), used)
            self.busy |= worked
        self.dirty = dirty
        return notes
