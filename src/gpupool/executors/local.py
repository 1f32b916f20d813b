"""Attempts as local processes: one process group per attempt, logs and notice in its folder."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from gpupool.executors import Exit, Handle, Launch
from gpupool.executors.proc import process_started, recorded_exit

Key = tuple[int, int]
LAUNCHER = Path(__file__).with_name("launch.sh")


class LocalExecutor:
    """`on_exit` is called (from a watcher thread) as soon as an attempt's process ends, so the
    control loop wakes at once instead of on its next timer."""

    def __init__(self, on_exit: Callable[[], None] = lambda: None) -> None:
        self.on_exit = on_exit
        self.children: dict[Key, subprocess.Popen[bytes]] = {}
        self.adopted: dict[Key, Handle] = {}
        self.dirs: dict[Key, Path] = {}

    def start(self, launch: Launch) -> Handle:
        key = (launch.job_id, launch.attempt)
        launch.attempt_dir.mkdir(parents=True, exist_ok=True)
        launcher = ["/bin/sh", str(LAUNCHER), str(launch.attempt_dir), *launch.command]
        stdout = launch.stdout or launch.attempt_dir / "stdout.log"
        stderr = launch.stderr or launch.attempt_dir / "stderr.log"
        for path in (stdout, stderr):
            path.parent.mkdir(parents=True, exist_ok=True)
        with stdout.open("ab") as out, stderr.open("ab") as err:
            child = subprocess.Popen(
                launcher,
                cwd=launch.workdir,
                env=dict(launch.env),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.children[key] = child
        self.dirs[key] = launch.attempt_dir
        threading.Thread(target=self._watch, args=(child,), daemon=True, name=f"attempt-{key}").start()
        return Handle(child.pid, process_started(child.pid) or "")

    def _watch(self, child: subprocess.Popen[bytes]) -> None:
        child.wait()
        self.on_exit()

    def notify(self, job_id: int, attempt: int, deadline: float) -> None:
        key = (job_id, attempt)
        notice = self.dirs[key] / "notice"
        notice.with_suffix(".tmp").write_text(json.dumps({"deadline": deadline}))
        os.replace(notice.with_suffix(".tmp"), notice)
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
                recorded = recorded_exit(self.dirs[key])
                ended.append(Exit(*key, recorded if recorded is not None else code))
        for key, handle in list(self.adopted.items()):
            if process_started(handle.pid) != handle.started:
                del self.adopted[key]
                ended.append(Exit(*key, recorded_exit(self.dirs[key])))
        return ended

    def adopt(self, job_id: int, attempt: int, handle: Handle, attempt_dir: Path) -> bool:
        key = (job_id, attempt)
        self.dirs[key] = attempt_dir
        if handle.started and process_started(handle.pid) == handle.started:
            self.adopted[key] = handle
            return True
        return False
