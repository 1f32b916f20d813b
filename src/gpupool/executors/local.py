"""Attempts as local processes: one process group per attempt, under a launcher that records
its outcome (`launcher.py`); logs and the notice in the attempt's folder."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from gpupool.executors import Exit, Handle, Launch
from gpupool.executors.proc import launch_error, not_started, owner, process_started, recorded_exit
from gpupool.executors.users import give

Key = tuple[int, int]
LAUNCHER = Path(__file__).with_name("launcher.py")
LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
"""The launcher's own environment: nothing of the job's reaches a process of the scheduler's."""


class LocalExecutor:
    """`on_exit` is called (from a watcher thread) as soon as an attempt's process ends, so the
    control loop wakes at once instead of on its next timer. `store_id` names the store whose
    attempts these are (in the launchers' records)."""

    def __init__(self, on_exit: Callable[[], None] = lambda: None, store_id: str = "") -> None:
        self.on_exit = on_exit
        self.store_id = store_id
        self.children: dict[Key, subprocess.Popen[bytes]] = {}
        self.adopted: dict[Key, Handle] = {}
        self.dirs: dict[Key, Path] = {}

    def start(self, launch: Launch) -> Handle:
        key = (launch.job_id, launch.attempt)
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
            child.stdin.write(json.dumps(dict(launch.env)).encode())
        self.children[key] = child
        self.dirs[key] = folder
        threading.Thread(target=self._watch, args=(child,), daemon=True, name=f"attempt-{key}").start()
        return Handle(child.pid, process_started(child.pid) or "")

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
        pid = self.children[key].pid if key in self.children else self.adopted[key].pid
        with contextlib.suppress(ProcessLookupError):  # already gone: poll reports its exit
            os.killpg(pid, sig)

    def poll(self) -> list[Exit]:
        ended = []
        for key, child in list(self.children.items()):
            code = child.poll()
            if code is not None:
                del self.children[key]
                ended.append(self._exit(key, code))
        for key, handle in list(self.adopted.items()):
            if process_started(handle.pid) != handle.started:
                del self.adopted[key]
                ended.append(self._exit(key, None))
        return ended

    def _exit(self, key: Key, code: int | None) -> Exit:
        """How an attempt ended: its launcher's record (the command's status), else what the
        process returned; and, for a failure, what the launcher said went wrong."""
        folder = self.dirs[key]
        mine = owner(self.store_id, *key)
        trouble = not_started(folder, mine)
        if trouble is not None:
            return Exit(*key, None, trouble, started=False)
        recorded = recorded_exit(folder, mine)
        status = recorded if recorded is not None else code
        return Exit(*key, status, launch_error(folder) if status not in (0, None) else None)

    def adopt(self, job_id: int, attempt: int, handle: Handle, attempt_dir: Path) -> bool:
        key = (job_id, attempt)
        self.dirs[key] = attempt_dir
        if handle.started and process_started(handle.pid) == handle.started:
            self.adopted[key] = handle
            return True
        return False
