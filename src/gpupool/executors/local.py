"""Attempts as local processes: one process group per attempt, under a launcher that records
its outcome (`launcher.py`); logs and the notice in the attempt's folder. The machine is one
node (`gpus.py`); a gang of one member runs here, with the rendezvous on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from gpupool.executors import Exit, Key, Launch, Member, NodeState, Progress, Recorded, Started
from gpupool.executors.proc import (
    last_sign_of_life,
    launch_error,
    not_started,
    owner,
    process_started,
    recorded_exit,
    recorded_exit_time,
    recorded_launcher,
)
from gpupool.executors.users import give

LAUNCHER = Path(__file__).with_name("launcher.py")
LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
"""The launcher's own environment: nothing of the job's reaches a process of the scheduler's."""


def free_port() -> int:
    """A TCP port free on loopback now, for a gang's rendezvous (`MASTER_PORT`)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalExecutor:
    """`node` is this machine. `on_exit` is called (from a watcher thread) as soon as an
    attempt's process ends, so the control loop wakes at once instead of on its next timer.
    `store_id` names the store whose attempts these are (in the launchers' records)."""

    def __init__(self, node: NodeState, on_exit: Callable[[], None] = lambda: None, store_id: str = "") -> None:
        self.node = node
        self.on_exit = on_exit
        self.store_id = store_id
        self.children: dict[Key, subprocess.Popen[bytes]] = {}
        self.adopted: dict[Key, tuple[int, str]] = {}
        self.dirs: dict[Key, Path] = {}

    def nodes(self) -> list[NodeState]:
        return [self.node]

    def start(self, launch: Launch) -> Started:
        key = (launch.job_id, launch.attempt)
        if len(launch.members) > 1 or any(m.node != self.node.node.name for m in launch.members):
            raise RuntimeError(f"the local executor runs on {self.node.node.name} alone, not on {launch.members}")
        member = launch.members[0] if launch.members else Member(0, self.node.node.name, ())
        folder = launch.attempt_dir
        folder.mkdir(parents=True, exist_ok=True)
        # The job may read its notice and its records, never write them; nobody else may list.
        give(folder, None, 0o711 if launch.user is not None else 0o700)
        stdout = launch.stdout or folder / "stdout.log"
        stderr = launch.stderr or folder / "stderr.log"
        for path in (folder / "stdout.log", folder / "stderr.log"):
            if path in (stdout, stderr):
                # Made here, in a folder only the scheduler writes, then given to the job's user:
                # the job opens it to append and can never swap it for a link.
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600))
                give(path, launch.user, 0o600)
        argv = [
            sys.executable,
            "-I",
            "-S",
            str(LAUNCHER),
            str(folder),
            owner(self.store_id, *key),
            launch.user.name if launch.user is not None else "-",
            str(launch.workdir),
            str(stdout),
            str(stderr),
            *launch.command,
        ]
        log = os.open(folder / "launcher.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            child = subprocess.Popen(
                argv,
                cwd=folder,
                env=LAUNCHER_ENV,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            os.close(log)
        assert child.stdin is not None
        with child.stdin:
            child.stdin.write(json.dumps(launch.member_env(member, "127.0.0.1", free_port())).encode())
        self.children[key] = child
        self.dirs[key] = folder
        threading.Thread(target=self._watch, args=(child,), daemon=True, name=f"attempt-{key}").start()
        return Started({"pid": child.pid, "started": process_started(child.pid) or ""}, True, f"as pid {child.pid}")

    def _watch(self, child: subprocess.Popen[bytes]) -> None:
        child.wait()
        self.on_exit()

    def notify(self, job_id: int, attempt: int, deadline: float) -> None:
        key = (job_id, attempt)
        notice = self.dirs[key] / "notice"
        partial = notice.with_suffix(".tmp")
        partial.write_text(json.dumps({"deadline": deadline}))
        partial.chmod(0o644)  # the job reads it; the scheduler's umask keeps the rest private
        os.replace(partial, notice)
        self._signal(key, signal.SIGTERM)

    def kill(self, job_id: int, attempt: int) -> None:
        self._signal((job_id, attempt), signal.SIGKILL)

    def _signal(self, key: Key, sig: signal.Signals) -> None:
        pid = self.children[key].pid if key in self.children else self.adopted[key][0]
        with contextlib.suppress(ProcessLookupError):  # already gone: poll reports its exit
            os.killpg(pid, sig)

    def poll(self) -> Progress:
        ended = []
        for key, child in list(self.children.items()):
            code = child.poll()
            if code is not None:
                del self.children[key]
                ended.append(self._exit(key, code))
        for key, (pid, started) in list(self.adopted.items()):
            if process_started(pid) != started:
                del self.adopted[key]
                ended.append(self._exit(key, None))
        return Progress(ended=ended)

    def _exit(self, key: Key, code: int | None, ended_at: float | None = None) -> Exit:
        """How an attempt ended: its launcher's record (the command's status), else what the
        process returned; and, for a failure, what the launcher said went wrong."""
        folder = self.dirs[key]
        mine = owner(self.store_id, *key)
        trouble = not_started(folder, mine)
        if trouble is not None:
            return Exit(*key, None, trouble, started=False, ended_at=ended_at)
        recorded = recorded_exit(folder, mine)
        status = recorded if recorded is not None else code
        return Exit(*key, status, launch_error(folder) if status not in (0, None) else None, ended_at=ended_at)

    def adopt(self, recorded: Recorded) -> Started | Exit:
        """The attempt's launcher, if it is still the process that was started (a pid alone
        may be reused, a pid with its start time may not); found by its folder on its command
        line when the scheduler died before recording it. If it ended unwatched, it ran until
        its exit record was written, or until its files were last written."""
        key = (recorded.job_id, recorded.attempt)
        folder = self.dirs[key] = recorded.attempt_dir
        handle = recorded.handle or {}
        pid, started = handle.get("pid"), handle.get("started")
        if not (isinstance(pid, int) and isinstance(started, str)):
            found = recorded_launcher(folder, owner(self.store_id, *key))
            pid, started = found if found is not None else (None, None)
        if pid is not None and started and process_started(pid) == started:
            self.adopted[key] = (pid, started)
            if recorded.notice_deadline is not None and not (folder / "notice").exists():
                self.notify(*key, recorded.notice_deadline)  # recorded, but the scheduler died before giving it
            return Started({"pid": pid, "started": started}, True, f"as pid {pid}")
        ended = recorded_exit_time(folder) or last_sign_of_life(folder, recorded.logs, recorded.since)
        return self._exit(key, None, ended)

    def logs(self, job_id: int, attempt: int, rank: int, stream: str, attempt_dir: Path) -> BinaryIO | None:
        if rank != 0:
            return None
        try:
            return (attempt_dir / f"{stream}.log").open("rb")
        except OSError:
            return None
