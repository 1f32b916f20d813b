"""Attempts as local processes: one cgroup per attempt where `containment` is given (else one
process group), under a launcher that records its outcome (`launcher.py`); logs and the notice
in the attempt's folder. The machine is one node (`gpus.py`); a gang of one member runs here,
with the rendezvous on loopback."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from gpupool.executors import Exit, Key, Launch, Member, NodeState, Progress, Recorded, Started
from gpupool.executors.cgroups import Request, cgroup_path
from gpupool.executors.containment import Containment
from gpupool.executors.forks import ForkServer
from gpupool.executors.local.nvml import GpuWatch
from gpupool.executors.proc import (
    last_sign_of_life,
    outcome,
    owner,
    process_started,
    recorded_exit_time,
    recorded_launcher,
    recorded_usage,
)
from gpupool.executors.spawn import Spawn, clear, kill, signal_group, write_notice
from gpupool.executors.terminal import Link
from gpupool.settle import Usage


def _untold(_code: int) -> None:
    """A detached launcher's end is never told: its pid is watched."""


def free_port() -> int:
    """A TCP port free on loopback now, for a gang's rendezvous (`MASTER_PORT`)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalExecutor:
    """`node` is this machine. `on_exit` is called (from a watcher thread) as soon as an
    attempt's process ends, so the control loop wakes at once instead of on its next timer.
    `store_id` names the store whose attempts these are (in the launchers' records)."""

    def __init__(
        self,
        node: NodeState,
        on_exit: Callable[[], None] = lambda: None,
        store_id: str = "",
        containment: Containment | None = None,
        watch: GpuWatch | None = None,
    ) -> None:
        self.node = node
        self.on_exit = on_exit
        self.store_id = store_id
        self.containment = containment
        self.watched: dict[Key, tuple[int, str]] = {}
        """Each live attempt's launcher: pid and start time (a pid alone may be reused)."""
        self.dirs: dict[Key, Path] = {}
        self.forks: ForkServer | None = None
        self.forking = threading.Lock()
        self.watch = watch
        """Real GPUs, read through NVML in a thread of its own; None for virtual ones."""
        self.stopped = threading.Event()
        self.watching = False
        """Whether the NVML thread runs: from the first poll, once the attempts of an earlier
        scheduler are adopted (a process of one not adopted yet is no leftover)."""

    def nodes(self) -> list[NodeState]:
        if self.watch is None:
            return [self.node]
        return [replace(self.node, dirty=tuple(sorted(self.watch.dirty.items())))]

    def start(self, launch: Launch) -> Started:
        key = (launch.job_id, launch.attempt)
        if len(launch.members) > 1 or any(m.node != self.node.node.name for m in launch.members):
            raise RuntimeError(f"the local executor runs on {self.node.node.name} alone, not on {launch.members}")
        member = launch.members[0] if launch.members else Member(0, self.node.node.name, ())
        folder = launch.attempt_dir
        env = launch.member_env(member, "127.0.0.1", free_port())
        mine = owner(self.store_id, *key)
        contain = None
        if self.containment is not None:
            contain = self.containment.request(*key, member, self.node.node.gpus, launch.resources)
        spec = Spawn(
            folder,
            mine,
            launch.user,
            launch.workdir,
            launch.command,
            env,
            launch.stdout,
            launch.stderr,
            contain,
            launch.tty,
        )
        pid = self._fork_server().spawn(spec, _untold, detach=True)
        started = process_started(pid) or ""
        self.watched[key] = (pid, started)
        self.dirs[key] = folder
        self._watch(pid)
        return Started({"executor": "local", "pid": pid, "started": started}, True, f"as pid {pid}")

    def _fork_server(self) -> ForkServer:
        """Launchers are forked from one fork server, detached: they outlive it and this
        scheduler, for the next one to adopt."""
        with self.forking:
            if self.forks is None:
                self.forks = ForkServer(on_lost=self._lost)
            return self.forks

    def _lost(self) -> None:
        with self.forking:
            self.forks = None  # its launchers run on; the next start makes another

    def _watch(self, pid: int) -> None:
        """Wake the control loop as soon as the launcher `pid` ends (a thread waits on its
        pidfd; the launcher is no child of ours)."""
        try:
            handle = os.pidfd_open(pid)
        except OSError:  # ended already
            self.on_exit()
            return
        threading.Thread(target=self._wait, args=(handle,), daemon=True, name=f"launcher-{pid}").start()

    def _wait(self, handle: int) -> None:
        try:
            select.select([handle], [], [])
        finally:
            os.close(handle)
        self.on_exit()

    def notify(self, job_id: int, attempt: int, deadline: float) -> None:
        key = (job_id, attempt)
        write_notice(self.dirs[key], deadline)
        self._signal(key, signal.SIGTERM)

    def kill(self, job_id: int, attempt: int) -> None:
        key = (job_id, attempt)
        kill(self.watched[key][0], self._contain(key), self.dirs.get(key))

    def _contain(self, key: Key) -> Request | None:
        """The attempt's cgroup (its one member's), where attempts are contained."""
        if self.containment is None:
            return None
        return Request(cgroup_path(self.containment.root, self.store_id, *key))

    def _signal(self, key: Key, sig: signal.Signals) -> None:
        signal_group(self.watched[key][0], sig)

    def _live(self) -> dict[Key, int]:
        return {key: pid for key, (pid, _) in list(self.watched.items())}

    def poll(self) -> Progress:
        if self.watch is not None and not self.watching:
            self.watching = True
            threading.Thread(target=self.watch.watch, args=(self._live, self.stopped), daemon=True, name="nvml").start()
        notes = self.watch.taken() if self.watch is not None else []
        worked = self.watch.worked() if self.watch is not None else set()
        ended = []
        for key, (pid, started) in list(self.watched.items()):
            if process_started(pid) == started:
                continue
            empty, usage = clear(self._contain(key))
            if not empty:
                # Its launcher is gone and its cgroup will not empty yet: still live, and no
                # pid of its (that one may be another process's by now) is signalled again.
                self.watched[key] = (0, "")
                continue
            del self.watched[key]
            ended.append(self._exit(key, None, cleared=usage))
        return Progress(ended=ended, notes=notes, worked=worked)

    def _exit(self, key: Key, code: int | None, ended_at: float | None = None, cleared: Usage | None = None) -> Exit:
        """How an attempt ended: its launcher's record (the command's status), else what the
        process returned; and, for a failure, what the launcher said went wrong. `cleared`:
        what its cgroup counted, where the executor cleared it (its launcher could not)."""
        mine = owner(self.store_id, *key)
        status, why, trouble = outcome(self.dirs[key], mine, code)
        usage = cleared or recorded_usage(self.dirs[key], mine)
        peak = self.watch.peak(key) if self.watch is not None else None
        if peak is not None:
            usage = replace(usage or Usage(), peak_gpu_memory=peak)
        if trouble is not None:
            return Exit(*key, None, trouble, started=False, ended_at=ended_at)
        return Exit(*key, status, why, ended_at=ended_at, usage=usage)

    def adopt(self, recorded: Recorded) -> Started | Exit:
        """The attempt's launcher, if it is still the process that was started (a pid alone
        may be reused, a pid with its start time may not); found by its folder on its command
        line when the scheduler died before recording it. If it ended unwatched, it ran until
        its exit record was written, or until its files were last written."""
        key = (recorded.job_id, recorded.attempt)
        if key in self.watched:  # adopted again after a halt: watched already
            watched = self.watched[key][0]
            return Started(recorded.handle or {"executor": "local", "pid": watched}, True, f"as pid {watched}")
        folder = self.dirs[key] = recorded.attempt_dir
        handle = recorded.handle or {}
        pid, started = handle.get("pid"), handle.get("started")
        if not (isinstance(pid, int) and isinstance(started, str)):
            found = recorded_launcher(folder, owner(self.store_id, *key))
            pid, started = found if found is not None else (None, None)
        if pid is not None and started and process_started(pid) == started:
            self.watched[key] = (pid, started)
            self._watch(pid)
            if recorded.notice_deadline is not None and not (folder / "notice").exists():
                self.notify(*key, recorded.notice_deadline)  # recorded, but the scheduler died before giving it
            return Started({"executor": "local", "pid": pid, "started": started}, True, f"as pid {pid}")
        empty, usage = clear(self._contain(key))
        if not empty:
            # Its launcher is gone, and what it left will not die yet: live until it has.
            self.watched[key] = (0, "")
            return Started({"executor": "local", "pid": 0, "started": ""}, True, "(ending)")
        ended = recorded_exit_time(folder) or last_sign_of_life(folder, recorded.logs, recorded.since)
        return self._exit(key, None, ended, cleared=usage)

    def close(self) -> None:
        """End the fork server; the launchers run on (the watcher threads end with them or
        with this process)."""
        self.stopped.set()
        with self.forking:
            forks, self.forks = self.forks, None
        if forks is not None:
            forks.close()

    def address(self, node: str) -> str:
        if node != self.node.node.name:
            raise OSError(f"the local executor has no node {node}")
        return "127.0.0.1"

    def terminal(self, job_id: int, attempt: int) -> Link:
        """A connection to the attempt's terminal, which its launcher serves on this machine."""
        return Link(owner(self.store_id, job_id, attempt))

    def logs(self, job_id: int, attempt: int, rank: int, stream: str, attempt_dir: Path) -> BinaryIO | None:
        if rank != 0:
            return None
        try:
            return (attempt_dir / f"{stream}.log").open("rb")
        except OSError:
            return None
